"""Failures of the file itself, on real SQLite files: typed, rolled back, usable afterwards.

A full database is made with ``PRAGMA max_page_count`` (SQLite's own SQLITE_FULL, as the
testing notes measured), a damaged one by overwriting a table's b-tree page in a copy.
"""

from __future__ import annotations

import errno
import os
import secrets
import sqlite3
from pathlib import Path

import pytest

from piwf.clock import FakeClock
from piwf.errors import (
    BackupError,
    StateBusyError,
    StateCorruptError,
    StateFullError,
    StateIoError,
    StateUnavailableError,
)
from piwf.state import StateDatabase, blobs, open_check
from piwf.state.backup import check_destination
from piwf.state.enums import MediaType
from piwf.state.failures import state_error_of, state_error_of_sqlite

MIB = 1 << 20


def cap_at_current_size(db: StateDatabase) -> None:
    """Let the file grow by no page at all: the next write that needs one is SQLITE_FULL."""
    pages = db.pragma("page_count")
    db.connection.execute(f"PRAGMA max_page_count = {pages}")


def noise(length: int) -> str:
    """Text that does not compress or repeat (each blob a new digest)."""
    return secrets.token_hex(length // 2)


def blob_count(db: StateDatabase) -> int:
    with db.read() as tx:
        return int(tx.scalar("SELECT count(*) FROM blobs"))


def test_a_full_database_is_a_typed_error_and_the_connection_stays_usable(
    db: StateDatabase,
) -> None:
    before = blob_count(db)
    cap_at_current_size(db)
    with pytest.raises(StateFullError, match="the disk is full") as full, db.write() as tx:
        blobs.put_text(tx, noise(2 * MIB))
    assert isinstance(full.value, StateUnavailableError)
    assert full.value.__cause__ is None and full.value.__suppress_context__
    assert not db.connection.in_transaction, "rolled back"
    assert blob_count(db) == before, "nothing was committed"
    db.connection.execute("PRAGMA max_page_count = 1073741823")  # space is back
    with db.write() as tx:
        blobs.put_text(tx, noise(2 * MIB))
    assert blob_count(db) == before + 1, "the same connection writes again"


def test_a_failure_inside_a_savepoint_ends_the_transaction_without_masking_it(
    db: StateDatabase,
) -> None:
    cap_at_current_size(db)
    with pytest.raises(StateFullError), db.write() as tx, tx.savepoint() as step:
        blobs.put_text(step, noise(2 * MIB))
    assert not db.connection.in_transaction


def test_sqlite_errors_raised_by_the_body_are_typed_at_the_transaction_boundary(
    db: StateDatabase,
) -> None:
    # What the fault points raise: SQLite's own messages without a result code.
    with pytest.raises(StateIoError, match="SQLITE_IOERR"), db.write():
        raise sqlite3.OperationalError("disk I/O error")
    with pytest.raises(StateBusyError), db.write():
        raise sqlite3.OperationalError("database is locked")
    with pytest.raises(sqlite3.IntegrityError), db.write():  # a caller's own business
        raise sqlite3.IntegrityError("UNIQUE constraint failed: runs.run_id")
    assert not db.connection.in_transaction
    with db.write() as tx:
        assert tx.scalar("SELECT 1") == 1


def test_a_connection_left_inside_a_transaction_is_rolled_back_before_the_next(
    db: StateDatabase,
) -> None:
    db.connection.execute("BEGIN IMMEDIATE")
    db.connection.execute("DELETE FROM blobs")
    with db.write() as tx:  # would fail "cannot start a transaction within a transaction"
        assert tx.scalar("SELECT 1") == 1
    assert not db.connection.in_transaction


def damaged_copy(source: StateDatabase, target: Path, table: str) -> Path:
    copy = sqlite3.connect(target)
    try:
        source.connection.backup(copy)
        copy.execute("PRAGMA journal_mode = DELETE")
        page_size = copy.execute("PRAGMA page_size").fetchone()[0]
        (root,) = copy.execute(
            "SELECT rootpage FROM sqlite_schema WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
    finally:
        copy.close()
    target.chmod(0o600)
    with open(target, "r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(b"\xa5" * 200)
    return target


def test_a_damaged_page_is_refused_at_open_and_typed_on_every_later_read(
    db: StateDatabase, tmp_path: Path, clock: FakeClock
) -> None:
    with db.write() as tx:
        blobs.put_bytes(tx, b'{"a":1}', MediaType.JSON)
    directory = tmp_path / "copy"
    directory.mkdir(mode=0o700)
    target = damaged_copy(db, directory / "state.sqlite", "blobs")
    with pytest.raises(StateCorruptError, match="damaged") as refused:
        StateDatabase(target, clock=clock)
    assert "piwf state restore" in str(refused.value)
    # Skipping the open check (a file too large for its budget): the read that meets the
    # damage is typed, and the connection goes on serving the rest.
    with StateDatabase(target, clock=clock, quick_check_s=0) as opened:
        with pytest.raises(StateCorruptError), opened.read() as tx:
            tx.all("SELECT * FROM blobs")
        with pytest.raises(StateCorruptError), opened.write() as tx:
            blobs.put_bytes(tx, b'{"b":2}', MediaType.JSON)
        with opened.read() as tx:
            assert tx.scalar("SELECT schema_name FROM schema_meta") is not None


def test_the_open_check_stops_at_its_budget(db: StateDatabase) -> None:
    with db.write() as tx:
        for _ in range(8):
            blobs.put_text(tx, noise(MIB))
    checked = open_check.bounded_quick_check
    assert checked(db.connection, db.path, 0.0) is False, "out of budget is not an error"
    assert checked(db.connection, db.path, 60.0) is True
    assert db.connection.execute("SELECT count(*) FROM blobs").fetchone()[0] == 8, (
        "no interrupt reaches a later statement"
    )


@pytest.mark.parametrize(
    ("error", "expected", "words"),
    [
        (sqlite3.OperationalError("database or disk is full"), StateFullError, "SQLITE_FULL"),
        (sqlite3.OperationalError("disk I/O error"), StateIoError, "SQLITE_IOERR"),
        (sqlite3.DatabaseError("database disk image is malformed"), StateCorruptError, "restore"),
        (sqlite3.DatabaseError("file is not a database"), StateCorruptError, "SQLITE_NOTADB"),
        (sqlite3.OperationalError("unable to open database file"), StateIoError, "CANTOPEN"),
        (OSError(errno.ENOSPC, "No space left", "/a/secret/path"), StateFullError, "ENOSPC"),
        (OSError(errno.EDQUOT, "Quota", "/a/secret/path"), StateFullError, "EDQUOT"),
        (OSError(errno.EIO, "I/O", "/a/secret/path"), StateIoError, "EIO: Input/output error"),
    ],
)
def test_failures_of_the_file_map_to_typed_errors_without_paths(
    error: Exception, expected: type[StateUnavailableError], words: str
) -> None:
    typed = state_error_of(error, "writing the state")
    assert type(typed) is expected
    assert words in str(typed)
    assert "secret" not in str(typed), "an OSError's file name never reaches a message"


def test_other_sqlite_errors_are_left_to_the_caller() -> None:
    assert state_error_of_sqlite(sqlite3.IntegrityError("UNIQUE constraint failed"), "x") is None
    assert state_error_of(KeyError("k"), "x") is None


def test_a_real_sqlite_full_carries_its_result_code(db: StateDatabase) -> None:
    cap_at_current_size(db)
    db.connection.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError) as raw:
            db.connection.execute(
                "INSERT INTO blobs (blob_hash, media_type, byte_length, content, created_at)"
                " VALUES (randomblob(32), 'text/plain', ?, randomblob(?), 0)",
                (2 * MIB, 2 * MIB),
            )
    finally:
        if db.connection.in_transaction:  # SQLite may have rolled back already
            db.connection.execute("ROLLBACK")
    assert type(state_error_of(raw.value, "writing the state")) is StateFullError


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda tmp: Path("relative.sqlite"), "must be an absolute path"),
        (lambda tmp: tmp, "already exists (a directory)"),
        (lambda tmp: Path("/dev/null"), "already exists (a character device)"),
        (lambda tmp: tmp / ("n" * 256), "NAME_MAX"),
        (lambda tmp: tmp / "missing" / "b.sqlite", "does not exist"),
        (lambda tmp: Path("/dev/null/b.sqlite"), "ENOTDIR"),
        (lambda tmp: Path("/" + "p/" * 2047 + "b"), "PATH_MAX"),
    ],
)
def test_backup_destinations_are_checked_before_anything_is_written(
    db: StateDatabase, tmp_path: Path, make: object, words: str
) -> None:
    destination = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(BackupError, match=words.replace("(", r"\(").replace(")", r"\)")) as bad:
        check_destination(destination, db.path)
    assert str(destination) not in str(bad.value)


def test_a_fifo_and_the_live_database_are_refused(db: StateDatabase, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BackupError, match="a FIFO"):
        check_destination(fifo, db.path)
    with pytest.raises(BackupError, match="live database"):
        check_destination(db.path, db.path)
    check_destination(tmp_path / "new.sqlite", db.path)  # a good one passes
