"""The server's side of content references for one runner: values too large for a frame.

A :class:`ContentTransfer` belongs to one runner generation. It stores a large result as a blob
and remembers that it offered it (only offered digests may be read back), assembles the parts a
child uploads in order up to the reference's length, verifies them against the digest, and
stores them before a call may name them. See :mod:`piwf.protocol.content` for the wire form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.protocol import content
from piwf.state import StateDatabase, blobs
from piwf.state.enums import MediaType


@dataclass
class ContentTransfer:
    """Large values moving between the server and one child."""

    db: StateDatabase
    offered: set[str] = field(default_factory=set)
    received: set[str] = field(default_factory=set)
    uploads: dict[str, bytearray] = field(default_factory=dict)

    def offer(self, value: JsonValue) -> dict[str, JsonValue]:
        """Store ``value`` and return the reference the child reads it back by."""
        body = canonical.encode(value)
        with self.db.write() as tx:
            digest = blobs.put_bytes(tx, body, MediaType.JSON)
        self.offered.add(digest.hex())
        return content.reference(body)

    def read_part(self, payload: dict[str, Any]) -> dict[str, JsonValue]:
        """Answer ``content.read``: the part of an offered value at ``offset``."""
        digest, offset = payload.get("sha256"), payload.get("offset")
        if not isinstance(digest, str) or digest not in self.offered:
            raise content.ContentError("no such content offered to this runner")
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise content.ContentError("content.read needs an integer offset")
        with self.db.read() as tx:
            data = blobs.read_bytes(tx, bytes.fromhex(digest), MediaType.JSON)
        return content.part(data, offset)

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
            content.verified_value(data, digest, length)
            with self.db.write() as tx:
                blobs.put_bytes(tx, data, MediaType.JSON)
            self.received.add(digest)

    def resolve(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Return the payload itself, or the uploaded object a reference names."""
        found = content.parse_reference(payload)
        if found is None:
            return payload
        digest, length = found
        if digest not in self.received:
            raise content.ContentError("the referenced payload was not uploaded")
        with self.db.read() as tx:
            data = blobs.read_bytes(tx, bytes.fromhex(digest), MediaType.JSON)
        value = content.verified_value(data, digest, length)
        if not isinstance(value, dict):
            raise content.ContentError("a referenced payload must be an object")
        return value
