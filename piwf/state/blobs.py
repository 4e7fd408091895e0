"""Content-addressed values: canonical JSON and UTF-8 text stored once under their SHA-256.

Insertion verifies the digest, media type, byte length and bytes; a repeat of the same content
adopts the stored row, and anything else under a stored digest is a
:class:`~piwf.errors.BlobConflictError`. Reads name the media type they expect, so a text error
is never parsed as JSON (:class:`~piwf.errors.BlobTypeError`).

Large values are read without materialising them: :func:`peek` returns a blob's media type and
length (and its bytes only when they are small), and :func:`read_range` returns one slice.
SQLite's ``substr()`` on a blob loads the whole value for every call, so a 50 MiB value read
in 512 KiB parts would copy 5 GiB; an incremental blob handle (``Connection.blobopen``, Python
3.11 and later) reads only the pages of the slice and the overflow-chain links before it
(tests/bench/content_transfer.py measures both). Python 3.10 falls back to ``substr()``.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import BlobConflictError, BlobMissingError, BlobTypeError
from piwf.state.database import Transaction
from piwf.state.enums import MediaType

_INSERT = """
INSERT INTO blobs (blob_hash, media_type, byte_length, content, created_at)
VALUES (?, ?, ?, ?, ?)
ON CONFLICT (blob_hash) DO NOTHING
"""

_SELECT = "SELECT media_type, byte_length, content FROM blobs WHERE blob_hash = ?"

# The content column is only read when the CASE needs it, so a large value's overflow pages
# are never touched here.
_PEEK = """
SELECT rowid, media_type, byte_length,
       CASE WHEN byte_length <= :inline_limit THEN content END AS content
