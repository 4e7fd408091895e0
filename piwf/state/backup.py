"""Backups through the SQLite backup API, verified read-only before they are accepted.

Order: create a private temporary file beside the destination (``O_EXCL``, mode ``0600``),
copy every page with ``Connection.backup`` from the live connection, switch the copy to
rollback-journal mode so it is self-contained, fsync it, open it read-only and check its
identity, integrity and foreign keys, then link it to the destination name (never overwriting
an existing file) and fsync the directory. The live file is never opened with ``open()``.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from piwf import faults
from piwf.config import FILE_MODE
from piwf.errors import StateError
from piwf.state.database import StateDatabase


class BackupError(StateError):
    """A backup could not be made or did not verify; no file was left under its name."""

    code = "backupFailed"


@dataclass(frozen=True)
class BackupReport:
    """A verified backup."""

    destination: Path
    byte_length: int


def backup_database(db: StateDatabase, destination: Path) -> BackupReport:
    """Copy ``db`` to ``destination`` (absolute, not existing) and verify the copy.

    Raises :class:`BackupError` for a relative, existing or live destination, a missing
    directory, or a copy that fails verification (the temporary file is removed).
    """
    if not destination.is_absolute():
        raise BackupError("the backup destination must be an absolute path")
    if destination.resolve() == db.path.resolve():
        raise BackupError("the backup destination is the live database")
    if destination.exists() or destination.is_symlink():
        raise BackupError(f"{destination} already exists; choose a new file name")
    directory = destination.parent
    if not directory.is_dir():
        raise BackupError(f"{directory} is not a directory")
    temporary = directory / f".{destination.name}.{secrets.token_hex(6)}.tmp"
    descriptor = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE
    )
    os.close(descriptor)
    try:
        _copy(db, temporary)
        _verify(temporary)
        faults.point("backup.before_link")
        try:
            os.link(temporary, destination)
        except FileExistsError:
            raise BackupError(f"{destination} appeared while the backup was made") from None
        _fsync_directory(directory)
        return BackupReport(destination, destination.stat().st_size)
    finally:
        temporary.unlink(missing_ok=True)
        for suffix in ("-journal", "-wal", "-shm"):
            Path(str(temporary) + suffix).unlink(missing_ok=True)


def _copy(db: StateDatabase, temporary: Path) -> None:
    target = sqlite3.connect(temporary, isolation_level=None)
    try:
        db.connection.backup(target)
        target.execute("PRAGMA journal_mode = DELETE")
    finally:
        target.close()
    descriptor = os.open(temporary, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _verify(temporary: Path) -> None:
    try:
        copy = StateDatabase(temporary, mode="read-only")
    except StateError as error:
        raise BackupError(f"the backup copy did not verify: {error}") from None
    try:
        problems = copy.integrity_problems()
    finally:
        copy.close()
    if problems:
        raise BackupError(f"the backup copy failed its integrity check: {problems[0]}")


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
