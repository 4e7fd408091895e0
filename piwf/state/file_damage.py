"""Damage in an inactive state file (a backup), found before and without trusting SQLite.

Offline verification and restore read a file no process is using. SQLite reports a damaged file
by raising from whichever statement first touches the damage, so the opening steps (identity,
schema shape) would turn damage into "incompatible". This module reports it as ``integrity``
violations instead, in two steps:

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
import struct
from pathlib import Path
from urllib.parse import quote

from piwf.state.database import Transaction
from piwf.state.diagnostics import Violation, damage_violation, integrity_violations, is_damage

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
#: Bytes 21-23 of every SQLite header: the payload fractions, fixed at 64, 32 and 32.
_PAYLOAD_FRACTIONS = b"\x40\x20\x20"
_JOURNAL_FORMATS = (1, 2)  # 1: rollback journal, 2: WAL


def header_damage(path: Path) -> list[Violation]:
    """Return the damage the header and size of the file at ``path`` prove (empty if none).

    Raises ``OSError`` when the file cannot be read (missing, a symlink, no permission).
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


def _read_header(path: Path) -> tuple[int, bytes]:
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.fstat(descriptor).st_size, os.pread(descriptor, HEADER_BYTES, 0)
    finally:
        os.close(descriptor)


def _damage(detail: str) -> Violation:
    return Violation("integrity", detail)
