"""Damage in an inactive state file (a backup), found before and without trusting SQLite.

Offline verification and restore read a file no process is using. Before any byte is read,
:func:`check_inactive_file` holds it to the rule of a live ``state.sqlite`` (backups are ``0600``
too), so that ``state verify`` and ``state restore`` refuse the same files with the same
message (:class:`~piwf.errors.UnsafeStateHomeError`)::

    a symlink                          -> "is a symlink; give the backup file itself"
    not a regular file (FIFO, device,  -> "is not a regular file (a FIFO)"; never opened, so a
      socket, directory)                  FIFO cannot block the reader
    more than one hard link            -> "has N hard links"
    another user's file                -> "belongs to another user"
    open to group or others            -> "has mode 0644 ...; run `chmod 600 ...`"

SQLite reports a damaged file by raising from whichever statement first touches the damage, so
the opening steps (identity, schema shape) would turn damage into "incompatible". This module
reports it as ``integrity`` violations instead, in two steps:

:func:`header_damage` reads only the 100-byte database header and the file size::

    0 bytes                               -> empty, not a state database
    no "SQLite format 3\\0" magic          -> not SQLite, or the first page is damaged
    page size not a power of two 512..64K -> damaged header
    file format / payload fraction bytes  -> damaged header
    size not a whole number of pages      -> truncated (or extended)
    fewer pages than the header records   -> truncated (when that count is valid: SQLite
                                             trusts it only while the change counter equals
                                             the version-valid-for number)

:func:`sqlite_damage` runs ``PRAGMA integrity_check`` through an immutable, read-only
connection (no -wal or -shm is created), for damage inside pages.

Reading the header with ``open()`` is safe here only because the file is inactive and this
process holds no SQLite connection to it; the server never calls this module (its files are
read through SQLite alone, testing.md §1.3).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import struct
from pathlib import Path
from urllib.parse import quote

from piwf.errors import UnsafeStateHomeError
from piwf.state.database import Transaction
from piwf.state.diagnostics import Violation, damage_violation, integrity_violations, is_damage
from piwf.state.failures import os_reason
from piwf.state.writable import file_kind

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
#: Bytes 21-23 of every SQLite header: the payload fractions, fixed at 64, 32 and 32.
_PAYLOAD_FRACTIONS = b"\x40\x20\x20"
_JOURNAL_FORMATS = (1, 2)  # 1: rollback journal, 2: WAL


def check_inactive_file(path: Path) -> None:
    """Raise :class:`~piwf.errors.UnsafeStateHomeError` unless ``path`` is a regular file of
    this user with one link and no access for group or others (see the module docstring).

    Only ``lstat`` is used: the file is never opened, so a FIFO cannot block the caller.
    """
    try:
        info = path.lstat()
    except OSError as error:
        raise _unopenable(path, error) from None
    _refuse_unsafe(path, info)


def open_inactive_file(path: Path) -> int:
    """Return a read-only descriptor of the inactive file at ``path`` (the caller closes it).

    The file is checked as :func:`check_inactive_file` does, opened without following a link
    and without blocking (``O_NONBLOCK``: a FIFO swapped in after the check cannot hang the
    open), and checked again through ``fstat``. Raises
    :class:`~piwf.errors.UnsafeStateHomeError` when a check fails or the file cannot be opened.
    """
    check_inactive_file(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        raise _unopenable(path, error) from None
    try:
        _refuse_unsafe(path, os.fstat(descriptor))
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def header_damage(path: Path) -> list[Violation]:
    """Return the damage the header and size of the file at ``path`` prove (empty if none).

    Raises :class:`~piwf.errors.UnsafeStateHomeError` for a file :func:`open_inactive_file`
    refuses.
    """
    size, header = _read_header(path)
    if size == 0:
        return [_damage("the file is empty (0 bytes); it is not a state database")]
    if len(header) < HEADER_BYTES or not header.startswith(SQLITE_MAGIC):
        return [
            _damage(
                "the file does not start with the SQLite header: it is not an SQLite "
                "database, or its header is damaged"
            )
        ]
    page_size = page_size_of(header)
    if page_size is None:
        raw = struct.unpack_from(">H", header, 16)[0]
        return [_damage(f"the SQLite header is damaged: page size field {raw} is not valid")]
    if header[18] not in _JOURNAL_FORMATS or header[19] not in _JOURNAL_FORMATS:
        return [_damage("the SQLite header is damaged: unknown file format bytes")]
    if header[21:24] != _PAYLOAD_FRACTIONS:
        return [_damage("the SQLite header is damaged: wrong payload fraction bytes")]
    if size % page_size:
        return [
            _damage(
                f"the file is {size} bytes, not a whole number of {page_size}-byte pages: "
                "it was truncated or extended"
            )
        ]
    pages = size // page_size
    recorded, change_counter, valid_for = (
        struct.unpack_from(">I", header, offset)[0] for offset in (28, 24, 92)
    )
    if recorded and change_counter == valid_for and recorded > pages:
        return [
            _damage(
                f"the header records {recorded} pages but the file holds {pages}: it was truncated"
            )
        ]
    return []


def sqlite_damage(path: Path) -> list[Violation]:
    """Return what ``PRAGMA integrity_check`` finds in the inactive file at ``path``.

    The connection is immutable and read-only: nothing is written and no -wal or -shm appears.
    Errors other than damage (the file vanished, permissions) propagate.
    """
    uri = f"file:{quote(str(path))}?mode=ro&immutable=1"
    connection = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        return integrity_violations(Transaction(connection, 0, writable=False))
    except sqlite3.DatabaseError as error:
        if not is_damage(error):
            raise
        return [damage_violation(error)]
    finally:
        connection.close()


def page_size_of(header: bytes) -> int | None:
    """Return the page size a database header records, or None when the field is invalid."""
    raw = struct.unpack_from(">H", header, 16)[0]
    size = 65536 if raw == 1 else raw
    if size < 512 or size & (size - 1):
        return None
    return int(size)


def _refuse_unsafe(path: Path, info: os.stat_result) -> None:
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        raise UnsafeStateHomeError(f"{path} is a symlink; give the backup file itself")
    if not stat.S_ISREG(mode):
        raise UnsafeStateHomeError(
            f"{path} is not a regular file ({file_kind(mode)}); give a backup file, as "
            "`piwf state backup DEST` writes"
        )
    if info.st_nlink > 1:
        raise UnsafeStateHomeError(
            f"{path} has {info.st_nlink} hard links; piwf needs a file with one: copy it and "
            "give the copy"
        )
    if info.st_uid != os.geteuid():
        raise UnsafeStateHomeError(
            f"{path} belongs to another user (uid {info.st_uid}); copy it to a file of your own"
        )
    if stat.S_IMODE(mode) & 0o077:
        raise UnsafeStateHomeError(
            f"{path} has mode {stat.S_IMODE(mode):04o}, open to other users (state files and "
            f"backups are 0600); run `chmod 600 {path}`, then try again"
        )


def _unopenable(path: Path, error: OSError) -> UnsafeStateHomeError:
    return UnsafeStateHomeError(
        f"cannot open {path}: {os_reason(error)}; give a regular file of your own"
    )


def _read_header(path: Path) -> tuple[int, bytes]:
    descriptor = open_inactive_file(path)
    try:
        return os.fstat(descriptor).st_size, os.pread(descriptor, HEADER_BYTES, 0)
    finally:
        os.close(descriptor)


def _damage(detail: str) -> Violation:
    return Violation("integrity", detail)
