"""Refuse a ``-wal`` that provably belongs to another database, before SQLite reads it.

SQLite pairs a database with whatever ``<name>-wal`` lies beside it: the first connection
replays its committed frames over the file's pages, and the next checkpoint writes them into
the file for good. A WAL left by another database (typically: a backup copied over
``state.sqlite`` while the crashed server's WAL stayed beside it) is mixed in silently.
:func:`refuse_foreign_wal` reads the WAL without SQLite (fileformat2.html §4)::

    WAL header (32 bytes, big-endian)         frame header (24 bytes) + one page
      0  magic 0x377f0682 | 0x377f0683          0  page number
      4  format version 3007000                 4  database size after a commit, else 0
      8  page size                              8  salt-1, salt-2 (must equal the header's)
     12  checkpoint sequence                   16  checksum-1, checksum-2 (cumulative over
     16  salt-1, salt-2                            frame header bytes 0-7 and the page,
     24  checksum-1, checksum-2 (of bytes 0-23)     chained from the previous frame)

and counts the frames SQLite would apply: valid frames (salts and checksum chain) up to the
last commit frame. A WAL without any is harmless (SQLite ignores it) and is left alone. With
committed frames, the WAL is refused (:class:`ForeignWalError`, nothing changed) when it
provably was not written for this file:

- the database file is empty (SQLite would delete the WAL, and piwf would create a new
  database over the committed state);
- its page size differs from the database's;
- the database header records a rollback journal (as every ``piwf state backup`` does): SQLite
  appends WAL frames only after the header records WAL mode, and leaving WAL mode checkpoints
  and deletes the WAL;
- its newest committed copy of page 1 disagrees with the database on a header field that never
  changes in a piwf database's life (page size, file format, payload fractions, text encoding;
  ``user_version`` and ``application_id`` once the file has them: a new database's WAL holds
  the transaction that sets them), or records an older schema cookie than the file (the
  cookie only grows, and the file holds no page newer than the WAL's).

Most WALs are judged without a page checksum (:func:`_no_outcome_is_foreign`): the frames SQLite
applies are a prefix of those whose salts match the header's, and the checks above depend on
that prefix only through its newest copy of page 1. When the file-level checks pass and every
such copy does, no prefix can be foreign, so the checksum chain (0.1 s of Python for a WAL of
1,000 pages) is walked only when a copy or the file itself looks foreign.

The database file is read before the WAL and its inode, size and mtime compared after: a file
that changed meanwhile is in use by a writer, which paired the two itself, and is not judged
(so a concurrent open never misreads a writer's switch to WAL mode as proof).

What cannot be told apart is written down in docs/STATE.md: SQLite records no identity of the
WAL generation in the database file, so a WAL-mode copy of a piwf database beside the WAL of
another piwf database (or of a later state of itself) passes every check above.

The WAL is read with plain ``open()``: SQLite takes no POSIX locks on the ``-wal`` file, so
closing it cannot drop another connection's locks. The database header is read through an
immutable SQLite connection for the pragma fields, and with ``open()`` for its journal-mode
bytes only when no descriptor of this process refers to the file (``close()`` drops every POSIX
lock the process holds on a file, testing.md §1.3); when one does, a connection of this process
already has the file open, so it was paired (and checked) before.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from piwf.errors import IncompatibleStateError, UnsafeStateHomeError

WAL_HEADER = struct.Struct(">8I")
FRAME_HEADER = struct.Struct(">6I")
#: The WAL magic; its low bit says whether checksums read the data as big-endian words.
WAL_MAGIC_LITTLE = 0x377F0682
WAL_MAGIC_BIG = 0x377F0683
WAL_FORMAT_VERSION = 3007000
#: Header bytes 18-23 of a database in WAL mode: format versions 2 and 2, no reserved bytes
#: (piwf never sets any), payload fractions 64, 32, 32.
_WAL_MODE_BYTES = 2
_MASK = 0xFFFFFFFF


class ForeignWalError(IncompatibleStateError):
    """The ``-wal`` beside the database was written for another database; nothing changed."""

    code = "foreignWal"


@dataclass(frozen=True)
class WalSummary:
    """What SQLite would apply from a WAL: its page size, the number of frames up to the last
    commit, and the first 100 bytes of the newest committed page 1 (None if no commit wrote
    page 1)."""

    page_size: int
    committed_frames: int
    newest_page_one: bytes | None


@dataclass(frozen=True)
class MainFacts:
    """The database file's side of the pairing, read without its WAL."""

    byte_length: int
    page_size: int
    schema_cookie: int
    user_version: int
    application_id: int
    encoding: int
    #: Header byte 19 (1: rollback journal, 2: WAL), or None when it could not be read safely.
    journal_format: int | None


