"""The ``view.content`` read: one bounded part of a value sent by content reference.

::

    request  {ref: {sha256, mediaType, length, scope, owner}, offset, length ≤ 512 KiB}
    check    the owner still holds a value under sha256 (piwf.state.content_owners), and the
             stored media type and length are the reference's       ── else notFound
             offset ≤ length                                        ── else rejected
    answer   {sha256, total, offset, data: base64 of ≤ length bytes from offset}

Each part costs one read transaction, two indexed lookups and one ranged read of the blob
(:func:`piwf.state.blobs.read_range`), so the single-threaded server loop stays responsive
while a client pulls a large value. Reads change nothing and store no receipt.
"""

from __future__ import annotations

import base64

from piwf.errors import ContentNotFoundError, ContentReferenceError
from piwf.protocol.client_v1 import Request
from piwf.protocol.payloads import ContentPart, ContentReadPayload
from piwf.server.context import ServerContext
from piwf.server.loop import Reply
from piwf.server.replies import error_response, ok, payload_of
from piwf.state import blobs, content_owners


class ContentReads:
    """Serves the parts of referenced values from the state database."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context

    def view_content(self, request: Request, reply: Reply) -> None:
        """Answer one part, ``notFound`` for a reference the owner does not hold, ``rejected``
        for an offset past the end (bad shapes are ``invalidPayload`` before any read)."""
        payload = payload_of(request, ContentReadPayload)
        ref = payload.ref
        digest = bytes.fromhex(ref.sha256)
        with self.context.db.read() as tx:
            blob = blobs.peek(tx, digest, inline_limit=-1)
            held = blob is not None and content_owners.holds(tx, ref.scope, ref.owner, digest)
            if (
                blob is None
                or not held
                or blob.media_type.value != ref.media_type
                or blob.length != ref.length
            ):
                missing = ContentNotFoundError(
                    f"the {ref.scope} this content reference names holds no value that "
                    f"matches it; read the {ref.scope} again for a current reference"
                )
                reply(error_response(request, "notFound", missing.code, str(missing)))
                return
            if payload.offset > blob.length:
                past = ContentReferenceError(
                    f"offset {payload.offset} lies past the end of the {blob.length}-byte value"
                )
                reply(error_response(request, "rejected", past.code, str(past)))
                return
            data = blobs.read_range(tx, blob, payload.offset, payload.length)
        part = ContentPart(
            sha256=ref.sha256,
            total=blob.length,
            offset=payload.offset,
            data=base64.b64encode(data).decode("ascii"),
        )
        reply(ok(request, part))
