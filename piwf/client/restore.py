"""``piwf state restore BACKUP``: install a verified backup as the state database of a home.

Restore is offline, like offline verification: no server may run, so the client does it
itself. Every step either changes nothing or leaves a home that is sound or clearly refused::

    BACKUP: a private regular file (as `piwf state verify` requires), not this home's
            database, no -wal/-journal of its own
    take the single-instance lock (server/server.lock)     held by a server -> refused
    a live server answering on the socket                  -> refused
    copy BACKUP to .state.sqlite.restore-<hex>.tmp in the home (O_EXCL, 0600), fsync
    verify the copy as `piwf state verify` does (identity, integrity, foreign keys, invariants)
                                                           any violation -> refused
    move aside, in this order, never overwriting:
        state.sqlite          -> state.sqlite.replaced-<UTC stamp>
        state.sqlite-wal      -> state.sqlite.replaced-<UTC stamp>-wal
        state.sqlite-shm      -> ...-shm        state.sqlite-journal -> ...-journal
    fsync the home; rename the copy to state.sqlite; fsync the home

Until the first move nothing in the home has changed. The database moves first: a crash after
it leaves a -wal without its database, which piwf refuses to open (never the old WAL mixed
into the restored file), and running restore again moves the rest aside. The moved-aside
names keep SQLite's pairing (``X-wal`` is the WAL of ``X``), so a replaced set can itself be
inspected or restored later. Holding the lock for the whole restore also keeps a server from
starting half-way through.

This module opens the backup and its copy with ``open()``; that is safe because no process
uses them, and it never opens the live database (it is only renamed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from piwf.client.arguments import path_argument
from piwf.client.offline import JOURNAL_SUFFIXES, verify_file
from piwf.client.sockets import NotListeningError, TransportError, connect_socket
from piwf.config import FILE_MODE, ServerPaths, ensure_private_dir
from piwf.errors import (
    IncompatibleStateError,
    ServerError,
    ServerRunningError,
    StateError,
    UnsafeStateHomeError,
)
from piwf.state.database import RESET_INSTRUCTION
from piwf.state.file_damage import check_inactive_file, open_inactive_file
from piwf.state.writable import file_kind

#: The database and every file SQLite may pair with it, in the order they are moved aside.
DATABASE_FAMILY: Final = ("", "-wal", "-shm", "-journal")
_COPY_CHUNK: Final = 1024 * 1024
_TEMPORARY_PREFIX: Final = ".state.sqlite.restore-"
_MAX_NAME_ATTEMPTS: Final = 100
_SOCKET_PROBE_S: Final = 1.0
_STOP_FIRST: Final = "stop the server first: piwf server stop"


class RestoreError(StateError):
    """The backup was not restored; the message says why. Nothing in the home changed."""

    code = "restoreRefused"


@dataclass(frozen=True)
class MovedFile:
    """One file of the replaced database and where it went."""

    source: Path
    destination: Path


@dataclass(frozen=True)
class RestoreReport:
    """A completed restore."""

    backup: Path
    database: Path
    byte_length: int
    moved: tuple[MovedFile, ...]


def restore_backup(
    backup: str | os.PathLike[str], home: str | os.PathLike[str], *, now_ms: int | None = None
) -> RestoreReport:
    """Install a verified copy of ``backup`` as ``home``'s database (see the module docstring).

    ``backup`` and ``home`` are ``str`` or ``os.PathLike`` (relative: against the current
    directory); anything else is an :class:`~piwf.errors.InvalidArgumentError`, before any file
    is touched. ``now_ms`` (epoch milliseconds, default: now) names the moved-aside files. Raises
    :class:`~piwf.errors.ServerRunningError` while a server runs for ``home``,
    :class:`RestoreError` for a backup that is missing, has a journal of its own, or does not
    verify, :class:`~piwf.errors.IncompatibleStateError` for a file that is not a piwf
    database of this schema, and :class:`~piwf.errors.UnsafeStateHomeError` for an unsafe
    home, database file or backup file (a symlink, not a regular file, hard-linked, another
    user's, open to group or others: the rule of ``piwf state verify BACKUP``); in every
    error case nothing in the home changed.
    """
    backup = path_argument("backup", backup)
    paths = ServerPaths(path_argument("home", home))
    _check_backup(backup, paths)
    _prepare_home(paths)
    with _instance_lock(paths):
        _refuse_live_socket(paths)
        sources = _family_to_move(paths.database)
        _remove_stale_copies(paths.home)
        copy = _copy_into(backup, paths.home)
        try:
            _verify_copy(copy, backup)
            stamp = _stamp(now_ms if now_ms is not None else int(time.time() * 1000))
            moved = _move_aside(paths.database, sources, stamp)
            if paths.database.exists() or paths.database.is_symlink():
                raise RestoreError(f"{paths.database} appeared during the restore; run it again")
            copy.rename(paths.database)
            _fsync_directory(paths.home)
        finally:
            copy.unlink(missing_ok=True)
    return RestoreReport(backup, paths.database, paths.database.stat().st_size, moved)


def _check_backup(backup: Path, paths: ServerPaths) -> None:
    if not (backup.exists() or backup.is_symlink()):
        raise RestoreError(f"{backup} does not exist")
    # The rule `piwf state verify BACKUP` applies, with its messages.
    check_inactive_file(backup)
    if _same_file(backup, paths.database):
        raise RestoreError(f"{backup} is the state database of {paths.home} itself")
    for suffix in JOURNAL_SUFFIXES:
        journal = Path(f"{backup}{suffix}")
        if journal.exists() or journal.is_symlink():
            raise RestoreError(
                f"{backup} has a {suffix} file beside it: it is in use, or was copied without "
                "its journal, so the file alone is not the database. Restore only a "
                "self-contained backup, as `piwf state backup DEST` writes. Nothing was changed"
            )


def _prepare_home(paths: ServerPaths) -> None:
    """Create the home and its server directory (``0700``) or check the existing ones.

    Raises :class:`~piwf.errors.UnsafeStateHomeError` for an unsafe directory and
    :class:`RestoreError` for one that cannot be created (a file in the way, no permission).
    """
    try:
        ensure_private_dir(paths.home)
        ensure_private_dir(paths.server_dir)
    except OSError as error:
        raise RestoreError(
            f"cannot create the state home {paths.home}: {error.strerror or error}; fix or move"
            " that path, or set PIWF_HOME to a directory you can write. Nothing was changed"
        ) from None


def _same_file(left: Path, right: Path) -> bool:
    try:
        return left.samefile(right)
    except OSError:
        return False


@contextlib.contextmanager
def _instance_lock(paths: ServerPaths) -> Iterator[None]:
    """Hold the server's single-instance ``flock`` (piwf/server/lock.py) for the restore.

    A live server holds it for its whole life, so failing to take it means one runs; while the
    restore holds it, a server that starts is refused. The file's content (the last holder's
    pid, for messages) is left as it is.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(paths.lock, flags, FILE_MODE)
    except OSError as error:
        raise UnsafeStateHomeError(
            f"cannot open {paths.lock}: {error.strerror}; it must be a regular file"
        ) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServerRunningError(
                f"a piwf server is running for {paths.home}; {_STOP_FIRST}"
            ) from None
        yield
    finally:
        os.close(descriptor)  # releases the flock