FROM blobs WHERE blob_hash = :digest
"""

_SELECT_RANGE = "SELECT substr(content, :start, :length) FROM blobs WHERE rowid = :rowid"


@dataclass(frozen=True)
class StoredBlob:
    """What :func:`peek` saw of one blob: its identity, and its bytes only when small.

    ``rowid`` locates the row for :func:`read_range` within the same transaction.
    """

    digest: bytes
    media_type: MediaType
    length: int
    content: bytes | None
    rowid: int


def put_bytes(
    tx: Transaction, content: bytes, media_type: MediaType, *, expected_digest: bytes | None = None
) -> bytes:
    """Store ``content`` and return its 32-byte digest.

    ``expected_digest``, when given, must equal the SHA-256 of ``content``. Raises
    :class:`BlobConflictError` when the digest is already stored with other bytes or another
    media type (which would mean a corrupt file or a hash collision); an exact repeat adopts.
    A new blob costs one statement; only a digest already stored is read back and compared.
    """
    digest = hashlib.sha256(content).digest()
    if expected_digest is not None and expected_digest != digest:
        raise BlobConflictError("declared digest does not match the content")
    if media_type is MediaType.JSON:
        canonical.decode(content)
    elif media_type is MediaType.TEXT:
        _check_utf8(content)
    return _store(tx, content, media_type, digest)


def _store(tx: Transaction, content: bytes, media_type: MediaType, digest: bytes) -> bytes:
    """Insert ``content`` (already checked for ``media_type``) under ``digest``, or adopt an
    exact repeat; see :func:`put_bytes`."""
    if tx.execute(_INSERT, (digest, media_type.value, len(content), content, tx.now)).rowcount:
        return digest  # stored now, these very bytes: nothing to compare
    stored = tx.one(_SELECT, (digest,))
    if stored is None:  # pragma: no cover - the insert above guarantees a row
        raise BlobMissingError(f"blob {digest.hex()[:16]} vanished inside its transaction")
    if (
        stored["media_type"] != media_type.value
        or stored["byte_length"] != len(content)
        or bytes(stored["content"]) != content
    ):
        raise BlobConflictError(f"content-addressed blob conflict under {digest.hex()[:16]}")
    return digest


def put_json(tx: Transaction, value: object) -> bytes:
    """Store the canonical JSON of ``value`` and return its digest (bytes the encoder wrote
    are canonical: they are not parsed again)."""
    return put_canonical(tx, canonical.encode(value))


def put_canonical(tx: Transaction, content: bytes) -> bytes:
    """Store ``content`` as JSON and return its digest. The caller vouches that the bytes are
    canonical JSON: :func:`piwf.canonical.encode` wrote them, or :func:`piwf.canonical.decode`
    accepted them. They are not parsed again (a large value's parse is most of its cost)."""
    return _store(tx, content, MediaType.JSON, hashlib.sha256(content).digest())


def put_text(tx: Transaction, text: str) -> bytes:
    """Store UTF-8 ``text`` and return its digest."""
    try:
        content = text.encode("utf-8")
    except UnicodeEncodeError:
        raise BlobTypeError("text contains a lone surrogate") from None
    return put_bytes(tx, content, MediaType.TEXT)


def read_bytes(tx: Transaction, digest: bytes, media_type: MediaType) -> bytes:
    """Return the stored bytes under ``digest``, which must have ``media_type``.

    Raises :class:`BlobMissingError` or :class:`BlobTypeError`.
    """
    row = tx.one(_SELECT, (digest,))
    if row is None:
        raise BlobMissingError(f"no blob stored under {digest.hex()[:16]}")
    if row["media_type"] != media_type.value:
        raise BlobTypeError(
            f"blob {digest.hex()[:16]} is {row['media_type']}, not {media_type.value}"
        )
    return bytes(row["content"])


def peek(tx: Transaction, digest: bytes, *, inline_limit: int) -> StoredBlob | None:
    """Return the media type and length of the blob under ``digest``, with its bytes when its
    length is at most ``inline_limit`` (else ``content`` is None); None when there is no blob.

    Cheap for any size: a large value's bytes are not read.
    """
    row = tx.one(_PEEK, {"digest": digest, "inline_limit": inline_limit})
    if row is None:
        return None
    content = row["content"]
    return StoredBlob(
        digest=digest,
        media_type=MediaType(row["media_type"]),
        length=row["byte_length"],
        content=None if content is None else bytes(content),
        rowid=row["rowid"],
    )


def read_range(tx: Transaction, blob: StoredBlob, offset: int, length: int) -> bytes:
    """Return up to ``length`` bytes of ``blob`` from ``offset`` (fewer at its end).

    ``blob`` comes from :func:`peek` in the same transaction. Raises ``ValueError`` for a
    negative offset or length, or an offset past the end.
    """
    if offset < 0 or length < 0 or offset > blob.length:
        raise ValueError("the range lies outside the blob")
    length = min(length, blob.length - offset)
    if length == 0:
        return b""
    if sys.version_info >= (3, 11):
        return _read_range_incremental(tx, blob.rowid, offset, length)
    return _read_range_substr(tx, blob.rowid, offset, length)


if sys.version_info >= (3, 11):

    def _read_range_incremental(tx: Transaction, rowid: int, offset: int, length: int) -> bytes:
        """One slice through an incremental blob handle (Python 3.11 and later)."""
        with tx.connection.blobopen("blobs", "content", rowid, readonly=True) as handle:
            handle.seek(offset)
            return handle.read(length)


def _read_range_substr(tx: Transaction, rowid: int, offset: int, length: int) -> bytes:
    """One slice through ``substr()``: SQLite loads the whole blob to cut it (the fallback)."""
    value = tx.scalar(_SELECT_RANGE, {"start": offset + 1, "length": length, "rowid": rowid})
    return b"" if value is None else bytes(value)


def read_json(tx: Transaction, digest: bytes) -> JsonValue:
    """Return the JSON value stored under ``digest``."""
    return canonical.decode(read_bytes(tx, digest, MediaType.JSON))


def read_text(tx: Transaction, digest: bytes) -> str:
    """Return the text stored under ``digest``."""
    return read_bytes(tx, digest, MediaType.TEXT).decode("utf-8")


def _check_utf8(content: bytes) -> None:
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        raise BlobTypeError("text blobs must be valid UTF-8") from None
