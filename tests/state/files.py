"""Real state files for the verify, restore and -wal tests: databases with data, crashed writers
that leave a real WAL, damaged copies, and a byte-for-byte snapshot of a directory.

Nothing here imitates SQLite: every file is written by piwf's own ``StateDatabase`` (or by
plain SQLite for "another application"), every WAL by a real process killed with SIGKILL
before it could checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

from piwf.state import StateDatabase
from piwf.state.blobs import put_text

REPO = Path(__file__).resolve().parents[2]

#: A writer that commits ``rows`` projects in WAL mode, then dies before any checkpoint.
_CRASHED_PIWF_WRITER = """
import os, signal, sys
from pathlib import Path
from piwf.state import StateDatabase
db = StateDatabase(Path(sys.argv[1]))
db.connection.execute("PRAGMA wal_autocheckpoint = 0")
for number in range(int(sys.argv[2])):
    with db.write() as tx:
        tx.execute("INSERT INTO projects VALUES (?, ?, 1)", (f"crash-{number}", f"/c/{number}"))
os.kill(os.getpid(), signal.SIGKILL)
"""

#: The same for a database of another application (plain SQLite, its own header values).
_CRASHED_FOREIGN_WRITER = """
import os, signal, sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute(f"PRAGMA page_size = {int(sys.argv[2])}")
connection.execute("PRAGMA journal_mode = WAL")
connection.execute("PRAGMA wal_autocheckpoint = 0")
connection.execute("PRAGMA user_version = 7")
connection.execute("CREATE TABLE notes (body TEXT)")
connection.execute("INSERT INTO notes VALUES ('other application')")
os.kill(os.getpid(), signal.SIGKILL)
"""


def make_database(path: Path, blobs: int = 0, projects: int = 1) -> None:
    """A piwf database with ``projects`` project rows and ``blobs`` 1 KiB text blobs, closed
    cleanly (no -wal or -shm beside it)."""
    with StateDatabase(path) as database, database.write() as tx:
        for number in range(projects):
            tx.execute("INSERT INTO projects VALUES (?, ?, 1)", (f"p-{number}", f"/p/{number}"))
        for number in range(blobs):
            put_text(tx, f"{number:06d}" + "x" * 1018)


def project_ids(path: Path) -> list[str]:
    with StateDatabase(path, mode="read-only") as database, database.read() as tx:
        return [row[0] for row in tx.all("SELECT project_id FROM projects ORDER BY 1")]


def crash_piwf_writer(path: Path, rows: int) -> None:
    """Commit ``rows`` projects to ``path`` from a child that is then SIGKILLed; its WAL stays."""
    _run_and_expect_kill(_CRASHED_PIWF_WRITER, str(path), str(rows))
    assert wal_of(path).stat().st_size > 0


def crash_foreign_writer(path: Path, page_size: int = 4096) -> None:
    """Leave a committed WAL of another application's database at ``path``."""
    _run_and_expect_kill(_CRASHED_FOREIGN_WRITER, str(path), str(page_size))
    assert wal_of(path).stat().st_size > 0


def _run_and_expect_kill(script: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == -9, done.stderr.decode(errors="replace")


def wal_of(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def snapshot(directory: Path) -> dict[str, tuple[str, int, int]]:
    """Every file under ``directory``: (SHA-256 of its bytes, mtime in ns, mode)."""
    found = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(directory))] = (digest, info.st_mtime_ns, info.st_mode)
    return found


def private_copy(source: Path, destination: Path) -> Path:
    shutil.copyfile(source, destination)
    destination.chmod(0o600)
    return destination


def table_leaf_page(path: Path, table: str) -> tuple[int, int]:
    """Return (page number, page size) of a leaf page of ``table`` (which spans pages)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        root = connection.execute(
            "SELECT rootpage FROM sqlite_schema WHERE name = ?", (table,)
        ).fetchone()[0]
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    finally:
        connection.close()
    data = path.read_bytes()
    page = data[(root - 1) * page_size : root * page_size]
    assert page[0] == 0x05, f"{table} must span pages (its root is an interior page)"
    first_cell = struct.unpack_from(">H", page, 12)[0]
    leaf = struct.unpack_from(">I", page, first_cell)[0]
    assert data[(leaf - 1) * page_size] == 0x0D, "the child is a table leaf"
    return leaf, page_size


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(data)
