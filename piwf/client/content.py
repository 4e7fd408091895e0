"""Values a response sent by content reference: read in parts, verified, decoded, put back.

A receipt field ``x`` whose value is too large for a frame arrives as ``x_ref``, a
:class:`~piwf.protocol.payloads.ContentRef` (docs/PROTOCOL.md, "Content references")::

    RunDetail(output=None, output_ref=ContentRef{sha256, mediaType, length, scope, owner})
        │ resolve_references(detail, read)
        │     read(ref) = read_content(read_part, ref):
        │         view.content {ref, offset, length ≤ 512 KiB} ─▶ {sha256, total, offset, data}
        │         ... one part after the other until ``length`` bytes are assembled
        │         check: every part names the same digest, total and offset, and is exactly as
        │                long as asked; the whole has the reference's length and SHA-256;
        │                it decodes as its media type (canonical JSON or UTF-8 text)
        ▼
    RunDetail(output=<the complete value>, output_ref=None)

Any failed check raises :class:`~piwf.errors.ContentMismatchError`: the caller gets the complete,
verified value or an error, never a part of one. The module does no I/O itself: ``read_part``
sends one ``view.content`` request and returns its receipt (a test may pass any function).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import CONTENT_PART_BYTES
from piwf.errors import CanonicalJsonError, ContentMismatchError
from piwf.protocol.payloads import REF_SUFFIX, ContentPart, ContentReadPayload, ContentRef

#: Sends one ``view.content`` payload and returns the receipt of its response.
ReadPart = Callable[[dict[str, Any]], Mapping[str, Any] | None]
#: Returns the complete, verified value of one reference.
ReadContent = Callable[[ContentRef], JsonValue]

M = TypeVar("M", bound=BaseModel)


def read_content(read_part: ReadPart, ref: ContentRef) -> JsonValue:
    """Return the value ``ref`` names, read part by part through ``read_part`` and verified.

    Raises :class:`ContentMismatchError` when a part or the assembled bytes do not match
    ``ref``; errors of ``read_part`` itself (a ``notFound`` for content deleted since it was
    advertised, a lost server) pass through.
    """
    data = bytearray()
    while len(data) < ref.length:  # every part adds exactly what was asked, at least 1 byte
        offset = len(data)
        wanted = min(CONTENT_PART_BYTES, ref.length - offset)
        payload = ContentReadPayload(ref=ref, offset=offset, length=wanted).to_wire()
        data += _part_bytes(read_part(payload), ref, offset, wanted)
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise ContentMismatchError(
            f"the {ref.length} bytes read for {ref.scope} {ref.owner} do not have the "
            "reference's SHA-256; read the value again"
        )
    return _decoded(bytes(data), ref)


def resolve_references(model: M, read: ReadContent, *, content_limit: int | None = None) -> M:
    """Return ``model`` with every ``x_ref`` reference replaced by its value in ``x``.

    Walks nested models and lists of models (never the JSON values inside them). With
    ``content_limit``, references to values longer than that many bytes are left in place.
    """
    fields = type(model).model_fields
    updates: dict[str, Any] = {}
    for name in fields:
        value = getattr(model, name)
        if isinstance(value, ContentRef):
            base = name.removesuffix(REF_SUFFIX)
            if base == name or base not in fields:
                continue  # not a value reference by the naming rule
            if content_limit is None or value.length <= content_limit:
                updates[base] = read(value)
                updates[name] = None
        elif isinstance(value, BaseModel):
            resolved = resolve_references(value, read, content_limit=content_limit)
            if resolved is not value:
                updates[name] = resolved
        elif isinstance(value, list):
            items = [
                resolve_references(item, read, content_limit=content_limit)
                if isinstance(item, BaseModel)
                else item
                for item in value
            ]
            if any(new is not old for new, old in zip(items, value, strict=True)):
                updates[name] = items
    return model.model_copy(update=updates) if updates else model


def _part_bytes(
    receipt: Mapping[str, Any] | None, ref: ContentRef, offset: int, wanted: int
) -> bytes:
    """The bytes of one ``view.content`` receipt, checked against what was asked for."""
    try:
        part = ContentPart.model_validate(receipt or {})
    except ValidationError:
        raise ContentMismatchError("the server sent a malformed content part") from None
    if (part.sha256, part.total, part.offset) != (ref.sha256, ref.length, offset):
        raise ContentMismatchError(
            f"the server answered a content part of another value or range (asked for "
            f"{wanted} bytes at offset {offset} of {ref.length})"
        )
    try:
        chunk = base64.b64decode(part.data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ContentMismatchError("a content part is not base64") from None
    if len(chunk) != wanted:
        raise ContentMismatchError(
            f"a content part holds {len(chunk)} bytes where {wanted} were asked for"
        )
    return chunk


def _decoded(data: bytes, ref: ContentRef) -> JsonValue:
    try:
        if ref.media_type == "application/json":
            return canonical.decode(data)
        return data.decode("utf-8")
    except (CanonicalJsonError, UnicodeDecodeError):
        raise ContentMismatchError(
            f"the referenced value is not valid {ref.media_type}; read the value again"
        ) from None
