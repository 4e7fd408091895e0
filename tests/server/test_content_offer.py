"""The inline-or-reference decision of one response (a real state database, no server)."""

from __future__ import annotations

import hashlib

import pytest

from piwf import canonical
from piwf.errors import BlobMissingError, BlobTypeError
from piwf.protocol.payloads import INLINE_CONTENT_BYTES, ContentRef
from piwf.server.content_offer import ContentOffer
from piwf.state import StateDatabase, blobs


def json_of_length(length: int) -> str:
    """A JSON string value whose canonical encoding is exactly ``length`` bytes."""
    return "x" * (length - 2)


def put_json(db: StateDatabase, value: object) -> bytes:
    with db.write() as tx:
        return blobs.put_json(tx, value)


def put_text(db: StateDatabase, text: str) -> bytes:
    with db.write() as tx:
        return blobs.put_text(tx, text)


def test_a_value_at_the_threshold_is_inline_and_one_byte_more_is_a_reference(
    db: StateDatabase,
) -> None:
    at_limit = json_of_length(INLINE_CONTENT_BYTES)
    above = json_of_length(INLINE_CONTENT_BYTES + 1)
    small, large = put_json(db, at_limit), put_json(db, above)
    with db.read() as tx:
        offer = ContentOffer(tx)
        inline = offer.json("run", "run-1", small)
        referenced = offer.json("run", "run-1", large)
        nothing = offer.json("run", "run-1", None)
    assert (inline.value, inline.ref) == (at_limit, None)
    assert referenced.value is None
    assert referenced.ref == ContentRef(
        sha256=large.hex(),
        media_type="application/json",
        length=INLINE_CONTENT_BYTES + 1,
        scope="run",
        owner="run-1",
    )
    assert (nothing.value, nothing.ref) == (None, None)


def test_text_is_measured_as_the_frame_carries_it(db: StateDatabase) -> None:
    # 4,000 control characters are 4,000 stored bytes but 24,000 once JSON-escaped.
    escaped = "\x01" * 4000
    plain = "é" * 4000
    escaped_digest, plain_digest = put_text(db, escaped), put_text(db, plain)
    with db.read() as tx:
        offer = ContentOffer(tx)
        assert offer.text("run", "run-1", plain_digest).value == plain
        found = offer.text("run", "run-1", escaped_digest)
    assert found.value is None
    assert found.ref is not None
    assert (found.ref.media_type, found.ref.length) == ("text/plain", 4000)


def test_the_response_budget_sends_later_values_by_reference(db: StateDatabase) -> None:
    digests = [put_json(db, json_of_length(10_000) + str(n)) for n in range(4)]
    with db.read() as tx:
        offer = ContentOffer(tx, budget=25_000)
        offered = [offer.json("resource", "mr-1", digest) for digest in digests]
    assert [item.ref is None for item in offered] == [True, True, False, False]
    assert offer.budget == 25_000 - 2 * 10_001
    assert all(item.ref is not None and item.ref.owner == "mr-1" for item in offered[2:])


def test_a_missing_blob_or_another_media_type_is_an_error(db: StateDatabase) -> None:
    text = put_text(db, "plain words")
    with db.read() as tx:
        offer = ContentOffer(tx)
        with pytest.raises(BlobTypeError):
            offer.json("run", "run-1", text)
        with pytest.raises(BlobMissingError):
            offer.text("run", "run-1", hashlib.sha256(b"absent").digest())


def test_an_inline_value_is_the_stored_value(db: StateDatabase) -> None:
    value = {"list": [1, 2.5, None, True], "text": "é\n"}
    digest = put_json(db, value)
    with db.read() as tx:
        assert ContentOffer(tx).json("run", "run-1", digest).value == value
    assert digest == canonical.digest(value)
