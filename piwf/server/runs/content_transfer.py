"""The server's side of content references for one runner: values too large for a frame.

A :class:`ContentTransfer` belongs to one runner generation. It stores a large result as a blob
and remembers that it offered it (only offered digests may be read back), assembles the parts a
child uploads in order up to the reference's length, verifies them against the digest, and
stores them before a call may name them. See :mod:`piwf.protocol.content` for the wire form.

A ``content.read`` reads only the bytes of its part (:func:`piwf.state.blobs.read_range`), in
its own read transaction, after checking that the stored blob is still the offered value (media
type and length; its bytes are addressed by the digest, and the child verifies the assembled
value against the reference). Reading the whole value for each part made reading one value
quadratic in its size (tests/bench/content_transfer.py, table 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import CONTENT_PART_BYTES
from piwf.protocol import content
from piwf.state import StateDatabase, blobs
from piwf.state.enums import MediaType


@dataclass
class ContentTransfer:
    """Large values moving between the server and one child."""

    db: StateDatabase
    offered: dict[str, int] = field(default_factory=dict)
    """The digests offered to this child (hex) and their lengths in bytes."""
    received: set[str] = field(default_factory=set)
    uploads: dict[str, bytearray] = field(default_factory=dict)
    decoded: dict[str, tuple[int, JsonValue]] = field(default_factory=dict)
    """Uploaded values (their length, and the value as their verification decoded it) until
    the call that names each resolves it: a large value is parsed once, not again as it is
    stored and read back."""

    def offer(self, value: JsonValue) -> dict[str, JsonValue]:
        """Store ``value`` and return the reference the child reads it back by."""
        body = canonical.encode(value)
        with self.db.write() as tx:
            digest = blobs.put_canonical(tx, body)
        self.offered[digest.hex()] = len(body)
        return content.reference(body)

    def read_part(self, payload: dict[str, Any]) -> dict[str, JsonValue]:
        """Answer ``content.read``: the part of an offered value at ``offset``.

        Raises :class:`~piwf.protocol.content.ContentError` for a digest not offered to this
        child, an offset that is not an integer or lies outside the value, and a value no longer
        stored as it was offered (pruned or changed since).
        """
        digest, offset = payload.get("sha256"), payload.get("offset")
        if not isinstance(digest, str) or digest not in self.offered:
            raise content.ContentError("no such content offered to this runner")
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise content.ContentError("content.read needs an integer offset")
        length = self.offered[digest]
        if not 0 <= offset <= length:
            raise content.ContentError("content offset out of range")
        with self.db.read() as tx:
            blob = blobs.peek(tx, bytes.fromhex(digest), inline_limit=-1)
            if blob is None or blob.media_type is not MediaType.JSON or blob.length != length:
                raise content.ContentError(
                    "the content offered to this runner is no longer stored as it was "
                    "offered (pruned or changed since)"
                )
            chunk = blobs.read_range(tx, blob, offset, CONTENT_PART_BYTES)
        return content.part(chunk, offset, length)

    def receive_part(self, payload: dict[str, Any]) -> None:
        """Take one ``content.part``; the last part is verified and stored."""
        digest, length, offset = payload.get("sha256"), payload.get("bytes"), payload.get("offset")
        found = content.parse_reference({"$content": {"sha256": digest, "bytes": length}})
        assert found is not None
        digest, length = found
        buffer = self.uploads.setdefault(digest, bytearray())
        if offset != len(buffer):
            raise content.ContentError("content parts must arrive in order")
        buffer += content.decode_part(payload.get("data"))
        if len(buffer) > length:
            raise content.ContentError("content is longer than its reference")
        if len(buffer) == length:
            data = bytes(self.uploads.pop(digest))
            value = content.verified_value(data, digest, length)  # canonical, or it raises
            with self.db.write() as tx:
                blobs.put_canonical(tx, data)
            self.received.add(digest)
            self.decoded[digest] = (length, value)

    def resolve(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Return the payload itself, or the uploaded object a reference names."""
        found = content.parse_reference(payload)
        if found is None:
            return payload
        digest, length = found
        if digest not in self.received:
            raise content.ContentError("the referenced payload was not uploaded")
        if digest in self.decoded:
            uploaded, value = self.decoded.pop(digest)
            if uploaded != length:
                raise content.ContentError("content does not match its reference")
        else:  # named a second time: read back and verified again
            with self.db.read() as tx:
                data = blobs.read_bytes(tx, bytes.fromhex(digest), MediaType.JSON)
            value = content.verified_value(data, digest, length)
        if not isinstance(value, dict):
            raise content.ContentError("a referenced payload must be an object")
        return value
