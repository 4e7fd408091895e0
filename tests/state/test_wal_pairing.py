"""A -wal beside the database that provably belongs to another database is refused before
SQLite reads it; the files stay byte-for-byte as they were and nothing is created.

Every WAL here is real: a child process commits in WAL mode and is SIGKILLed before any
checkpoint, as a crashed server leaves it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from piwf.errors import IncompatibleStateError, UnsafeStateHomeError
from piwf.state import StateDatabase
from piwf.state.backup import backup_database
from piwf.state.database import Mode
from piwf.state.wal import ForeignWalError, read_wal
from tests.state.files import (
    crash_foreign_writer,
    crash_piwf_writer,
    make_database,
    overwrite,
    private_copy,
    project_ids,
    snapshot,
    wal_of,
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    return path


def crashed_database(home: Path, rows: int = 20) -> Path:
    """``home/state.sqlite`` with one clean project and ``rows`` more only in its crash WAL."""
    database = home / "state.sqlite"
    make_database(database)
    crash_piwf_writer(database, rows)
    return database


def assert_refused_untouched(database: Path, mode: Mode, reason: str) -> None:
    before = snapshot(database.parent)
    with pytest.raises(ForeignWalError, match=reason) as refused:
        StateDatabase(database, mode=mode)
    assert isinstance(refused.value, IncompatibleStateError)
    assert refused.value.code == "foreignWal"
    assert "Nothing was changed" in str(refused.value)
    assert "piwf state restore" in str(refused.value)
    assert snapshot(database.parent) == before, "the refusal changed or created a file"


def test_a_crashed_databases_own_wal_is_kept_and_replayed(home: Path) -> None:
    database = crashed_database(home, rows=20)
    summary = read_wal(wal_of(database))
    assert summary is not None and summary.committed_frames >= 20
    assert len(project_ids(database)) == 21, "the crash WAL's commits are part of the database"


@pytest.mark.parametrize("mode", ["read-write", "read-only"])
def test_an_older_backup_copied_over_a_crashed_database_is_refused(
    home: Path, tmp_path: Path, mode: Mode
) -> None:
    # The defect: "restore" by copying a backup over state.sqlite while the crashed server's
    # WAL stays beside it. SQLite would replay the newer WAL over the older backup's pages.
    database = home / "state.sqlite"
    make_database(database)
    backup = tmp_path / "backup.sqlite"
    with StateDatabase(database) as live:
        backup_database(live, backup)
    crash_piwf_writer(database, rows=20)
    private_copy(backup, database)
    assert_refused_untouched(database, mode, "records a rollback journal")


def test_the_wal_of_another_piwf_database_beside_a_backup_is_refused(
    home: Path, tmp_path: Path
) -> None:
    other_home = tmp_path / "other"
    other_home.mkdir(mode=0o700)
    other = crashed_database(other_home, rows=5)
    database = home / "state.sqlite"
    make_database(tmp_path / "source.sqlite", projects=2)
    with StateDatabase(tmp_path / "source.sqlite") as source:
        backup_database(source, database)
    private_copy(wal_of(other), wal_of(database))
    assert_refused_untouched(database, "read-write", "records a rollback journal")


def test_a_wal_of_another_page_size_is_refused(home: Path, tmp_path: Path) -> None:
    database = home / "state.sqlite"
    make_database(database)
    StateDatabase(database).close()  # a WAL-mode file, as a live database's is
    other = tmp_path / "other.db"
    crash_foreign_writer(other, page_size=8192)
    private_copy(wal_of(other), wal_of(database))
    assert_refused_untouched(database, "read-write", "page size is 8192")


def test_a_wal_of_another_application_is_refused(home: Path, tmp_path: Path) -> None:
    database = home / "state.sqlite"
    make_database(database)
    other = tmp_path / "other.db"
    crash_foreign_writer(other, page_size=4096)
    private_copy(wal_of(other), wal_of(database))
    assert_refused_untouched(database, "read-write", "copy of page 1 records another")


def test_an_empty_database_beside_a_committed_wal_is_refused(home: Path) -> None:
    # SQLite would delete this WAL (a 0-byte database has no pages) and piwf would then
    # create a new database over the committed state.
    database = crashed_database(home)
    database.write_bytes(b"")
    assert_refused_untouched(database, "read-write", "the database file is empty")
    assert wal_of(database).stat().st_size > 0


def test_a_wal_without_a_committed_frame_is_left_to_sqlite(home: Path, tmp_path: Path) -> None:
    # A broken checksum in the first frame: SQLite's recovery applies nothing from this WAL,
    # so it cannot mix anything in, and piwf does not refuse it.
    database = home / "state.sqlite"
    make_database(database, projects=3)
    backup = tmp_path / "backup.sqlite"
    with StateDatabase(database) as live:
        backup_database(live, backup)
    crash_piwf_writer(database, rows=5)
    overwrite(wal_of(database), 32 + 24 + 100, b"\xff" * 8)  # inside frame 1's page
    summary = read_wal(wal_of(database))
    assert summary is not None and summary.committed_frames == 0
    private_copy(backup, database)
    assert project_ids(database) == ["p-0", "p-1", "p-2"]


def test_a_foreign_page_one_past_a_broken_checksum_is_neither_applied_nor_refused(
    home: Path,
) -> None:
    # SQLite applies frames up to the first broken checksum. A copy of page 1 from another
    # application after it (salts matching, committing) is never applied, so it proves
    # nothing: the database opens with everything its valid frames committed.
    database = crashed_database(home, rows=20)
    wal = wal_of(database)
    before = read_wal(wal)
    assert before is not None and before.committed_frames >= 20
    page_size = before.page_size
    page_one = bytearray(database.read_bytes()[:page_size])
    page_one[68:72] = (0x0BADF00D).to_bytes(4, "big")  # another application_id
    data = wal.read_bytes()
    frames = (len(data) - 32) // (24 + page_size)
    bad_checksum = b"\x00" * 8
    frame = struct.pack(">II", 1, 1000) + data[16:24] + bad_checksum + bytes(page_one)
    overwrite(wal, 32 + frames * (24 + page_size), frame)
    after = read_wal(wal)
    assert after is not None and after.committed_frames == before.committed_frames
    assert len(project_ids(database)) == 21


def test_a_wal_that_is_a_symlink_is_refused(home: Path, tmp_path: Path) -> None:
    database = home / "state.sqlite"
    make_database(database)
    target = tmp_path / "elsewhere-wal"
    target.write_bytes(b"")
    wal_of(database).symlink_to(target)
    with pytest.raises(UnsafeStateHomeError, match="not a regular file"):
        StateDatabase(database)


@pytest.mark.parametrize(
    "damage",
    [
        lambda wal: overwrite(wal, 0, b"\x00\x00\x00\x00"),  # magic
        lambda wal: overwrite(wal, 24, b"\x00\x00\x00\x00"),  # header checksum
        lambda wal: wal.write_bytes(wal.read_bytes()[:20]),  # shorter than a header
    ],
    ids=["magic", "checksum", "short"],
)
def test_a_wal_with_an_invalid_header_is_not_read(
    home: Path, damage: Callable[[Path], None]
) -> None:
    database = crashed_database(home, rows=3)
    damage(wal_of(database))
    assert read_wal(wal_of(database)) is None
