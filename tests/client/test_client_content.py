"""The client's assembly of referenced values, fed by a fake ``view.content`` transport.

The fake answers each part from a byte string as the protocol describes (digest, total, offset,
base64 data); a test then corrupts exactly one thing and the assembly must refuse the value.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from piwf import canonical
from piwf.client.content import read_content, resolve_references
from piwf.config import CONTENT_PART_BYTES
from piwf.errors import ContentMismatchError
from piwf.protocol.payloads import (
    ContentReadPayload,
    ContentRef,
    DecisionInfo,
    OpenRequestInfo,
    ResolutionInfo,
    RunDetail,
    RunInfo,
)

Tamper = Callable[[dict[str, Any], int], dict[str, Any]]


def ref_of(data: bytes, media_type: str = "application/json", owner: str = "run-1") -> ContentRef:
    return ContentRef.model_validate(
        {
            "sha256": hashlib.sha256(data).hexdigest(),
            "mediaType": media_type,
            "length": len(data),
            "scope": "run",
            "owner": owner,
        }
    )


class FakeTransport:
    """Serves ``view.content`` parts of ``stored``; ``tamper`` may rewrite the n-th receipt."""

    def __init__(self, stored: bytes, tamper: Tamper | None = None) -> None:
        self.stored = stored
        self.tamper = tamper
        self.requests: list[ContentReadPayload] = []

    def __call__(self, payload: dict[str, Any]) -> Mapping[str, Any]:
        request = ContentReadPayload.model_validate(payload)
        self.requests.append(request)
        chunk = self.stored[request.offset : request.offset + request.length]
        receipt = {
            "sha256": request.ref.sha256,
            "total": len(self.stored),
            "offset": request.offset,
            "data": base64.b64encode(chunk).decode("ascii"),
        }
        if self.tamper is not None:
            receipt = self.tamper(receipt, len(self.requests) - 1)
        return receipt


VALUE = {"blob": "".join(f"{n:07d}," for n in range(200_000)), "n": 200_000}
DATA = canonical.encode(VALUE)


def test_parts_are_assembled_verified_and_decoded() -> None:
    transport = FakeTransport(DATA)
    assert read_content(transport, ref_of(DATA)) == VALUE
    offsets = [(r.offset, r.length) for r in transport.requests]
    assert len(DATA) > 3 * CONTENT_PART_BYTES
    assert offsets == [
        (offset, min(CONTENT_PART_BYTES, len(DATA) - offset))
        for offset in range(0, len(DATA), CONTENT_PART_BYTES)
    ]


def test_text_content_decodes_as_utf8() -> None:
    text = "línea\n" * 100_000
    data = text.encode("utf-8")
    assert read_content(FakeTransport(data), ref_of(data, "text/plain")) == text


def flip_a_byte(receipt: dict[str, Any], index: int) -> dict[str, Any]:
    if index == 1:
        chunk = bytearray(base64.b64decode(receipt["data"]))
        chunk[10] ^= 0x01
        receipt["data"] = base64.b64encode(bytes(chunk)).decode("ascii")
    return receipt


def shorten(receipt: dict[str, Any], index: int) -> dict[str, Any]:
    chunk = base64.b64decode(receipt["data"])
    receipt["data"] = base64.b64encode(chunk[:-1]).decode("ascii")
    return receipt


def lengthen(receipt: dict[str, Any], index: int) -> dict[str, Any]:
    chunk = base64.b64decode(receipt["data"])
    receipt["data"] = base64.b64encode(chunk + b"x").decode("ascii")
    return receipt


def shift_offset(receipt: dict[str, Any], index: int) -> dict[str, Any]:
    receipt["offset"] += 1
    return receipt


def other_digest(receipt: dict[str, Any], index: int) -> dict[str, Any]:
    receipt["sha256"] = "0" * 64
    return receipt


def other_total(receipt: dict[str, Any], index: int) -> dict[str, Any]:
    receipt["total"] += 1
    return receipt


def not_base64(receipt: dict[str, Any], index: int) -> dict[str, Any]:
    receipt["data"] = "@@@@"
    return receipt


def malformed(receipt: dict[str, Any], index: int) -> dict[str, Any]:
    return {**receipt, "extra": True}


@pytest.mark.parametrize(
    "tamper",
    [
        flip_a_byte,
        shorten,
        lengthen,
        shift_offset,
        other_digest,
        other_total,
        not_base64,
        malformed,
    ],
)
def test_a_wrong_part_is_a_typed_error_never_a_partial_value(tamper: Tamper) -> None:
    with pytest.raises(ContentMismatchError):
        read_content(FakeTransport(DATA, tamper), ref_of(DATA))


def test_a_missing_receipt_is_a_typed_error() -> None:
    with pytest.raises(ContentMismatchError):
        read_content(lambda payload: None, ref_of(DATA))


def test_bytes_that_match_but_do_not_decode_are_refused() -> None:
    not_canonical = b'{ "a": 1 }'
    with pytest.raises(ContentMismatchError, match="application/json"):
        read_content(FakeTransport(not_canonical), ref_of(not_canonical))
    not_utf8 = b"\xff\xfe text"
    with pytest.raises(ContentMismatchError, match="text/plain"):
        read_content(FakeTransport(not_utf8), ref_of(not_utf8, "text/plain"))


def run_info() -> RunInfo:
    return RunInfo.model_validate(
        {
            "runId": "run-1",
            "workflowRef": "builtin:x",
            "workflowName": "x",
            "status": "completed",
            "displayStatus": "completed",
            "paused": False,
            "rootRunId": "run-1",
            "restartNumber": 0,
            "definitionDigest": "ab" * 32,
            "revision": 3,
            "createdAt": 1,
            "updatedAt": 2,
        }
    )


def test_references_are_resolved_at_every_level_and_nowhere_else() -> None:
    stored = {
        "out": canonical.encode({"output": 1}),
        "prompt": canonical.encode({"prompt": "p"}),
        "answer": canonical.encode({"choice": "ship"}),
        "error": b"a long error",
    }
    refs = {
        name: ref_of(data, "text/plain" if name == "error" else "application/json")
        for name, data in stored.items()
    }
    by_digest = {ref.sha256: stored[name] for name, ref in refs.items()}
    user_value = {"lookalike_ref": refs["out"].to_wire()}  # user data is never walked
    detail = RunDetail(
        run=run_info(),
        sources=[],
        output_ref=refs["out"],
        error_ref=refs["error"],
        waiting_on=OpenRequestInfo.model_validate(
            {
                "requestId": "r",
                "runId": "run-1",
                "kind": "checkpoint",
                "path": "gate",
                "visit": 1,
                "contentRef": refs["prompt"],
                "createdAt": 1,
            }
        ),
        decisions=[
            DecisionInfo(
                decision_id="d",
                kind="checkpoint",
                resolution=ResolutionInfo.model_validate(
                    {
                        "decisionId": "d",
                        "outcome": "accepted",
                        "provenance": "human",
                        "responseRef": refs["answer"],
                        "actorType": "human",
                        "resolvedAt": 1,
                    }
                ),
                submissions=[],
            ),
            DecisionInfo(decision_id="e", kind="checkpoint", submissions=[]),
        ],
    )
    read: list[str] = []

    def fetch(ref: ContentRef) -> object:
        read.append(ref.sha256)
        data = by_digest[ref.sha256]
        return read_content(FakeTransport(data), ref)

    resolved = resolve_references(detail, fetch)  # type: ignore[arg-type]
    assert resolved.output == {"output": 1} and resolved.output_ref is None
    assert resolved.error == "a long error" and resolved.error_ref is None
    assert resolved.waiting_on is not None
    assert resolved.waiting_on.content == {"prompt": "p"}
    assert resolved.decisions[0].resolution is not None
    assert resolved.decisions[0].resolution.response == {"choice": "ship"}
    assert resolved.decisions[1] is detail.decisions[1]
    assert resolved.run.workflow_ref == "builtin:x"
    assert '"sha256"' not in canonical.encode_text(resolved.to_wire())
    assert sorted(read) == sorted(ref.sha256 for ref in refs.values())

    untouched = RunDetail(run=run_info(), sources=[], output=user_value)
    assert resolve_references(untouched, fetch) is untouched  # type: ignore[arg-type]


def test_a_content_limit_leaves_longer_references_unread() -> None:
    short, long = b'"short"', canonical.encode("l" * 5000)
    detail = RunDetail(
        run=run_info(), sources=[], output_ref=ref_of(long), error_ref=ref_of(short, "text/plain")
    )
    read: list[int] = []

    def fetch(ref: ContentRef) -> object:
        read.append(ref.length)
        return "fetched"

    resolved = resolve_references(detail, fetch, content_limit=100)  # type: ignore[arg-type]
    assert resolved.output_ref == detail.output_ref and resolved.output is None
    assert resolved.error == "fetched" and resolved.error_ref is None
    assert read == [len(short)]