def _refuse_live_socket(paths: ServerPaths) -> None:
    """Refuse when a server answers on the socket although the lock was free."""
    try:
        sock = connect_socket(paths.socket, _SOCKET_PROBE_S)
    except (NotListeningError, TransportError):
        return
    except ServerError as error:  # an unsafe socket path, or one that cannot be probed
        raise RestoreError(f"{error}; nothing was changed") from None
    sock.close()
    raise ServerRunningError(f"a piwf server answers on {paths.socket}; {_STOP_FIRST}")


def _family_to_move(database: Path) -> list[Path]:
    """Return the existing files of the database family; refuse what must not be renamed."""
    found = []
    for suffix in DATABASE_FAMILY:
        member = database.with_name(database.name + suffix)
        try:
            info = member.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeStateHomeError(
                f"{member} is not a regular file ({file_kind(info.st_mode)}); move it away "
                "yourself, then restore again. Nothing was changed"
            )
        if info.st_uid != os.geteuid():
            raise UnsafeStateHomeError(
                f"{member} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}):"
                " move it away (as its owner or root), then restore again. Nothing was changed"
            )
        found.append(member)
    return found


def _remove_stale_copies(home: Path) -> None:
    """Delete copies an interrupted restore left (only names this module creates)."""
    for leftover in home.glob(f"{_TEMPORARY_PREFIX}*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if leftover.lstat().st_uid == os.geteuid() and not leftover.is_symlink():
                leftover.unlink()


def _copy_into(backup: Path, home: Path) -> Path:
    """Copy ``backup`` byte for byte to a new private file in ``home``; fsync it."""
    copy = home / f"{_TEMPORARY_PREFIX}{secrets.token_hex(6)}.tmp"
    target = os.open(
        copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE
    )
    try:
        source = open_inactive_file(backup)
        try:
            while chunk := os.read(source, _COPY_CHUNK):
                os.write(target, chunk)
        finally:
            os.close(source)
        os.fsync(target)
    except BaseException:
        os.close(target)
        copy.unlink(missing_ok=True)
        raise
    os.close(target)
    return copy


def _verify_copy(copy: Path, backup: Path) -> None:
    """Verify the bytes about to be installed; name the backup, not the copy, in errors."""

    def as_backup(text: str) -> str:
        # The open's advice (move the live file aside) is not what a refused restore needs.
        text = text.replace(". " + RESET_INSTRUCTION.format(name=copy.name), "")
        return text.replace(str(copy), str(backup)).replace(copy.name, backup.name)

    try:
        violations = verify_file(copy)
    except (IncompatibleStateError, UnsafeStateHomeError) as error:
        raise type(error)(f"{as_backup(str(error))}; nothing was restored") from None
    if violations:
        shown = "; ".join(f"{v.code}: {v.detail}" for v in violations[:3])
        more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
        raise RestoreError(
            f"{backup} does not verify, so it was not restored: {shown}{more}. Nothing was "
            f"changed; `piwf state verify {backup}` lists every violation"
        )


def _stamp(now_ms: int) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_ms // 1000))


def _move_aside(database: Path, sources: list[Path], stamp: str) -> tuple[MovedFile, ...]:
    """Rename the family under one free ``replaced-<stamp>`` name, the database first."""
    if not sources:
        return ()
    base = _free_name(database, stamp)
    moved = []
    for source in sources:
        suffix = source.name[len(database.name) :]
        destination = base.with_name(base.name + suffix)
        # Under the instance lock no piwf process creates these names; the check keeps a
        # rename from replacing anything another program put there.
        if destination.exists() or destination.is_symlink():
            raise RestoreError(f"{destination} appeared during the restore; run it again")
        source.rename(destination)
        destination.chmod(FILE_MODE)
        moved.append(MovedFile(source, destination))
    _fsync_directory(database.parent)
    return tuple(moved)


def _free_name(database: Path, stamp: str) -> Path:
    """Return ``<database>.replaced-<stamp>[-N]`` such that no family member name is taken."""
    for attempt in range(_MAX_NAME_ATTEMPTS):
        tail = "" if attempt == 0 else f"-{attempt + 1}"
        base = database.with_name(f"{database.name}.replaced-{stamp}{tail}")
        names = [base.with_name(base.name + suffix) for suffix in DATABASE_FAMILY]
        if not any(name.exists() or name.is_symlink() for name in names):
            return base
    raise RestoreError(f"no free name for the replaced database beside {database}")


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
