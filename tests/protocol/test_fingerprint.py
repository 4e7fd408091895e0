"""The durable fingerprint and the receipt rule (original.md §5.2; testing.md B13/B14)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings

from piwf.protocol import Request, parse_request, request_fingerprint, retry_outcome, serialize
from piwf.protocol.fingerprint import FINGERPRINT_BYTES

from .strategies import requests


def cancel(**changes: Any) -> Request:
    fields: dict[str, Any] = {
        "request_id": "req-1",
        "client_id": "client-1",
        "operation": "run.cancel",
        "idempotency_key": "key-1",
        "run_id": "run-1",
        "expected_revision": 12,
        "payload": {"reason": "user", "force": False},
    }
    fields.update(changes)
    return Request(**fields)


def test_fingerprint_is_sha256_of_the_canonical_request_without_request_id() -> None:
    # Computed independently of piwf.canonical: ASCII-only, so json.dumps is canonical here.
    wire = {
        "clientId": "client-1",
        "expectedRevision": 12,
        "idempotencyKey": "key-1",
        "operation": "run.cancel",
        "payload": {"force": False, "reason": "user"},
        "runId": "run-1",
        "schema": "piwf.client.v1",
        "type": "request",
    }
    text = json.dumps(wire, sort_keys=True, separators=(",", ":"))
    fingerprint = request_fingerprint(cancel())
    assert fingerprint == hashlib.sha256(text.encode()).digest()
    assert len(fingerprint) == FINGERPRINT_BYTES


def test_retry_with_a_new_request_id_adopts() -> None:  # conformance: X6
    stored = request_fingerprint(cancel(request_id="req-1"))
    retry = cancel(request_id="req-2")
    assert request_fingerprint(retry) == stored
    assert retry_outcome(stored, retry) == "adopted"


def test_payload_key_order_does_not_matter() -> None:
    reordered = cancel(payload={"force": False, "reason": "user"})
    assert request_fingerprint(reordered) == request_fingerprint(cancel())


@pytest.mark.parametrize(
    "changes",
    [
        {"payload": {"reason": "other", "force": False}},
        {"payload": {"reason": "user", "force": False, "extra": None}},
        {"payload": {"reason": "user", "force": 0}},
        {"operation": "run.pause"},
        {"run_id": "run-2"},
        {"run_id": None},
        {"expected_revision": 13},
        {"expected_revision": None},
        {"client_id": "client-2"},
        {"idempotency_key": "key-2"},
    ],
    ids=repr,
)
def test_another_command_under_the_same_key_conflicts(changes: dict[str, Any]) -> None:
    # B14: the same key with another payload is a conflict; the stored receipt is not replaced.
    stored = request_fingerprint(cancel())
    other = cancel(**changes)
    assert request_fingerprint(other) != stored
    assert retry_outcome(stored, other) == "conflict"


@pytest.mark.parametrize("operation", ["checkpoint.answer", "decision.answer", "run.restart"])
def test_coordinator_epoch_is_left_out_where_it_belongs_to_a_connection(operation: str) -> None:
    first = cancel(
        operation=operation,
        expected_revision=None,
        payload={"answer": "yes", "coordinatorEpoch": 1},
    )
    after_reconnect = cancel(
        operation=operation,
        expected_revision=None,
        request_id="req-2",
        payload={"answer": "yes", "coordinatorEpoch": 2},
    )
    assert request_fingerprint(after_reconnect) == request_fingerprint(first)
    another_answer = cancel(
        operation=operation,
        expected_revision=None,
        payload={"answer": "no", "coordinatorEpoch": 1},
    )
    assert request_fingerprint(another_answer) != request_fingerprint(first)
    assert first.payload["coordinatorEpoch"] == 1  # the request itself is untouched


def test_coordinator_epoch_counts_for_other_operations() -> None:
    one = cancel(payload={"coordinatorEpoch": 1})
    two = cancel(payload={"coordinatorEpoch": 2})
    assert request_fingerprint(one) != request_fingerprint(two)


@settings(max_examples=100, deadline=None)
@given(requests())
def test_fingerprint_survives_the_wire(request: Request) -> None:
    assert request_fingerprint(parse_request(serialize(request))) == request_fingerprint(request)
