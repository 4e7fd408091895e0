"""Digest-bound content references: values too large for one runner frame.

A runner frame is at most 1 MiB. A call payload or a response result whose frame would be
larger travels by reference instead::

    {"$content": {"sha256": "<hex of the canonical JSON bytes>", "bytes": N}}

The bytes move in parts of at most :data:`~piwf.config.CONTENT_PART_BYTES` (512 KiB, base64 in
the frame): the child writes parts with the ``content.part`` call and reads them with
``content.read``. Every assembled value is checked against its length and SHA-256 before it is
decoded, so a wrong range, a short part or a different value is refused, never used.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import CONTENT_PART_BYTES, MAX_FRAME_BYTES
from piwf.config import MAX_CONTENT_BYTES as MAX_CONTENT_BYTES  # the largest referenced value
from piwf.errors import PiwfError

#: Frames above this size send their value by reference (room left for the envelope).
INLINE_LIMIT = MAX_FRAME_BYTES - 64 * 1024


class ContentError(PiwfError):
    """A content reference or part is malformed, out of range or does not match its digest."""

    code = "protocolRejected"


def reference(data: bytes) -> dict[str, JsonValue]:
    """Return the reference of ``data`` (canonical JSON bytes)."""
    return {"$content": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}


def parse_reference(value: object) -> tuple[str, int] | None:
    """Return ``(sha256 hex, length)`` when ``value`` is a reference, else None."""
    if not isinstance(value, dict) or set(value) != {"$content"}:
        return None
    inner = value["$content"]
    if not isinstance(inner, dict) or set(inner) != {"sha256", "bytes"}:
        raise ContentError("a content reference is {sha256, bytes}")
    digest, length = inner["sha256"], inner["bytes"]
    if not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest):
        raise ContentError("a content reference needs a 64-digit sha256")
    if (
        isinstance(length, bool)
        or not isinstance(length, int)
        or not 0 <= length <= MAX_CONTENT_BYTES
    ):
        raise ContentError("a content reference has a bad length")
    return digest, length


def part(chunk: bytes, offset: int, total: int) -> dict[str, JsonValue]:
    """Return a ``content.read`` answer: ``chunk``, the bytes of a ``total``-byte value at
    ``offset`` (at most one part; the caller read only that range)."""
    if not 0 <= offset <= total or len(chunk) > CONTENT_PART_BYTES:
        raise ContentError("content offset out of range")
    next_offset = offset + len(chunk)
    if next_offset > total:
        raise ContentError("content offset out of range")
    return {
        "data": base64.b64encode(chunk).decode("ascii"),
        "nextOffset": next_offset,
        "complete": next_offset == total,
    }


def decode_part(value: Any) -> bytes:
    """Return the bytes of one ``data`` field; refuse anything over one part."""
    if not isinstance(value, str):
        raise ContentError("content data must be base64 text")
    try:
        chunk = base64.b64decode(value.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ContentError("content data is not base64") from None
    if len(chunk) > CONTENT_PART_BYTES:
        raise ContentError("a content part is larger than 512 KiB")
    return chunk


def verified_value(data: bytes, digest: str, length: int) -> JsonValue:
    """Check ``data`` against its reference and decode it as canonical JSON."""
    if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
        raise ContentError("content does not match its reference")
    return canonical.decode(data)


def _is_hex(text: str) -> bool:
    return all(char in "0123456789abcdef" for char in text)
