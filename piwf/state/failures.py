"""Turn SQLite and operating-system failures into typed, payload-free state errors.

::

    sqlite3.Error                      primary result code      typed error
      SQLITE_FULL                    ─ 13 ───────────────────►  StateFullError
      SQLITE_IOERR (any extended)    ─ 10 ───────────────────►  StateIoError
      SQLITE_READONLY, SQLITE_CANTOPEN ─ 8, 14 ──────────────►  StateIoError
      SQLITE_CORRUPT, SQLITE_NOTADB  ─ 11, 26 ───────────────►  StateCorruptError
      SQLITE_BUSY, SQLITE_LOCKED     ─ 5, 6 ─────────────────►  StateBusyError
      anything else (constraint, misuse, a bug)  ────────────►  None: the caller's own business
    OSError
      ENOSPC, EDQUOT                 ────────────────────────►  StateFullError
      anything else                  ────────────────────────►  StateIoError

A message names what failed and the reason as SQLite's result name or as ``ENAME: strerror``,
and says what to do next. It never carries the SQL, a value, a path or the original text (an
``OSError``'s text holds its file name).

Python 3.11 puts the result code on the exception (``sqlite_errorcode``); older versions and the
fault points (``faults.py`` raises a bare ``OperationalError``) only give SQLite's fixed message
text, which is matched instead.
"""

from __future__ import annotations

import errno
import os
import sqlite3

from piwf.errors import (
    StateBusyError,
    StateCorruptError,
    StateFullError,
    StateIoError,
    StateUnavailableError,
)

SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_NOTADB = 26

_NAMES = {
    SQLITE_BUSY: "SQLITE_BUSY",
    SQLITE_LOCKED: "SQLITE_LOCKED",
    SQLITE_READONLY: "SQLITE_READONLY",
    SQLITE_IOERR: "SQLITE_IOERR",
    SQLITE_CORRUPT: "SQLITE_CORRUPT",
    SQLITE_FULL: "SQLITE_FULL",
    SQLITE_CANTOPEN: "SQLITE_CANTOPEN",
    SQLITE_NOTADB: "SQLITE_NOTADB",
}

#: SQLite's own fixed messages (sqlite3_errstr) for the codes above, for errors without a code.
_MESSAGES = (
    ("database or disk is full", SQLITE_FULL),
    ("disk i/o error", SQLITE_IOERR),
    ("database disk image is malformed", SQLITE_CORRUPT),
    ("file is not a database", SQLITE_NOTADB),
    ("database is locked", SQLITE_BUSY),
    ("database table is locked", SQLITE_LOCKED),
    ("attempt to write a readonly database", SQLITE_READONLY),
    ("unable to open database file", SQLITE_CANTOPEN),
)

FULL_ADVICE = "nothing was changed; free space on that disk, then retry"
IO_ADVICE = "nothing was changed; check the disk and the state home, then retry"
CORRUPT_ADVICE = (
    "stop the server if one runs (`piwf server stop`), then restore a backup "
    "(`piwf state restore BACKUP`) or move state.sqlite aside with its -wal and -shm files"
)


def sqlite_result(error: sqlite3.Error) -> tuple[int, str] | None:
    """The primary result code of ``error`` and its most precise name, or None if unknown."""
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        primary = code & 0xFF
        name = getattr(error, "sqlite_errorname", None)
        return primary, name if isinstance(name, str) else _NAMES.get(primary, str(primary))
    text = str(error).lower()
    for message, primary in _MESSAGES:
        if message in text:
            return primary, _NAMES[primary]
    return None


def state_error_of_sqlite(error: sqlite3.Error, doing: str) -> StateUnavailableError | None:
    """The typed error for a failed SQLite call while ``doing`` (``"writing the state"``), or
    None when the failure is not about the file (a constraint, a misuse: a caller's bug)."""
    found = sqlite_result(error)
    if found is None:
        return None
    primary, name = found
    if primary == SQLITE_FULL:
        return StateFullError(f"{doing} failed: the disk is full ({name}); {FULL_ADVICE}")
    if primary in (SQLITE_IOERR, SQLITE_READONLY, SQLITE_CANTOPEN):
        return StateIoError(f"{doing} failed: an I/O error ({name}); {IO_ADVICE}")
    if primary in (SQLITE_CORRUPT, SQLITE_NOTADB):
        damaged = StateCorruptError(
            f"{doing} failed: the database is damaged ({name}); " + CORRUPT_ADVICE
        )
        # SQLite's own words about the damage ("database disk image is malformed"): fixed
        # texts of the library that never hold a value, for state verify's report.
        damaged.sqlite_message = str(error)[:200]
        return damaged
    if primary in (SQLITE_BUSY, SQLITE_LOCKED):
        return StateBusyError(f"{doing} failed: the state database stayed locked ({name})")
    return None


def os_reason(error: OSError) -> str:
    """``ENAME: strerror`` of an ``OSError`` (never its file name)."""
    number = error.errno
    if number is None:
        return type(error).__name__
    return f"{errno.errorcode.get(number, f'errno {number}')}: {os.strerror(number)}"


def state_error_of_os(error: OSError, doing: str) -> StateUnavailableError:
    """The typed error for an ``OSError`` raised while ``doing`` something with state files."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return StateFullError(f"{doing} failed: {os_reason(error)}; {FULL_ADVICE}")
    return StateIoError(f"{doing} failed: {os_reason(error)}; {IO_ADVICE}")


def state_error_of(error: BaseException, doing: str) -> StateUnavailableError | None:
    """The typed error of a SQLite or OS failure, or None for any other exception."""
    if isinstance(error, sqlite3.Error):
        return state_error_of_sqlite(error, doing)
    if isinstance(error, OSError):
        return state_error_of_os(error, doing)
    return None
