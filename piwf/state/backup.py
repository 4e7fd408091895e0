"""Backups through the SQLite backup API, verified read-only before they are accepted.

Order: check the destination up front (below), create a private temporary file beside it
(``O_EXCL``, mode ``0600``), copy every page with ``Connection.backup`` from the live
connection, switch the copy to rollback-journal mode so it is self-contained, fsync it, open it
read-only and check its identity, integrity and foreign keys, then link it to the destination
name (never overwriting an existing file) and fsync the directory. The live file is never
opened with ``open()``.

The destination is checked before anything is written, each with its own message::

    relative                                   -> "must be an absolute path"
    holding a NUL character                    -> "contains a NUL character"
    longer than PATH_MAX / a name over NAME_MAX -> "... bytes long; the limit is ..."
    the live database                          -> "is the live database"
    its -journal, -wal or -shm name            -> "named like a journal of the live database"
    already there (file, directory, FIFO,       -> "already exists (a directory); choose a new
      device, socket, symlink)                      file name"
    parent missing or not a directory          -> "the backup directory does not exist" / "is
                                                   not a directory"

Failures are typed and never name the destination (it is a request's payload): a destination
to fix is a :class:`~piwf.errors.BackupError` (``backupFailed``; with the OS reason, e.g.
``cannot create the backup file: EROFS: Read-only file system``); a full disk is a
:class:`~piwf.errors.StateFullError` and an I/O error a :class:`~piwf.errors.StateIoError`
(retry later); a damaged live database a :class:`~piwf.errors.StateCorruptError`. The
temporary file is removed in every case.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

from piwf import faults
from piwf.config import FILE_MODE
from piwf.errors import BackupError, StateCorruptError, StateError, StateUnavailableError
from piwf.state.database import StateDatabase
from piwf.state.failures import (
    CORRUPT_ADVICE,
    SQLITE_CORRUPT,
    SQLITE_FULL,
    SQLITE_IOERR,
    SQLITE_NOTADB,
    os_reason,
    sqlite_result,
    state_error_of_os,
)
from piwf.state.writable import file_kind

__all__ = ["BackupError", "BackupReport", "backup_database", "check_destination"]

#: Linux limits, used when ``pathconf`` cannot answer (the directory does not exist).
DEFAULT_PATH_MAX = 4096
DEFAULT_NAME_MAX = 255
#: Errors of the destination that go away by themselves or by freeing space: retry later.
_TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EINTR})


@dataclass(frozen=True)
class BackupReport:
    """A verified backup."""

    destination: Path
    byte_length: int


def backup_database(db: StateDatabase, destination: Path) -> BackupReport:
    """Copy ``db`` to ``destination`` (absolute, not existing) and verify the copy.

    Raises :class:`BackupError` for a destination that cannot be used (see the module
    docstring) or a copy that fails verification, :class:`StateFullError` /
    :class:`StateIoError` when writing it fails for a reason that can pass, and
    :class:`StateCorruptError` when the live database cannot be read. Nothing is left under
    the destination name or beside it.
    """
    check_destination(destination, db.path)
    directory = destination.parent
    # A short name of its own: the destination's name may already use all of NAME_MAX.
    temporary = directory / f".piwf-backup-{secrets.token_hex(6)}.tmp"
    try:
        descriptor = os.open(
            temporary,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            FILE_MODE,
        )
    except OSError as error:
        raise _os_failure("cannot create the backup file", error) from None
    os.close(descriptor)
    try:
        _copy(db, temporary)
        _verify(temporary)
        faults.point("backup.before_link")
        try:
            os.link(temporary, destination)
        except FileExistsError:
            raise BackupError("the backup destination appeared while the backup was made") from None
        except OSError as error:
            raise _os_failure("cannot name the backup file", error) from None
        try:
            _fsync_directory(directory)
            size = destination.stat().st_size
        except OSError as error:
            raise _os_failure("cannot sync the backup directory", error) from None
        return BackupReport(destination, size)
    finally:
        for path in (temporary, *(Path(f"{temporary}{s}") for s in ("-journal", "-wal", "-shm"))):
            # Best effort: nothing is ever left under the destination name either way.
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


def check_destination(destination: Path, live: Path) -> None:
    """Raise :class:`BackupError` unless ``destination`` can become a new backup file."""
    if not destination.is_absolute():
        raise BackupError(
            "the backup destination must be an absolute path; give the full path of a new file"
        )
    if "\x00" in str(destination):
        raise BackupError(
            "the backup destination contains a NUL character, which no file name can hold; "
            "choose another path"
        )
    encoded = os.fsencode(destination)
    path_max = _limit(destination.parent, "PC_PATH_MAX", DEFAULT_PATH_MAX)
    if len(encoded) >= path_max:
        raise BackupError(
            f"the backup path is {len(encoded)} bytes long; the limit is {path_max - 1} "
            "(PATH_MAX): choose a shorter path"
        )
    name_max = _limit(destination.parent, "PC_NAME_MAX", DEFAULT_NAME_MAX)
    too_long = [part for part in destination.parts if len(os.fsencode(part)) > name_max]
    if too_long:
        raise BackupError(
            f"a name in the backup path is {len(os.fsencode(too_long[0]))} bytes long; the "
            f"limit is {name_max} (NAME_MAX): choose a shorter name"
        )
    try:
        info = destination.lstat()
    except FileNotFoundError:
        info = None
    except OSError as error:
        raise _os_failure("cannot use the backup destination", error) from None
    if info is not None:
        if _same_file(destination, live):
            raise BackupError("the backup destination is the live database; choose a new file")
        kind = file_kind(info.st_mode)
        raise BackupError(f"the backup destination already exists ({kind}); choose a new file name")
    companions = {f"{live.name}{suffix}" for suffix in ("-journal", "-wal", "-shm")}
    if destination.name in companions and _same_file(destination.parent, live.parent):
        # SQLite would take a file of that name for the live database's journal: a
        # "-journal" is played back and deleted at the next open, the backup gone with it.
        raise BackupError(
            f"the backup destination is named like a journal of the live database "
            f"({destination.name}), which SQLite would take for it and delete; choose another"
            " name or directory"
        )
    try:
        parent = destination.parent.stat()
    except FileNotFoundError:
        raise BackupError(
            "the backup directory does not exist; create it or choose another"
        ) from None
    except OSError as error:
        raise _os_failure("cannot use the backup directory", error) from None
    if not stat.S_ISDIR(parent.st_mode):
        raise BackupError(
            f"the backup directory is not a directory ({file_kind(parent.st_mode)}); "
            "choose a path inside a directory"
        )


def _limit(directory: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(directory, name)
    except (OSError, ValueError):
        return default
    return value if value > 0 else default


def _same_file(destination: Path, live: Path) -> bool:
    try:
        return destination.samefile(live)
    except OSError:
        return False


def _os_failure(doing: str, error: OSError) -> StateError:
    """A destination to fix (:class:`BackupError`) or a failure that passes (full, I/O)."""
    if error.errno in _TRANSIENT_ERRNOS:
        return state_error_of_os(error, doing)
    return BackupError(f"{doing}: {os_reason(error)}; choose another destination")


def _copy(db: StateDatabase, temporary: Path) -> None:
    try:
        target = sqlite3.connect(temporary, isolation_level=None)
        try:
            db.connection.backup(target)
            target.execute("PRAGMA journal_mode = DELETE")
        finally:
            target.close()
    except sqlite3.Error as error:
        raise _sqlite_failure(error) from None
    try:
        descriptor = os.open(temporary, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as error:
        raise _os_failure("cannot sync the backup file", error) from None


def _sqlite_failure(error: sqlite3.Error) -> StateError:
    """The typed error of a failed copy: a damaged source, a full or failing target."""
    found = sqlite_result(error)
    primary, name = found if found is not None else (0, type(error).__name__)
    if primary in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return StateCorruptError(
            f"cannot copy the state: the database is damaged ({name}); {CORRUPT_ADVICE}"
        )
    if primary == SQLITE_FULL:
        return state_error_of_os(
            OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "writing the backup"
        )
    if primary == SQLITE_IOERR:
        return state_error_of_os(OSError(errno.EIO, os.strerror(errno.EIO)), "writing the backup")
    return BackupError(f"cannot write the backup ({name}); choose another destination")


def _verify(temporary: Path) -> None:
    try:
        copy = StateDatabase(temporary, mode="read-only")
    except StateUnavailableError:
        raise
    except StateError as error:
        raise BackupError(f"the backup copy did not verify: {error.code}") from None
    try:
        problems = copy.integrity_problems()
    except sqlite3.Error as error:
        raise _sqlite_failure(error) from None
    finally:
        copy.close()
    if problems:
        raise BackupError(f"the backup copy failed its integrity check: {problems[0][:200]}")


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
