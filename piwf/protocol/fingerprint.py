"""The durable fingerprint of a request, and the receipt rule built on it.

``requestId`` names one transport attempt, so it is left out; everything else the client said
is in::

    fingerprint = sha256(canonical_json(request_wire_object - "requestId"
                                        - payload keys excluded for the operation))

For ``checkpoint.answer``, ``decision.answer`` and ``run.restart`` the payload's
``coordinatorEpoch`` is excluded as well: it belongs to one live session connection, and a retry
after reconnecting carries a new one (see
:data:`~piwf.protocol.operations.FINGERPRINT_EXCLUDED_PAYLOAD_KEYS`).

The server keys receipts by ``(clientId, idempotencyKey)`` and stores the fingerprint with them.
A later request under the same key is

- ``adopted`` when its fingerprint is the stored one (a retry with a new request id): the server
  answers with the stored receipt and changes nothing;
- ``conflict`` when it differs (another operation, run, expected revision or payload under a
  reused key): the stored receipt stays untouched.

Because the wire form is canonical, the fingerprint is a function of the message's meaning and
is the same in every process and every language that speaks canonical JSON.
"""

from __future__ import annotations

import hmac
from typing import Literal

from piwf import canonical
from piwf.protocol.client_v1 import Request
from piwf.protocol.operations import FINGERPRINT_EXCLUDED_PAYLOAD_KEYS

FINGERPRINT_BYTES = 32


def request_fingerprint(request: Request) -> bytes:
    """Return the 32-byte SHA-256 fingerprint of ``request`` without its ``requestId``.

    Raises :class:`piwf.errors.CanonicalJsonError` only when a payload built in Python holds a
    value JSON cannot carry (a parsed request always has a fingerprint).
    """
    wire = request.to_wire()
    del wire["requestId"]
    excluded = FINGERPRINT_EXCLUDED_PAYLOAD_KEYS.get(request.operation)
    if excluded:
        wire["payload"] = {
            key: value for key, value in request.payload.items() if key not in excluded
        }
    return canonical.digest(wire)


def retry_outcome(stored_fingerprint: bytes, request: Request) -> Literal["adopted", "conflict"]:
    """Classify ``request`` against the receipt stored under its ``(clientId, idempotencyKey)``.

    ``adopted``: the same command again, answer with the stored receipt. ``conflict``: the key
    was reused for another command; answer ``conflict`` and leave the stored receipt alone.
    """
    same = hmac.compare_digest(stored_fingerprint, request_fingerprint(request))
    return "adopted" if same else "conflict"
