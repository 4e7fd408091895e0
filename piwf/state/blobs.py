"""Content-addressed values: canonical JSON and UTF-8 text stored once under their SHA-256.

Insertion verifies the digest, media type, byte length and bytes; a repeat of the same content
adopts the stored row, and anything else under a stored digest is a
:class:`~piwf.errors.BlobConflictError`. Reads name the media type they expect, so a text error
is never parsed as JSON (:class:`~piwf.errors.BlobTypeError`).
"""

from __future__ import annotations

import hashlib

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


def put_bytes(
    tx: Transaction, content: bytes, media_type: MediaType, *, expected_digest: bytes | None = None
) -> bytes:
    """Store ``content`` and return its 32-byte digest.

    ``expected_digest``, when given, must equal the SHA-256 of ``content``. Raises
    :class:`BlobConflictError` when the digest is already stored with other bytes or another
    media type (which would mean a corrupt file or a hash collision); an exact repeat adopts.
    """
    digest = hashlib.sha256(content).digest()
    if expected_digest is not None and expected_digest != digest:
        raise BlobConflictError("declared digest does not match the content")
    if media_type is MediaType.JSON:
        canonical.decode(content)
    elif media_type is MediaType.TEXT:
        _check_utf8(content)
    tx.execute(_INSERT, (digest, media_type.value, len(content), content, tx.now))
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
    """Store the canonical JSON of ``value`` and return its digest."""
    return put_bytes(tx, canonical.encode(value), MediaType.JSON)


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
