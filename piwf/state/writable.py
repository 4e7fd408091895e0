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

The check asks the kernel (``access(2)`` with the effective ids), so it also refuses a
read-only mount, and lets root through wherever root may write.
"""

from __future__ import annotations

import os
from pathlib import Path

from piwf.errors import StateIoError

_EFFECTIVE_IDS = os.access in os.supports_effective_ids

#: The way out that always works.
_OTHER_HOME = "or set PIWF_HOME to another directory"


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
