"""The server's ``content.read`` for a runner: each part reads only its range.

Unit tests of :mod:`piwf.server.runs.content_transfer` on a real state database; the blob
readers are wrapped (each still reads) to record what a part read. Reading the whole value for
every part made reading one value quadratic in its size.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from piwf import canonical
from piwf.config import CONTENT_PART_BYTES
from piwf.protocol import content
from piwf.server.runs.content_transfer import ContentTransfer
from piwf.state import StateDatabase, blobs

#: A value of a little more than four parts, so the last part is short.
VALUE = {"blob": "0123456789abcdef" * (4 * CONTENT_PART_BYTES // 16 + 1000)}


def record_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Wrap the blob readers; each call is recorded as (reader, offset, length)."""
    reads: list[tuple[str, int, int]] = []
    read_range, read_bytes = blobs.read_range, blobs.read_bytes

    def ranged(tx: Any, blob: blobs.StoredBlob, offset: int, length: int) -> bytes:
        reads.append(("read_range", offset, length))
        return read_range(tx, blob, offset, length)

    def whole(tx: Any, digest: bytes, media_type: Any) -> bytes:
        reads.append(("read_bytes", 0, -1))
        return read_bytes(tx, digest, media_type)

    monkeypatch.setattr(blobs, "read_range", ranged)
    monkeypatch.setattr(blobs, "read_bytes", whole)
    return reads


def read_all(transfer: ContentTransfer, digest: str) -> bytes:
    data = bytearray()
    while True:
        part = transfer.read_part({"sha256": digest, "offset": len(data)})
        data += base64.b64decode(str(part["data"]))
        assert part["nextOffset"] == len(data)
        if part["complete"] is True:
            return bytes(data)


def test_each_part_reads_only_its_range(db: StateDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    transfer = ContentTransfer(db)
    reference = transfer.offer(VALUE)
    found = content.parse_reference(reference)
    assert found is not None
    digest, length = found
    reads = record_reads(monkeypatch)

    data = read_all(transfer, digest)

    assert content.verified_value(data, digest, length) == VALUE
    offsets = range(0, length, CONTENT_PART_BYTES)
    assert reads == [("read_range", offset, CONTENT_PART_BYTES) for offset in offsets]
    assert len(reads) == 5


def test_the_end_of_the_value_is_an_empty_complete_part(db: StateDatabase) -> None:
    transfer = ContentTransfer(db)
    found = content.parse_reference(transfer.offer(VALUE))
    assert found is not None
    digest, length = found
    part = transfer.read_part({"sha256": digest, "offset": length})
    assert part == {"data": "", "nextOffset": length, "complete": True}


@pytest.mark.parametrize("offset", [-1, "0", True, None])
def test_an_offset_outside_the_value_or_not_an_integer_is_refused(
    db: StateDatabase, monkeypatch: pytest.MonkeyPatch, offset: object
) -> None:
    transfer = ContentTransfer(db)
    found = content.parse_reference(transfer.offer(VALUE))
    assert found is not None
    reads = record_reads(monkeypatch)
    with pytest.raises(content.ContentError) as refused:
        transfer.read_part({"sha256": found[0], "offset": offset})
    assert refused.value.code == "protocolRejected"
    assert reads == []


def test_an_offset_past_the_end_is_refused_without_reading(
    db: StateDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    transfer = ContentTransfer(db)
    found = content.parse_reference(transfer.offer(VALUE))
    assert found is not None
    reads = record_reads(monkeypatch)
    with pytest.raises(content.ContentError, match="out of range"):
        transfer.read_part({"sha256": found[0], "offset": found[1] + 1})
    assert reads == []


def test_content_not_offered_to_this_runner_is_refused(db: StateDatabase) -> None:
    stored = canonical.encode(VALUE)
    with db.write() as tx:
        blobs.put_json(tx, VALUE)  # stored, but offered to no one
    transfer = ContentTransfer(db)
    with pytest.raises(content.ContentError, match="no such content offered"):
        transfer.read_part({"sha256": hashlib.sha256(stored).hexdigest(), "offset": 0})


def test_a_value_pruned_since_it_was_offered_is_refused_clearly(db: StateDatabase) -> None:
    transfer = ContentTransfer(db)
    found = content.parse_reference(transfer.offer(VALUE))
    assert found is not None
    first = transfer.read_part({"sha256": found[0], "offset": 0})
    assert first["complete"] is False
    db.connection.execute("DELETE FROM blobs WHERE blob_hash = ?", (bytes.fromhex(found[0]),))
    with pytest.raises(content.ContentError, match="no longer stored as it was offered"):
        transfer.read_part({"sha256": found[0], "offset": CONTENT_PART_BYTES})


def upload(transfer: ContentTransfer, data: bytes) -> dict[str, Any]:
    """Send ``data`` as the child does (parts in order); return the reference a call names."""
    reference = content.reference(data)
    inner = reference["$content"]
    assert isinstance(inner, dict)
    for offset in range(0, len(data), CONTENT_PART_BYTES):
        chunk = data[offset : offset + CONTENT_PART_BYTES]
        transfer.receive_part(
            {**inner, "offset": offset, "data": base64.b64encode(chunk).decode("ascii")}
        )
    return reference


def test_an_uploaded_value_is_parsed_once_stored_as_sent_and_resolved(
    db: StateDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its verification's parse serves the call that names it: storing and resolving it do
    not parse it again (a large output's parses held the server's loop for seconds)."""
    data = canonical.encode({"payload": VALUE})
    parses: list[int] = []
    decode = canonical.decode

    def counted(raw: bytes | str) -> Any:
        parses.append(len(raw))
        return decode(raw)

    monkeypatch.setattr(canonical, "decode", counted)
    transfer = ContentTransfer(db)
    reference = upload(transfer, data)
    assert transfer.resolve(reference) == {"payload": VALUE}
    assert parses == [len(data)]
    with db.read() as tx:
        assert blobs.read_bytes(tx, hashlib.sha256(data).digest(), blobs.MediaType.JSON) == data
    # Named again (a retried call): read back and verified, not taken on trust.
    assert transfer.resolve(reference) == {"payload": VALUE}
    assert parses == [len(data), len(data)]


def test_an_upload_named_with_another_length_or_not_canonical_is_refused(
    db: StateDatabase,
) -> None:
    transfer = ContentTransfer(db)
    data = canonical.encode({"payload": VALUE})
    reference = upload(transfer, data)
    inner = reference["$content"]
    assert isinstance(inner, dict)
    wrong = {"$content": {**inner, "bytes": len(data) - 1}}
    with pytest.raises(content.ContentError, match="does not match its reference"):
        transfer.resolve(wrong)
    spaced = b'{"a": 1}'  # JSON, but not canonical: refused, and nothing stored
    with pytest.raises(canonical.CanonicalJsonError):
        upload(transfer, spaced)
    with db.read() as tx:
        assert blobs.peek(tx, hashlib.sha256(spaced).digest(), inline_limit=-1) is None
