"""Refuse a state directory or state file this user cannot write, before anything touches it.

SQLite opens a file it may not write read-only without saying so, and a directory it may not
write leaves it no place for the ``-wal`` and ``-shm`` files: the first pragma then fails with
``SQLITE_READONLY`` or ``SQLITE_CANTOPEN``, naming no path, and reading a WAL-mode file can
leave a ``-wal`` and ``-shm`` with the file's own read-only mode beside it, in the way of the
next start. A writer checks first, so the error names the path and the fix and nothing is
created::

    a directory (the home, server/)   not writable or not searchable  ->  StateIoError
    state.sqlite, -wal, -shm          present and not writable        ->  StateIoError
                                      (naming the owner when it is another user)
    state.sqlite                      a symlink, not a regular file, hard-linked, another
                                      user's or open to group/others  ->  UnsafeStateHomeError

Each refusal names the path and what to do about it.

The check asks the kernel (``access(2)`` with the effective ids), so it also refuses a
read-only mount, and lets root through wherever root may write.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from piwf.errors import StateIoError, UnsafeStateHomeError

_EFFECTIVE_IDS = os.access in os.supports_effective_ids

#: The way out that always works.
_OTHER_HOME = "or set PIWF_HOME to another directory"

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISREG, "a file"),
)


def file_kind(mode: int) -> str:
    """Name the kind of file ``mode`` (an ``lstat`` mode) describes: "a directory", "a FIFO"..."""
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


def refuse_unsafe_state_file(path: Path, info: os.stat_result) -> None:
    """Raise :class:`UnsafeStateHomeError` unless ``info`` (the ``lstat`` of the state database
    ``path``) is a private regular file of this user with one link; the message names the path
    and what to do. Nothing is changed: piwf never chmods, chowns or unlinks it."""
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        raise UnsafeStateHomeError(
            f"{path} is a symlink; piwf opens only a real file: move the link away and put the"
            f" file itself there (`piwf state restore BACKUP` installs a backup), {_OTHER_HOME}"
        )
    if not stat.S_ISREG(mode):
        raise UnsafeStateHomeError(
            f"{path} is not a regular file ({file_kind(mode)}); move it away, {_OTHER_HOME}"
        )
    if info.st_nlink > 1:
        raise UnsafeStateHomeError(
            f"{path} has {info.st_nlink} hard links; piwf needs a file with one: remove the other"
            f" links to it, {_OTHER_HOME}"
        )
    user = os.geteuid()
    if info.st_uid != user:
        raise UnsafeStateHomeError(
            f"{path} is not this user's (uid {user}): it belongs to uid {info.st_uid}; give it to"
            f" this user (`chown {user} {path}` as root), {_OTHER_HOME}"
        )
    if stat.S_IMODE(mode) & 0o077:
        raise UnsafeStateHomeError(
            f"{path} has mode {stat.S_IMODE(mode):04o}; run `chmod 600 {path}`"
        )


def refuse_unwritable_dir(path: Path, what: str = "the state home") -> None:
    """Raise :class:`StateIoError` unless this user may create and remove files in ``path``
    (an existing directory). The message calls it ``what``, names it and says what to do."""
    if os.access(path, os.W_OK | os.X_OK, effective_ids=_EFFECTIVE_IDS):
        return
    raise StateIoError(
        f"{what} {path} is not writable by this user (uid {os.geteuid()})"
        f"{_fix(path, 'chmod 700')}. Nothing was changed"
    )


def refuse_unwritable_state(database: Path) -> None:
    """Raise :class:`StateIoError` unless this user may write the state database's directory
    and every one of ``database``, its ``-wal`` and its ``-shm`` that exists."""
    refuse_unwritable_dir(database.parent)
    for path in (database, *(database.with_name(database.name + s) for s in ("-wal", "-shm"))):
        if not path.exists() or os.access(path, os.W_OK, effective_ids=_EFFECTIVE_IDS):
            continue
        raise StateIoError(
            f"{path} is not writable by this user (uid {os.geteuid()})"
            f"{_fix(path, 'chmod 600')}. Nothing was changed"
        )


def _fix(path: Path, chmod: str) -> str:
    """What to do about ``path``: ``chmod`` it when this user owns it, else have root give it
    to this user; or use another home."""
    user = os.geteuid()
    try:
        owner = path.stat().st_uid
    except OSError:
        owner = user
    if owner == user:
        return f"; make it writable (`{chmod} {path}`), {_OTHER_HOME}"
    return (
        f": it belongs to uid {owner}; give it to this user (`chown {user} {path}` as root),"
        f" {_OTHER_HOME}"
    )