def refuse_foreign_wal(database: Path) -> None:
    """Raise :class:`ForeignWalError` when the ``-wal`` beside ``database`` provably belongs to
    another database (see the module docstring); return when there is none, when it holds no
    committed frame, or when nothing proves it foreign. Raises
    :class:`~piwf.errors.UnsafeStateHomeError` for a ``-wal`` that is a symlink or not a
    regular file (SQLite would follow it). Reads only; creates and changes nothing.
    """
    wal = database.with_name(database.name + "-wal")
    try:
        info = wal.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeStateHomeError(f"{wal} is not a regular file; piwf opens only real files")
    # The file first, then the WAL: a live writer can only make the WAL newer than the facts.
    # If the file itself changed meanwhile, a writer has the pair open (and paired them
    # itself, first writing page 1 and the WAL-mode header, then frames): nothing to judge.
    before = _identity(database)
    facts = read_main_facts(database)
    if facts is None:
        return  # not a readable SQLite file: the identity check that follows says so
    if _no_outcome_is_foreign(wal, facts):
        return
    summary = read_wal(wal)
    if summary is None or summary.committed_frames == 0 or _identity(database) != before:
        return
    reason = foreign_reason(facts, summary)
    if reason is not None:
        raise ForeignWalError(
            f"{wal.name} holds {summary.committed_frames} committed frame(s) that were not "
            f"written for {database.name}: {reason}. SQLite would mix them into the database. "
            f"Nothing was changed: move {wal.name} (and {database.name}-shm) out of "
            f"{database.parent} if {database.name} is the file you want, or restore a backup "
            "with `piwf state restore BACKUP`, which moves the old files aside."
        )


def foreign_reason(facts: MainFacts, wal: WalSummary) -> str | None:
    """Return why ``wal`` cannot belong to the file ``facts`` describes, or None."""
    if facts.byte_length == 0:
        return "the database file is empty"
    if wal.page_size != facts.page_size:
        return f"its page size is {wal.page_size}, the database's is {facts.page_size}"
    if facts.journal_format == 1:
        return "the database file records a rollback journal, so it never wrote a WAL"
    page_one = wal.newest_page_one
    if page_one is None:
        return None
    header_page_size = struct.unpack_from(">H", page_one, 16)[0]
    fixed = {
        "page size": (65536 if header_page_size == 1 else header_page_size, facts.page_size),
        "file format": (page_one[18], _WAL_MODE_BYTES),
        "payload fractions": (page_one[21:24], b"\x40\x20\x20"),
        "text encoding": (_u32(page_one, 56), facts.encoding),
    }
    # Set once, when piwf initialises the file (the WAL of a new database holds that first
    # transaction while the file still has zeros): only a value already set is fixed.
    fixed.update(
        (field, (_u32(page_one, offset), value))
        for field, offset, value in (
            ("user_version", 60, facts.user_version),
            ("application_id", 68, facts.application_id),
        )
        if value != 0
    )
    for field, (found, wanted) in fixed.items():
        if found != wanted:
            return f"its copy of page 1 records another {field}"
    if _u32(page_one, 40) < facts.schema_cookie:
        return "its copy of page 1 is older than the database file (smaller schema cookie)"
    return None


@dataclass(frozen=True)
class _WalHeader:
    """The fields of a valid WAL header that the frames after it are read against."""

    page_size: int
    salt_1: int
    salt_2: int
    big_endian: bool
    #: The header's checksum: the running checksum the first frame's continues.
    checksum: tuple[int, int]


def _valid_header(header: bytes) -> _WalHeader | None:
    """Parse a WAL's first 32 bytes; None when SQLite would ignore the WAL (too short, another
    magic or format version, an impossible page size, or a header checksum that does not
    match)."""
    if len(header) < WAL_HEADER.size:
        return None
    magic, version, page_size, _, salt_1, salt_2, sum_1, sum_2 = WAL_HEADER.unpack(header)
    if magic not in (WAL_MAGIC_LITTLE, WAL_MAGIC_BIG) or version != WAL_FORMAT_VERSION:
        return None
    if page_size < 512 or page_size > 65536 or page_size & (page_size - 1):
        return None
    big_endian = magic == WAL_MAGIC_BIG
    if _checksum(header[:24], 0, 0, big_endian) != (sum_1, sum_2):
        return None
    return _WalHeader(page_size, salt_1, salt_2, big_endian, (sum_1, sum_2))


def _no_outcome_is_foreign(path: Path, facts: MainFacts) -> bool:
    """Return True when no prefix of the WAL that SQLite could apply is foreign to ``facts``,
    reading only the frame headers and the page-1 copies, never a checksum of a page.

    :func:`read_wal` checks every frame's checksum (about 0.1-0.2 ms a page in Python, so
    0.1-0.2 s for a WAL near its checkpoint size of 1,000 pages) only to find where the
    frames SQLite applies end. Those frames are a prefix of the frames whose salts match the
    header's, and :func:`foreign_reason` depends on that prefix only through the newest page-1
    copy in it (or none). So when the file-level reasons do not apply and every page-1 copy
    in a salt-matching frame passes, the verdict is "not foreign" wherever the checksums end.
    False means: read the WAL fully; a False here never refuses anything by itself.
    """
    with open(path, "rb", buffering=0) as wal:
        header = _valid_header(wal.read(WAL_HEADER.size))
        if header is None:
            return True  # SQLite ignores a WAL whose header is invalid
        page_size, salt_1, salt_2 = header.page_size, header.salt_1, header.salt_2
        if foreign_reason(facts, WalSummary(page_size, 1, None)) is not None:
            return False  # refused if any frame is committed: that takes the checksums
        descriptor = wal.fileno()
        offset = WAL_HEADER.size
        while True:
            frame_header = os.pread(descriptor, FRAME_HEADER.size, offset)
            if len(frame_header) < FRAME_HEADER.size:
                return True
            page, _, frame_salt_1, frame_salt_2, _, _ = FRAME_HEADER.unpack(frame_header)
            if page == 0 or (frame_salt_1, frame_salt_2) != (salt_1, salt_2):
                return True
            if page == 1:
                page_one = os.pread(descriptor, 100, offset + FRAME_HEADER.size)
                if len(page_one) < 100:
                    return True  # a torn last frame: SQLite applies nothing of it
                if foreign_reason(facts, WalSummary(page_size, 1, page_one)) is not None:
                    return False
            offset += FRAME_HEADER.size + page_size


