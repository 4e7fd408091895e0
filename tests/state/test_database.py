"""Opening, identity, permissions, read-only mode and transactions on real database files."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from piwf.clock import FakeClock
from piwf.errors import (
    IncompatibleStateError,
    InvalidTransitionError,
    ReadOnlyStateError,
    StateBusyError,
    UnsafeStateHomeError,
)
from piwf.state import StateDatabase
from piwf.state.database import JOURNAL_SIZE_LIMIT_BYTES
from piwf.state.schema import APPLICATION_ID, SCHEMA_DIGEST
from tests.server.harness import NOBODY_UID, as_uid


def sidecars(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name + "-"))


@contextmanager
def umask(value: int) -> Iterator[None]:
    previous = os.umask(value)
    try:
        yield
    finally:
        os.umask(previous)


def make_valid(path: Path) -> None:
    StateDatabase(path).close()
    assert sidecars(path) == [], "closing the last connection removes -wal and -shm"


def raw_edit(path: Path, *statements: str) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            connection.execute(statement)
    finally:
        connection.close()


# conformance: S1
def test_writer_connection_has_the_required_pragmas_and_identity(db: StateDatabase) -> None:
    assert db.pragma("foreign_keys") == 1
    assert db.pragma("journal_mode") == "wal"
    assert db.pragma("synchronous") == 2  # FULL
    assert db.pragma("busy_timeout") == 5000
    assert db.pragma("wal_autocheckpoint") == 1000
    assert db.pragma("journal_size_limit") == JOURNAL_SIZE_LIMIT_BYTES
    assert db.pragma("temp_store") == 2  # MEMORY
    assert db.pragma("application_id") == APPLICATION_ID
    assert db.pragma("user_version") == 1
    with db.read() as tx:
        meta = tx.one("SELECT schema_name, schema_version, schema_digest FROM schema_meta")
    assert meta is not None
    assert tuple(meta) == ("piwf-state", 1, SCHEMA_DIGEST)


def open_temporary_files() -> list[str]:
    """The files SQLite made for this process in a temporary directory (unlinked, still open)."""
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(str(fd.readlink()))
        except OSError:  # closed since the listing
            continue
    return [target for target in targets if "etilqs_" in target]


def test_a_savepoints_undo_pages_stay_in_memory(db: StateDatabase) -> None:
    """A savepoint over more than 64 KiB of existing pages opens no temporary file."""
    assert db.pragma("temp_store") == 2  # MEMORY
    with db.write() as tx:
        tx.execute("CREATE TABLE scratch (k INTEGER PRIMARY KEY, v BLOB NOT NULL) STRICT")
        for key in range(100):
            tx.execute("INSERT INTO scratch VALUES (?, zeroblob(3000))", (key,))
    with db.write() as tx, tx.savepoint() as step:
        step.execute("UPDATE scratch SET v = zeroblob(3001)")
        with step.savepoint() as inner:
            inner.execute("UPDATE scratch SET v = zeroblob(3002)")
            assert open_temporary_files() == []
    with db.read() as tx:
        assert tx.scalar("SELECT sum(length(v)) FROM scratch") == 100 * 3002


# conformance: S1
def test_every_reopened_writer_gets_the_pragmas_again(home: Path) -> None:
    path = home / "state.sqlite"
    make_valid(path)
    first = StateDatabase(path)
    second = StateDatabase(path)
    try:
        for database in (first, second):
            assert database.pragma("foreign_keys") == 1
            assert database.pragma("synchronous") == 2
            assert database.pragma("journal_mode") == "wal"
            assert database.pragma("temp_store") == 2
    finally:
        first.close()
        second.close()


# conformance: S1
def test_every_table_is_strict(db: StateDatabase) -> None:
    rows = db.connection.execute("PRAGMA table_list").fetchall()
    tables = {row["name"]: row["strict"] for row in rows if not row["name"].startswith("sqlite_")}
    assert "runs" in tables and "effects" in tables and "leases" in tables
    assert {name for name, strict in tables.items() if not strict} == set()


def test_default_location_is_piwf_home(home: Path) -> None:
    database = StateDatabase()
    try:
        assert database.path == home / "state.sqlite"
        assert database.path.exists()
    finally:
        database.close()


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_permissions_are_private_under_any_umask(tmp_path: Path, mask: int) -> None:
    home = tmp_path / "home"
    with umask(mask):
        database = StateDatabase(home / "state.sqlite")
        try:
            with database.write() as tx:
                tx.execute("INSERT INTO projects VALUES ('p', '/p', 1)")
            modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in home.iterdir()}
        finally:
            database.close()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert modes["state.sqlite"] == 0o600
    assert modes["state.sqlite-wal"] == 0o600
    assert modes["state.sqlite-shm"] == 0o600


def test_an_open_state_home_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    with pytest.raises(UnsafeStateHomeError, match="chmod 700"):
        StateDatabase(home / "state.sqlite")
    assert list(home.iterdir()) == []


def test_a_symlinked_state_home_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UnsafeStateHomeError, match="symlink"):
        StateDatabase(link / "state.sqlite")
    assert list(real.iterdir()) == []


def test_a_state_home_that_is_a_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_bytes(b"a file in the way")
    with pytest.raises(UnsafeStateHomeError, match="not a directory") as refused:
        StateDatabase(home / "state.sqlite")
    assert "set PIWF_HOME to another directory" in str(refused.value)
    assert home.read_bytes() == b"a file in the way"


def test_a_symlinked_database_is_refused_and_its_target_untouched(home: Path) -> None:
    target = home.parent / "elsewhere.sqlite"
    make_valid(target.parent / "x" / "state.sqlite")
    target.write_bytes(b"not a database")
    home.mkdir(mode=0o700)
    (home / "state.sqlite").symlink_to(target)
    with pytest.raises(UnsafeStateHomeError, match="symlink"):
        StateDatabase(home / "state.sqlite")
    assert target.read_bytes() == b"not a database"


def test_a_hard_linked_database_is_refused(home: Path) -> None:
    path = home / "state.sqlite"
    make_valid(path)
    os.link(path, home / "other-name.sqlite")
    with pytest.raises(UnsafeStateHomeError, match="hard links"):
        StateDatabase(path)


def _foreign_app_id(path: Path) -> None:
    raw_edit(path, "PRAGMA application_id = 1234")


def _other_user_version(path: Path) -> None:
    raw_edit(path, "PRAGMA user_version = 2")


def _changed_digest(path: Path) -> None:
    raw_edit(path, "UPDATE schema_meta SET schema_digest = zeroblob(32)")


def _changed_shape(path: Path) -> None:
    raw_edit(path, "CREATE INDEX extra_idx ON runs(title)")


def _missing_meta(path: Path) -> None:
    raw_edit(path, "DROP TABLE schema_meta")


def _meta_without_row(path: Path) -> None:
    raw_edit(path, "DELETE FROM schema_meta")


def _another_apps_database(path: Path) -> None:
    path.unlink()
    raw_edit(path, "CREATE TABLE notes (body TEXT)", "INSERT INTO notes VALUES ('x')")
    path.chmod(0o600)


def _another_apps_wal_database(path: Path) -> None:
    path.unlink()
    raw_edit(path, "PRAGMA journal_mode = WAL", "CREATE TABLE notes (body TEXT)")
    path.chmod(0o600)


def _not_sqlite(path: Path) -> None:
    path.write_bytes(b"these bytes are not an SQLite database" * 100)


INCOMPATIBLE: dict[str, Callable[[Path], None]] = {
    "foreign application id": _foreign_app_id,
    "other user_version": _other_user_version,
    "changed digest": _changed_digest,
    "changed shape": _changed_shape,
    "missing schema_meta": _missing_meta,
    "schema_meta without its row": _meta_without_row,
    "another application's file": _another_apps_database,
    "another application's WAL file": _another_apps_wal_database,
    "not an SQLite file": _not_sqlite,
}


# conformance: S2
@pytest.mark.parametrize("mode", ["read-write", "read-only"])
@pytest.mark.parametrize("case", sorted(INCOMPATIBLE))
def test_an_incompatible_file_is_refused_untouched(home: Path, case: str, mode: str) -> None:
    path = home / "state.sqlite"
    make_valid(path)
    INCOMPATIBLE[case](path)
    assert sidecars(path) == []
    before = path.read_bytes()
    before_stat = path.stat()
    with pytest.raises(IncompatibleStateError) as raised:
        StateDatabase(path, mode=mode)  # type: ignore[arg-type]
    message = str(raised.value)
    assert "Back up and move state.sqlite together with its -wal and -shm files" in message
    assert "was not changed" in message
    assert path.read_bytes() == before
    assert path.stat().st_mtime_ns == before_stat.st_mtime_ns
    assert sidecars(path) == []


def test_leftover_wal_without_database_is_refused(home: Path) -> None:
    home.mkdir(mode=0o700)
    (home / "state.sqlite-wal").write_bytes(b"x")
    with pytest.raises(IncompatibleStateError, match="exists without state.sqlite"):
        StateDatabase(home / "state.sqlite")
    assert not (home / "state.sqlite").exists()


# conformance: S3
def test_read_only_mode_refuses_writes(home: Path) -> None:
    path = home / "state.sqlite"
    make_valid(path)
    reader = StateDatabase(path, mode="read-only")
    try:
        assert reader.pragma("query_only") == 1
        with pytest.raises(ReadOnlyStateError):
            with reader.write():
                pass
        with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
            reader.connection.execute("INSERT INTO projects VALUES ('p', '/p', 1)")
        with reader.read() as tx:
            assert tx.scalar("SELECT count(*) FROM projects") == 0
    finally:
        reader.close()
    assert sidecars(path) == [], "reading an inactive file creates no -wal or -shm"


# conformance: S3
def test_read_only_mode_sees_a_live_writers_commits(db: StateDatabase) -> None:
    with db.write() as tx:
        tx.execute("INSERT INTO projects VALUES ('p', '/p', 1)")
    reader = StateDatabase(db.path, mode="read-only")
    try:
        with reader.read() as tx:
            assert tx.scalar("SELECT count(*) FROM projects") == 1
    finally:
        reader.close()


def test_read_only_open_of_a_missing_file_creates_nothing(home: Path) -> None:
    home.mkdir(mode=0o700)
    with pytest.raises(IncompatibleStateError, match="does not exist"):
        StateDatabase(home / "state.sqlite", mode="read-only")
    assert list(home.iterdir()) == []


def test_write_takes_the_write_lock_at_begin(db: StateDatabase) -> None:
    other = sqlite3.connect(db.path, isolation_level=None, timeout=0)
    try:
        with db.write():
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_nested_writes_join_the_outer_transaction(db: StateDatabase) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with db.write() as outer:
            with db.write() as inner:
                assert inner is outer
                inner.execute("INSERT INTO projects VALUES ('p', '/p', 1)")
            raise RuntimeError("boom")
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM projects") == 0
    with db.write() as outer:
        with db.write() as inner:
            inner.execute("INSERT INTO projects VALUES ('p', '/p', 1)")
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM projects") == 1


def test_a_write_cannot_join_a_read_snapshot(db: StateDatabase) -> None:
    with db.read(), pytest.raises(InvalidTransitionError):
        with db.write():
            pass
    with db.write() as tx:  # the failed attempt left no transaction open
        tx.execute("INSERT INTO projects VALUES ('p', '/p', 1)")


def test_transaction_time_comes_from_the_injected_clock(
    db: StateDatabase, clock: FakeClock
) -> None:
    with db.write() as tx:
        assert tx.now == clock.now_ms()
    clock.advance(1234)
    with db.read() as tx:
        assert tx.now == clock.now_ms()


def test_a_busy_database_raises_a_typed_error(db: StateDatabase) -> None:
    db.connection.execute("PRAGMA busy_timeout = 50")
    other = sqlite3.connect(db.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StateBusyError):
            with db.write():
                pass
        other.execute("ROLLBACK")
    finally:
        other.close()
    with db.write() as tx:
        tx.execute("INSERT INTO projects VALUES ('p', '/p', 1)")


def test_integrity_problems_is_empty_for_a_fresh_database(db: StateDatabase) -> None:
    assert db.integrity_problems() == []


@pytest.mark.parametrize("read_only", ["home", "state.sqlite"])
def test_a_writer_as_nobody_refuses_what_it_cannot_write_and_creates_nothing(
    read_only: str,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to another uid (CI runs as root)")
    root = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    home = root / "h"
    try:
        root.chmod(0o755)
        home.mkdir(mode=0o700)
        StateDatabase(home / "state.sqlite").close()
        for path in (home, *home.iterdir()):
            os.chown(path, NOBODY_UID, NOBODY_UID)
        (home if read_only == "home" else home / "state.sqlite").chmod(0o500)
        before = sorted(p.name for p in home.iterdir())

        def open_writer() -> str:
            StateDatabase(home / "state.sqlite").close()
            return "opened"

        outcome = as_uid(NOBODY_UID, open_writer)
        named = home if read_only == "home" else home / "state.sqlite"
        assert outcome.startswith("error: StateIoError: "), outcome
        assert f"{named} is not writable by this user (uid {NOBODY_UID})" in outcome
        assert sorted(p.name for p in home.iterdir()) == before, "no -wal or -shm appeared"
    finally:
        shutil.rmtree(root, ignore_errors=True)
