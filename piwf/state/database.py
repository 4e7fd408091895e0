"""Open, create and verify the state database; run explicit transactions on it.

Opening a file follows one order, so that an incompatible file is never touched::

    home 0700 (created or verified)  ->  file checks (no symlink, one link, owner, 0600)
      -> home, file, -wal and -shm writable by this user, else refused (writable.py)
      -> a -wal beside it that provably belongs to another database: refused (wal.py)
      -> missing file: create it 0600 with O_EXCL, then initialise under BEGIN EXCLUSIVE
      -> existing file: read its identity without mutating it
           (no -wal beside it: an immutable read that creates no -wal/-shm;
            a -wal beside it: the file was in use, read through the connection itself)
      -> connection pragmas (foreign_keys, busy_timeout, synchronous=FULL, bounded WAL)
      -> journal_mode=WAL, only after the identity is verified

Identity = ``application_id``, ``user_version``, the ``schema_meta`` row (name, version, DDL
digest) and the exact ``sqlite_schema`` shape compared with a database built from the DDL.

Transactions are explicit: :meth:`StateDatabase.write` opens ``BEGIN IMMEDIATE`` (never a
deferred read that later writes), :meth:`StateDatabase.read` a consistent read snapshot. A
helper that receives a :class:`Transaction` never commits; nested ``write()``/``read()`` calls
join the outer transaction. Writes that may wait for the end of a server loop turn are queued
in :attr:`StateDatabase.group` and commit together (:mod:`piwf.state.group_commit`).

Failures of the file itself never leave SQLite's own exceptions to the caller and never leave
the connection inside a transaction::

    a statement, BEGIN or COMMIT fails with SQLITE_FULL / IOERR / CORRUPT / BUSY ...
      -> ROLLBACK (SQLite may already have rolled back: then nothing to do)
      -> ROLLBACK failed too: the connection is closed and reopened before the next transaction
      -> raise the typed StateUnavailableError (piwf.state.failures), nothing committed

so the next transaction starts on a clean, usable connection once the cause (a full disk) is
gone. A writer open of an existing file also runs ``PRAGMA quick_check`` for at most
``quick_check_s`` seconds (:data:`QUICK_CHECK_BUDGET_S`), so a damaged file is refused with
:class:`StateCorruptError` before any client is served.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from piwf._version import __version__
from piwf.clock import Clock, SystemClock
from piwf.config import FILE_MODE, ensure_private_dir, state_path
from piwf.errors import (
    IncompatibleStateError,
    InvalidTransitionError,
    ReadOnlyStateError,
    StateBusyError,
    StateUnavailableError,
)
from piwf.state.failures import sqlite_result, state_error_of_sqlite
from piwf.state.group_commit import GroupCommit
from piwf.state.open_check import QUICK_CHECK_BUDGET_S, bounded_quick_check, damage_error
from piwf.state.schema import APPLICATION_ID, SCHEMA_DIGEST, SCHEMA_NAME, SCHEMA_VERSION, STATEMENTS
from piwf.state.wal import refuse_foreign_wal
from piwf.state.writable import refuse_unsafe_state_file, refuse_unwritable_state

Mode = Literal["read-write", "read-only"]
SqlParams = Sequence[Any] | dict[str, Any]

log = logging.getLogger("piwf.state")

BUSY_TIMEOUT_MS = 5000
WAL_AUTOCHECKPOINT_PAGES = 1000
JOURNAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
#: A savepoint's undo pages (SQLite's statement journal) stay in memory: past 64 KiB SQLite
#: would spill them to a new, unlinked file in the system's temporary directory, one per group
#: commit, so every write would also depend on that directory's space.
WRITER_TEMP_STORE = "MEMORY"

RESET_INSTRUCTION = (
    "Back up and move {name} together with its -wal and -shm files, then start piwf again "
    "to create a new state database. The incompatible state was not changed."
)


_SHAPE_QUERY = """
SELECT type, name, tbl_name, sql FROM sqlite_schema
WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name
"""


class Transaction:
    """One open SQLite transaction and the clock reading taken when it began.

    Every check and timestamp inside one transaction uses :attr:`now`, so a claim that expires
    "during" a transaction is judged against one instant.
    """

    def __init__(self, connection: sqlite3.Connection, now: int, writable: bool) -> None:
        self.connection = connection
        self.now = now
        self.writable = writable
        #: Savepoints open now (the next one's depth, minus one).
        self._savepoints = 0

    def execute(self, sql: str, params: SqlParams = ()) -> sqlite3.Cursor:
        """Run one statement and return its cursor.

        Raises a :class:`~piwf.errors.StateUnavailableError` when the file fails (full, I/O,
        damaged, locked); SQLite's other errors (constraints) are raised unchanged.
        """
        # try/except rather than a context manager: this runs for every statement.
        try:
            return self.connection.execute(sql, params)
        except sqlite3.Error as error:
            raise _typed_or_same(error, self.writable) from None

    def one(self, sql: str, params: SqlParams = ()) -> sqlite3.Row | None:
        """Return the first row of a query, or None."""
        try:
            row: sqlite3.Row | None = self.connection.execute(sql, params).fetchone()
        except sqlite3.Error as error:
            raise _typed_or_same(error, self.writable) from None
        return row

    def all(self, sql: str, params: SqlParams = ()) -> list[sqlite3.Row]:
        """Return every row of a query."""
        try:
            return list(self.connection.execute(sql, params).fetchall())
        except sqlite3.Error as error:
            raise _typed_or_same(error, self.writable) from None

    def scalar(self, sql: str, params: SqlParams = ()) -> Any:
        """Return the first column of the first row, or None when there is no row."""
        try:
            row = self.connection.execute(sql, params).fetchone()
        except sqlite3.Error as error:
            raise _typed_or_same(error, self.writable) from None
        return None if row is None else row[0]

    @contextmanager
    def savepoint(self) -> Iterator[Transaction]:
        """Run a nested step that is undone alone if it raises (the outer transaction goes on).

        When the step failed because the file did (SQLite may then have rolled the whole
        transaction back), the step's error is raised as it is and the outer transaction,
        which cannot go on, is rolled back by its scope.
        """
        # Named by nesting depth: the same few statements every time, so they stay in the
        # connection's statement cache instead of pushing the real statements out of it.
        self._savepoints += 1
        name = f"piwf_{self._savepoints}"
        try:
            self.execute(f"SAVEPOINT {name}")
            try:
                yield self
            except BaseException as error:
                if not isinstance(error, StateUnavailableError) and self.connection.in_transaction:
                    self.execute(f"ROLLBACK TO {name}")
                    self.execute(f"RELEASE {name}")
                raise
            self.execute(f"RELEASE {name}")
        finally:
            self._savepoints -= 1


class StateDatabase:
    """The piwf state database, opened read-write (the server) or read-only (tools).

    Raises :class:`IncompatibleStateError` (file untouched, no -wal/-shm created) when the
    file is not a piwf database of this exact schema, :class:`UnsafeStateHomeError` when the
    home or the file has unsafe ownership, links or permissions, and
    :class:`StateCorruptError` when a read-write open's bounded ``quick_check`` (at most
    ``quick_check_s`` seconds; 0 skips it) finds damage.
    """

    def __init__(
        self,
        path: Path | str | None = None,
        mode: Mode = "read-write",
        *,
        clock: Clock | None = None,
        quick_check_s: float = QUICK_CHECK_BUDGET_S,
    ) -> None:
        if mode not in ("read-write", "read-only"):
            raise ValueError(f"mode must be 'read-write' or 'read-only', not {mode!r}")
        self.path = Path(path).absolute() if path is not None else state_path()
        self.mode: Mode = mode
        self.clock: Clock = clock or SystemClock()
        self._transaction: Transaction | None = None
        #: Writes queued to commit together at the end of a server loop turn (group_commit.py).
        self.group = GroupCommit(self)
        #: Set when a ROLLBACK failed: the next transaction first opens a fresh connection.
        self._needs_reopen = False
        if mode == "read-write":
            self._connection = _open_writer(self.path, self.clock, quick_check_s=quick_check_s)
        else:
            self._connection = _open_reader(self.path)

    @property
    def connection(self) -> sqlite3.Connection:
        """The underlying connection, for pragmas and diagnostics; stores use transactions."""
        return self._connection

    @contextmanager
    def write(self) -> Iterator[Transaction]:
        """Open (or join) a ``BEGIN IMMEDIATE`` transaction; commit on success, else roll back.

        Writes queued in :attr:`group` are committed first, in their own transaction.

        Raises :class:`ReadOnlyStateError` on a read-only handle, :class:`StateBusyError` when
        another writer holds the lock past ``busy_timeout``, and
        :class:`InvalidTransitionError` when called inside a :meth:`read` snapshot.
        """
        if self._transaction is None and self.group.pending:
            self.group.flush()  # writes queued earlier commit first: the order of writes holds
        with self.write_now() as transaction:
            yield transaction

    @contextmanager
    def write_now(self) -> Iterator[Transaction]:
        """:meth:`write` without first committing the writes queued in :attr:`group` (the
        group's own transaction)."""
        if self.mode == "read-only":
            raise ReadOnlyStateError(f"{self.path.name} is open read-only; writes are refused")
        if self._transaction is not None:
            if not self._transaction.writable:
                raise InvalidTransitionError("a write cannot join a read-only snapshot")
            yield self._transaction
            return
        with self._transaction_scope("BEGIN IMMEDIATE", writable=True) as transaction:
            yield transaction

    @contextmanager
    def read(self) -> Iterator[Transaction]:
        """Open (or join) a read snapshot; nothing written inside it is allowed."""
        if self._transaction is not None:
            yield self._transaction
            return
        with self._transaction_scope("BEGIN", writable=False) as transaction:
            yield transaction

    @contextmanager
    def _transaction_scope(self, begin: str, writable: bool) -> Iterator[Transaction]:
        connection = self._usable_connection()
        _execute_typed(connection, begin, writable)
        transaction = Transaction(connection, self.clock.now_ms(), writable)
        self._transaction = transaction
        try:
            yield transaction
        except BaseException as error:
            self._transaction = None
            self._rollback()
            typed = _typed(error, writable)
            if typed is None:
                raise
            raise typed from None
        self._transaction = None
        try:
            _execute_typed(connection, "COMMIT", writable)
        except BaseException:
            self._rollback()
            raise

    def _usable_connection(self) -> sqlite3.Connection:
        """The connection, outside any transaction: reopened after a failed rollback, rolled
        back if something left it inside one (a transaction never spans two scopes)."""
        if self._needs_reopen:
            self._reopen()
        if self._connection.in_transaction:
            self._rollback()
            if self._needs_reopen:
                self._reopen()
        return self._connection

    def _rollback(self) -> None:
        """Roll back whatever is open; a connection that cannot is marked for a reopen."""
        connection = self._connection
        try:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
        except sqlite3.Error as error:
            log.warning("rollback failed (%s); the connection will be reopened", _name_of(error))
            self._needs_reopen = True
        if connection.in_transaction:
            self._needs_reopen = True

    def _reopen(self) -> None:
        """Replace the connection with a fresh one (its pragmas and identity checked again).

        Raises the typed error of a failed open and stays marked, so the next transaction
        tries again.
        """
        with suppress(sqlite3.Error):  # closing a connection that already failed
            self._connection.close()
        try:
            if self.mode == "read-write":
                self._connection = _open_writer(self.path, self.clock, quick_check_s=0)
            else:
                self._connection = _open_reader(self.path)
        except sqlite3.Error as error:
            typed = _typed(error, self.mode == "read-write")
            if typed is None:
                raise
            raise typed from None
        self._needs_reopen = False
        log.info("state connection reopened")

    def pragma(self, name: str) -> Any:
        """Return the value of a read-only pragma (used by tests and diagnostics)."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a pragma name: {name!r}")
        row = self._connection.execute(f"PRAGMA {name}").fetchone()
        return None if row is None else row[0]

    def vacuum(self) -> None:
        """``VACUUM`` outside any transaction, its copy (as large as the live pages) built on
        disk, not in the writer's in-memory temporary storage (:data:`WRITER_TEMP_STORE`)."""
        self._connection.execute("PRAGMA temp_store = FILE")
        try:
            self._connection.execute("VACUUM")
        finally:
            self._connection.execute(f"PRAGMA temp_store = {WRITER_TEMP_STORE}")

    def integrity_problems(self) -> list[str]:
        """Return integrity and foreign-key problems (empty when the file is sound)."""
        problems = [
            str(row[0])
            for row in self._connection.execute("PRAGMA integrity_check").fetchall()
            if row[0] != "ok"
        ]
        problems.extend(
            f"foreign key: {row[0]} row {row[1]} -> {row[2]}"
            for row in self._connection.execute("PRAGMA foreign_key_check").fetchall()
        )
        return problems

    def close(self) -> None:
        """Close the connection; further use raises ``sqlite3.ProgrammingError``."""
        self._connection.close()

    def __enter__(self) -> StateDatabase:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _open_writer(path: Path, clock: Clock, *, quick_check_s: float) -> sqlite3.Connection:
    ensure_private_dir(path.parent)
    existed = _check_database_file(path)
    refuse_unwritable_state(path)
    if not existed:
        _create_empty_file(path)
    elif not _sidecar(path, "-wal").exists():
        _verify_inactive_file(path)
    connection = _connect(path, "rw")
    try:
        _apply_connection_pragmas(connection)
        state = _read_identity(connection, path)
        if state == "empty":
            _initialise(connection, path, clock)
        elif quick_check_s > 0:  # before WAL mode is set: a damaged file is left as it was
            bounded_quick_check(connection, path, quick_check_s)
        _set_wal(connection, path)
        _read_identity(connection, path, require_complete=True)
    except BaseException:
        connection.close()
        raise
    return connection


def _open_reader(path: Path) -> sqlite3.Connection:
    if not _check_database_file(path):
        raise IncompatibleStateError(f"{path} does not exist")
    # With no -wal beside it the file is inactive: read it immutably so that no -wal or -shm
    # appears next to a backup. A -wal means a writer may be live: read through WAL.
    immutable = not _sidecar(path, "-wal").exists()
    connection = _connect(path, "ro", immutable=immutable)
    try:
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA query_only = ON")
        _read_identity(connection, path, require_complete=True)
    except BaseException:
        connection.close()
        raise
    return connection


def _check_database_file(path: Path) -> bool:
    """Return whether the file exists; refuse symlinks, hard links and foreign owners."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        for suffix in ("-wal", "-shm"):
            if _sidecar(path, suffix).exists():
                raise IncompatibleStateError(
                    f"{path.name}{suffix} exists without {path.name}: an interrupted "
                    "`piwf state restore` leaves this, and running it again finishes it; else "
                    f"move {path.name}-wal and -shm aside, then start piwf again to create a new"
                    " state database. The incompatible state was not changed."
                ) from None
        return False
    refuse_unsafe_state_file(path, info)
    # Before SQLite pairs the file with a -wal beside it (piwf/state/wal.py).
    refuse_foreign_wal(path)
    return True


def _create_empty_file(path: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, FILE_MODE)
    except FileExistsError:
        return  # another process created it first; its identity is read next
    os.close(descriptor)


def _verify_inactive_file(path: Path) -> None:
    """Read the identity of a file no connection is using, without creating -wal or -shm."""
    probe = _connect(path, "ro", immutable=True)
    try:
        _read_identity(probe, path)
    finally:
        probe.close()


def _connect(path: Path, access: str, *, immutable: bool = False) -> sqlite3.Connection:
    uri = f"file:{quote(str(path))}?mode={access}"
    if immutable:
        uri += "&immutable=1"
    connection = sqlite3.connect(
        uri,
        uri=True,
        isolation_level=None,
        timeout=BUSY_TIMEOUT_MS / 1000,
        cached_statements=256,
    )
    connection.row_factory = sqlite3.Row
    return connection


def _apply_connection_pragmas(connection: sqlite3.Connection) -> None:
    """Set the per-connection writer pragmas; none of these writes to the file."""
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("PRAGMA trusted_schema = OFF")
    connection.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
    connection.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES}")
    connection.execute(f"PRAGMA temp_store = {WRITER_TEMP_STORE}")


def _set_wal(connection: sqlite3.Connection, path: Path) -> None:
    mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise IncompatibleStateError(f"{path} could not switch to WAL mode (got {mode!r})")


def _initialise(connection: sqlite3.Connection, path: Path, clock: Clock) -> None:
    """Create the schema in an empty file; a concurrent creator makes this a no-op."""
    connection.execute("PRAGMA journal_mode = WAL")
    _execute_translating_busy(connection, "BEGIN EXCLUSIVE")
    try:
        if _read_identity(connection, path) == "empty":
            for statement in STATEMENTS:
                connection.execute(statement)
            connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            now = clock.now_ms()
            connection.execute(
                "INSERT INTO schema_meta (id, schema_name, schema_version, schema_digest,"
                " app_version, created_at, updated_at) VALUES (1, ?, ?, ?, ?, ?, ?)",
                (SCHEMA_NAME, SCHEMA_VERSION, SCHEMA_DIGEST, __version__, now, now),
            )
        connection.execute("COMMIT")
    except BaseException:
        _rollback(connection)
        raise


def _read_identity(
    connection: sqlite3.Connection, path: Path, *, require_complete: bool = False
) -> Literal["empty", "piwf"]:
    """Return ``"empty"`` for a blank file or ``"piwf"`` for a verified one; else raise."""

    def incompatible(reason: str) -> IncompatibleStateError:
        return IncompatibleStateError(
            f"piwf state at {path} is incompatible: {reason}. "
            + RESET_INSTRUCTION.format(name=path.name)
        )

    try:
        application_id = connection.execute("PRAGMA application_id").fetchone()[0]
        user_version = connection.execute("PRAGMA user_version").fetchone()[0]
        table_count = connection.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
    except sqlite3.DatabaseError as error:
        if "locked" in str(error):
            raise StateBusyError(f"{path.name} is locked by another process") from None
        raise incompatible(f"not an SQLite database ({error})") from None
    if application_id == 0 and user_version == 0 and table_count == 0 and not require_complete:
        return "empty"
    if application_id != APPLICATION_ID:
        raise incompatible(f"foreign application id 0x{application_id:08x}")
    if user_version != SCHEMA_VERSION:
        raise incompatible(f"user_version {user_version}, expected {SCHEMA_VERSION}")
    try:
        meta = connection.execute(
            "SELECT schema_name, schema_version, schema_digest FROM schema_meta WHERE id = 1"
        ).fetchone()
        shape = [tuple(row) for row in connection.execute(_SHAPE_QUERY).fetchall()]
    except sqlite3.DatabaseError as error:
        # A damaged schema_meta page is damage, not a foreign file (nor a traceback).
        raise damage_error(path, error) or incompatible("schema_meta is missing") from None
    if meta is None:
        raise incompatible("schema_meta has no row")
    if meta[0] != SCHEMA_NAME or meta[1] != SCHEMA_VERSION:
        raise incompatible(f"schema {meta[0]!r} version {meta[1]!r}")
    if meta[2] != SCHEMA_DIGEST:
        raise incompatible("schema digest differs from this piwf version's DDL")
    if shape != expected_shape():
        raise incompatible("schema shape differs from this piwf version's DDL")
    return "piwf"


@cache
def expected_shape() -> list[tuple[Any, ...]]:
    """Return the ``sqlite_schema`` rows of a database built from the DDL (cached)."""
    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for statement in STATEMENTS:
            memory.execute(statement)
        return [tuple(row) for row in memory.execute(_SHAPE_QUERY).fetchall()]
    finally:
        memory.close()


def _execute_translating_busy(connection: sqlite3.Connection, sql: str) -> None:
    try:
        connection.execute(sql)
    except sqlite3.OperationalError as error:
        if "locked" in str(error) or "busy" in str(error):
            raise StateBusyError(
                f"the state database stayed locked for {BUSY_TIMEOUT_MS} ms"
            ) from None
        raise


def _execute_typed(connection: sqlite3.Connection, sql: str, writable: bool) -> None:
    """Run BEGIN or COMMIT; raise the typed error of a failure of the file."""
    try:
        connection.execute(sql)
    except sqlite3.Error as error:
        raise _typed_or_same(error, writable) from None


def _typed_or_same(error: sqlite3.Error, writable: bool) -> BaseException:
    """SQLite's failure of the file (full, I/O, damaged, locked) as its typed error; any other
    error (a constraint) as it is."""
    return _typed(error, writable) or error


def _typed(error: BaseException, writable: bool) -> StateUnavailableError | None:
    if not isinstance(error, sqlite3.Error):
        return None
    if isinstance(error, sqlite3.OperationalError) and (
        "locked" in str(error) or "busy" in str(error)
    ):
        return StateBusyError(f"the state database stayed locked for {BUSY_TIMEOUT_MS} ms")
    return state_error_of_sqlite(error, "writing the state" if writable else "reading the state")


def _name_of(error: sqlite3.Error) -> str:
    """SQLite's result name (``SQLITE_BUSY``), also on Pythons whose errors carry no code."""
    found = sqlite_result(error)
    return type(error).__name__ if found is None else found[1]


def _rollback(connection: sqlite3.Connection) -> None:
    if connection.in_transaction:
        connection.execute("ROLLBACK")


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)