def read_wal(path: Path) -> WalSummary | None:
    """Parse the WAL at ``path`` as SQLite's recovery does; None when its header is invalid."""
    with open(path, "rb") as wal:
        header = _valid_header(wal.read(WAL_HEADER.size))
        if header is None:
            return None
        page_size, salt_1, salt_2 = header.page_size, header.salt_1, header.salt_2
        big_endian = header.big_endian
        running = header.checksum
        frames = committed = 0
        pending_page_one: bytes | None = None
        newest_page_one: bytes | None = None
        frame_size = FRAME_HEADER.size + page_size
        while True:
            frame = wal.read(frame_size)
            if len(frame) < frame_size:
                break
            page, commit_size, frame_salt_1, frame_salt_2, check_1, check_2 = (
                FRAME_HEADER.unpack_from(frame)
            )
            if page == 0 or (frame_salt_1, frame_salt_2) != (salt_1, salt_2):
                break
            running = _checksum(frame[:8], *running, big_endian)
            running = _checksum(frame[FRAME_HEADER.size :], *running, big_endian)
            if running != (check_1, check_2):
                break
            frames += 1
            if page == 1:
                pending_page_one = frame[FRAME_HEADER.size : FRAME_HEADER.size + 100]
            if commit_size:
                committed = frames
                newest_page_one = pending_page_one or newest_page_one
                pending_page_one = None
    return WalSummary(page_size, committed, newest_page_one)


def read_main_facts(database: Path) -> MainFacts | None:
    """Read the database file's header fields without its WAL; None if SQLite cannot read it."""
    info = database.stat()
    if info.st_size == 0:
        return MainFacts(0, 0, 0, 0, 0, 0, None)
    uri = f"file:{quote(str(database))}?mode=ro&immutable=1"
    probe = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        values = [
            probe.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("page_size", "schema_version", "user_version", "application_id")
        ]
        encoding = probe.execute("PRAGMA encoding").fetchone()[0]
    except sqlite3.DatabaseError:
        return None
    finally:
        probe.close()
    encodings = {"UTF-8": 1, "UTF-16le": 2, "UTF-16be": 3}
    return MainFacts(
        byte_length=info.st_size,
        page_size=values[0],
        schema_cookie=values[1],
        user_version=values[2],
        application_id=values[3],
        encoding=encodings.get(encoding, 0),
        journal_format=_journal_format(database, info),
    )


def _identity(path: Path) -> tuple[int, int, int]:
    """Inode, size and modification time: what changes when anyone writes the file."""
    info = path.stat()
    return info.st_ino, info.st_size, info.st_mtime_ns


def _journal_format(database: Path, info: os.stat_result) -> int | None:
    """Return header byte 19, read with ``open()`` only when no descriptor of this process
    refers to the file (so closing it cannot drop a connection's locks); else None."""
    if _open_in_this_process(info):
        return None
    descriptor = os.open(database, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        header = os.pread(descriptor, 20, 0)
    finally:
        os.close(descriptor)
    return header[19] if len(header) == 20 else None


def _open_in_this_process(info: os.stat_result) -> bool:
    """Return whether a descriptor of this process refers to the file ``info`` describes
    (True when that cannot be found out)."""
    try:
        descriptors = list(Path("/proc/self/fd").iterdir())
    except OSError:
        return True
    for descriptor in descriptors:
        try:
            target = descriptor.stat()
        except OSError:
            continue  # closed since the listing, or the listing's own descriptor
        if (target.st_dev, target.st_ino) == (info.st_dev, info.st_ino):
            return True
    return False


def _checksum(data: bytes, sum_1: int, sum_2: int, big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continued from a running
    ``(sum_1, sum_2)``."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    pairs = iter(words)
    for first, second in zip(pairs, pairs, strict=False):
        sum_1 = (sum_1 + first + sum_2) & _MASK
        sum_2 = (sum_2 + second + sum_1) & _MASK
    return sum_1, sum_2


def _u32(data: bytes, offset: int) -> int:
    value: int = struct.unpack_from(">I", data, offset)[0]
    return value
