"""Which stored values of one response travel inline, and which by content reference.

A client frame is at most 1 MiB, but a run's output, a prompt or a resource status can be far
larger. Every response that carries stored values builds them through one
:class:`ContentOffer`::

    digest ──peek──▶ (media type, length, bytes only if small)
        encoded ≤ INLINE_CONTENT_BYTES and within the response's budget ──▶ inline value
        otherwise ──▶ ContentRef {sha256, mediaType, length, scope, owner}

Deciding costs one indexed lookup per value: a large value's bytes are never read, hashed or
decoded here (blobs are content addressed, so the stored digest *is* the reference), and JSON
decoding of a large value belongs to the client. The budget bounds the inline bytes of the
whole response, so a long list of medium values cannot push it past the frame limit.

A list of items whose own fields are large (a decision's choices, a step) is cut with
:func:`within_budget`: it ends early once its encoded items reach a byte budget, always
keeping its first item, and the response says how many there are in all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import BlobMissingError, BlobTypeError
from piwf.protocol.payloads import (
    INLINE_CONTENT_BYTES,
    RESPONSE_INLINE_BUDGET,
    ContentRef,
    ContentScope,
    WireModel,
)
from piwf.state import Transaction, blobs
from piwf.state.enums import MediaType

V = TypeVar("V")
M = TypeVar("M", bound=WireModel)


@dataclass(frozen=True)
class Offered(Generic[V]):
    """One value as a response carries it: inline (``ref`` None) or by reference."""

    value: V | None
    ref: ContentRef | None


class ContentOffer:
    """The inline-or-reference decisions of one response, inside its read transaction."""

    def __init__(
        self,
        tx: Transaction,
        *,
        value_limit: int = INLINE_CONTENT_BYTES,
        budget: int = RESPONSE_INLINE_BUDGET,
    ) -> None:
        self.tx = tx
        self.value_limit = value_limit
        self.budget = budget

    def json(self, scope: ContentScope, owner: str, digest: bytes | None) -> Offered[JsonValue]:
        """The JSON value stored under ``digest`` (None: no value), inline or by reference."""
        blob = self._peek(digest, MediaType.JSON)
        if blob is None:
            return Offered(None, None)
        if blob.content is not None and self._fits(len(blob.content)):
            return Offered(canonical.decode(blob.content), None)
        return Offered(None, _reference(blob, scope, owner))

    def text(self, scope: ContentScope, owner: str, digest: bytes | None) -> Offered[str]:
        """The text stored under ``digest`` (None: no text), inline or by reference.

        Text is measured as the frame carries it: JSON escaping can make it longer.
        """
        blob = self._peek(digest, MediaType.TEXT)
        if blob is None:
            return Offered(None, None)
        if blob.content is not None:
            text = blob.content.decode("utf-8")
            if self._fits(len(canonical.encode(text))):
                return Offered(text, None)
        return Offered(None, _reference(blob, scope, owner))

    def _peek(self, digest: bytes | None, media_type: MediaType) -> blobs.StoredBlob | None:
        if digest is None:
            return None
        limit = min(self.value_limit, self.budget)
        blob = blobs.peek(self.tx, digest, inline_limit=limit)
        if blob is None:
            raise BlobMissingError(f"no blob stored under {digest.hex()[:16]}")
        if blob.media_type is not media_type:
            raise BlobTypeError(
                f"blob {digest.hex()[:16]} is {blob.media_type.value}, not {media_type.value}"
            )
        return blob

    def _fits(self, encoded_length: int) -> bool:
        """Take ``encoded_length`` bytes from the budget if the value may go inline."""
        if encoded_length > self.value_limit or encoded_length > self.budget:
            return False
        self.budget -= encoded_length
        return True


def _reference(blob: blobs.StoredBlob, scope: ContentScope, owner: str) -> ContentRef:
    return ContentRef(
        sha256=blob.digest.hex(),
        media_type=blob.media_type.value,
        length=blob.length,
        scope=scope,
        owner=owner,
    )


def within_budget(items: Iterable[M], budget: int) -> list[M]:
    """The leading ``items`` whose encoded forms together take at most ``budget`` bytes, and
    always the first one. ``items`` is consumed lazily: of those left out only the first is
    built (to be measured), so the rest take no inline budget from the response's offer."""
    kept: list[M] = []
    used = 0
    for item in items:
        size = len(item.model_dump_json(by_alias=True, exclude_none=True).encode())
        if kept and used + size > budget:
            break
        kept.append(item)
        used += size
    return kept
