"""Content-addressed blobs: digest, media type, length and bytes are verified."""

from __future__ import annotations

import hashlib

import pytest

from piwf.errors import BlobConflictError, BlobMissingError, BlobTypeError, CanonicalJsonError
from piwf.state import StateDatabase, blobs
from piwf.state.enums import MediaType


def blob_count(db: StateDatabase) -> int:
    with db.read() as tx:
        return int(tx.scalar("SELECT count(*) FROM blobs"))


# conformance: S8
def test_json_blobs_are_stored_once_under_their_digest(db: StateDatabase) -> None:
    with db.write() as tx:
        first = blobs.put_json(tx, {"b": 1, "a": [True, None]})
        second = blobs.put_json(tx, {"a": [True, None], "b": 1})
    assert first == second == hashlib.sha256(b'{"a":[true,null],"b":1}').digest()
    assert blob_count(db) == 1
    with db.read() as tx:
        assert blobs.read_json(tx, first) == {"a": [True, None], "b": 1}


# conformance: S8
def test_text_blobs_round_trip(db: StateDatabase) -> None:
    with db.write() as tx:
        digest = blobs.put_text(tx, "línea\n")
    with db.read() as tx:
        assert blobs.read_text(tx, digest) == "línea\n"
        row = tx.one("SELECT media_type, byte_length FROM blobs WHERE blob_hash = ?", (digest,))
    assert row is not None
    assert tuple(row) == ("text/plain", len("línea\n".encode()))


# conformance: S8
def test_same_bytes_with_another_media_type_conflict(db: StateDatabase) -> None:
    with db.write() as tx:
        blobs.put_text(tx, '{"a":1}')
    with pytest.raises(BlobConflictError), db.write() as tx:
        blobs.put_json(tx, {"a": 1})
    assert blob_count(db) == 1


# conformance: S8
def test_other_bytes_stored_under_a_digest_are_a_conflict(db: StateDatabase) -> None:
    content = b'{"a":1}'
    digest = hashlib.sha256(content).digest()
    with db.write() as tx:  # plant a corrupt row under the digest of `content`
        tx.execute(
            "INSERT INTO blobs VALUES (?, 'application/json', 7, ?, 0)", (digest, b'{"a":2}')
        )
    with pytest.raises(BlobConflictError, match="conflict"), db.write() as tx:
        blobs.put_bytes(tx, content, MediaType.JSON)


# conformance: S8
def test_a_declared_digest_must_match_the_bytes(db: StateDatabase) -> None:
    with pytest.raises(BlobConflictError, match="declared digest"), db.write() as tx:
        blobs.put_bytes(tx, b'"x"', MediaType.JSON, expected_digest=b"\0" * 32)
    assert blob_count(db) == 0


def test_json_blobs_must_be_canonical(db: StateDatabase) -> None:
    with pytest.raises(CanonicalJsonError), db.write() as tx:
        blobs.put_bytes(tx, b'{ "a": 1 }', MediaType.JSON)
    with pytest.raises(CanonicalJsonError), db.write() as tx:
        blobs.put_json(tx, float("nan"))
    assert blob_count(db) == 0


def test_text_blobs_must_be_utf8(db: StateDatabase) -> None:
    with pytest.raises(BlobTypeError), db.write() as tx:
        blobs.put_bytes(tx, b"\xff", MediaType.TEXT)
    with pytest.raises(BlobTypeError), db.write() as tx:
        blobs.put_text(tx, "\ud800")


def test_reads_check_the_media_type(db: StateDatabase) -> None:
    with db.write() as tx:
        text = blobs.put_text(tx, "an error message")
        value = blobs.put_json(tx, [1])
    with db.read() as tx:
        with pytest.raises(BlobTypeError, match="text/plain"):
            blobs.read_json(tx, text)
        with pytest.raises(BlobTypeError, match="application/json"):
            blobs.read_text(tx, value)
        with pytest.raises(BlobMissingError):
            blobs.read_json(tx, b"\1" * 32)
