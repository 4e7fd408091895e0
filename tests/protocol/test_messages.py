"""piwf.client.v1 messages: strict canonical parsing and exact validation (testing.md §5.3)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from piwf import canonical
from piwf.errors import CanonicalJsonError, PiwfError
from piwf.protocol import (
    SCHEMA,
    ErrorInfo,
    Event,
    FrameError,
    Hello,
    InvalidMessageError,
    ProtocolError,
    Request,
    Response,
    encode_message,
    parse_message,
    parse_request,
    parse_server_message,
    serialize,
)
from piwf.protocol.client_v1 import MAX_ERROR_MESSAGE_LENGTH
from piwf.protocol.payloads import EffectReceipt

CANARY = "SECRET-CANARY-4f2a"


def request_wire(**changes: Any) -> dict[str, Any]:
    """A valid durable request as a wire object, with ``changes`` applied (None deletes)."""
    wire: dict[str, Any] = {
        "clientId": "client-1",
        "expectedRevision": 12,
        "idempotencyKey": "key-1",
        "operation": "run.cancel",
        "payload": {"reason": "user"},
        "requestId": "req-1",
        "runId": "run-1",
        "schema": SCHEMA,
        "type": "request",
    }
    for key, value in changes.items():
        if value is None:
            del wire[key]
        else:
            wire[key] = value
    return wire


def frame_of(wire: object) -> bytes:
    return canonical.encode(wire)


VALID_REQUEST = frame_of(request_wire())


def invalid(frame: bytes) -> InvalidMessageError:
    with pytest.raises(InvalidMessageError) as caught:
        parse_message(frame)
    error = caught.value
    assert error.code == "invalidMessage"
    # pydantic's own report repeats input values; it must not ride along in a traceback.
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    return error


# --- valid messages ---------------------------------------------------------------------------


def test_valid_request_parses_into_snake_case_attributes() -> None:
    request = parse_request(VALID_REQUEST)
    assert request == Request(
        request_id="req-1",
        client_id="client-1",
        operation="run.cancel",
        idempotency_key="key-1",
        run_id="run-1",
        expected_revision=12,
        payload={"reason": "user"},
    )
    assert request.schema_id == SCHEMA
    assert request.type == "request"
    assert serialize(request) == VALID_REQUEST
    assert encode_message(request) == VALID_REQUEST + b"\n"


@pytest.mark.parametrize(
    "message",
    [
        Hello(connection_id="conn-1", package_version="0.1.0", server_epoch=3),
        Request(request_id="r", client_id="c", operation="server.status", payload={}),
        Response(request_id="r", outcome="accepted", revision=4, receipt={"runId": "run-1"}),
        Response(
            request_id="r",
            outcome="rejected",
            error=ErrorInfo(code="runCommand", message="run is already terminal"),
        ),
        Event(subscription_id="s", event="run_snapshot", revision=0, run_id="x", payload={}),
        Event(subscription_id="s", event="unavailable", payload={"n": [1, 2.5, None]}),
    ],
)
def test_every_message_type_round_trips(message: Hello | Request | Response | Event) -> None:
    frame = serialize(message)
    assert parse_message(frame) == message
    assert serialize(parse_message(frame)) == frame


def test_unset_optional_fields_are_absent_on_the_wire() -> None:
    wire = Response(request_id="r", outcome="adopted").to_wire()
    assert wire == {"outcome": "adopted", "requestId": "r", "schema": SCHEMA, "type": "response"}


def test_payload_nulls_survive_the_round_trip() -> None:
    event = Event(subscription_id="s", event="runs", payload={"a": None, "b": {"c": None}})
    assert parse_message(serialize(event)) == event
    assert b'"a":null' in serialize(event)


def test_opaque_id_bounds_are_inclusive() -> None:
    longest = "k" * 256
    request = parse_request(frame_of(request_wire(idempotencyKey=longest)))
    assert request.idempotency_key == longest
    assert parse_request(frame_of(request_wire(idempotencyKey="!~"))).idempotency_key == "!~"


def test_read_operation_needs_no_idempotency_key() -> None:
    frame = frame_of(request_wire(operation="run.get", idempotencyKey=None, expectedRevision=None))
    assert parse_request(frame).idempotency_key is None


def test_parse_request_and_parse_server_message_check_the_direction() -> None:
    hello = serialize(Hello(connection_id="c", package_version="1", server_epoch=1))
    with pytest.raises(InvalidMessageError) as caught:
        parse_request(hello)
    assert (caught.value.field, caught.value.reason) == ("type", "unexpectedType")
    assert isinstance(parse_server_message(hello), Hello)
    with pytest.raises(InvalidMessageError) as caught:
        parse_server_message(VALID_REQUEST)
    assert (caught.value.field, caught.value.reason) == ("type", "unexpectedType")


def test_models_are_frozen_strict_and_closed() -> None:
    request = parse_request(VALID_REQUEST)
    with pytest.raises(ValidationError):
        request.run_id = "other"
    for model in (Hello, Request, Response, Event, ErrorInfo):
        config = model.model_config
        assert (config["extra"], config["strict"], config["frozen"]) == ("forbid", True, True)
    with pytest.raises(ValidationError):
        Hello(connection_id="c", package_version="1", server_epoch=True)


def test_error_info_of_a_piwf_error_is_bounded() -> None:
    info = ErrorInfo.of(FrameError("nulByte", "x" * 5000))
    assert info.code == "badFrame"
    assert len(info.message) == MAX_ERROR_MESSAGE_LENGTH
    assert info.message.endswith("…")
    assert ErrorInfo.of(PiwfError("short")).message == "short"


# --- B4-B11: bytes that are not canonical JSON ------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        pytest.param(b'{"a":"\xff"}', "badEncoding", id="B4-invalid-utf8"),
        pytest.param(b'{"a":"\xed\xa0\x80"}', "badEncoding", id="B4-encoded-surrogate"),
        pytest.param(b"hello", "notJson", id="B5-not-json"),
        pytest.param(VALID_REQUEST[:-1], "notJson", id="B5-truncated"),
        pytest.param(VALID_REQUEST + b"x", "notJson", id="B5-trailing-garbage"),
        pytest.param(VALID_REQUEST + b"{}", "notJson", id="B5-two-documents"),
        pytest.param(b'{"a":NaN}', "nonFinite", id="B6-nan"),
        pytest.param(b'{"a":Infinity}', "nonFinite", id="B6-infinity"),
        pytest.param(b'{"a":-Infinity}', "nonFinite", id="B6-minus-infinity"),
        pytest.param(b'{"a":1e400}', "nonFinite", id="B6-1e400"),
        pytest.param(b'{"a":-0.0}', "nonCanonical", id="B6-minus-zero"),
        pytest.param(b'{"a":1,"a":2}', "duplicateKey", id="B7-duplicate-key"),
        pytest.param(b'{"a":"\\ud800"}', "loneSurrogate", id="B8-lone-surrogate"),
        pytest.param(b'{"\\udc00":1}', "loneSurrogate", id="B8-lone-surrogate-key"),
        pytest.param(b"[" * 10_000 + b"]" * 10_000, "tooDeep", id="B9-nesting-10000"),
        pytest.param(b'{"a":' * 5_000 + b"1" + b"}" * 5_000, "tooDeep", id="B9-objects"),
        pytest.param(b'{"a":' + b"7" * 5_000 + b"}", "unsafeInteger", id="B10-5000-digits"),
        pytest.param(b'{"a":9007199254740993}', "unsafeInteger", id="B10-unsafe-integer"),
        pytest.param(b'{"a": 1}', "nonCanonical", id="B11-whitespace"),
        pytest.param(b'{"b":1,"a":2}', "nonCanonical", id="B11-key-order"),
        pytest.param(b'{"a":1.0}', "nonCanonical", id="B11-one-point-zero"),
        pytest.param(b'{"a":"\\u00e9"}', "nonCanonical", id="B11-escaped-e-acute"),
        pytest.param(b'{"a":"\\/"}', "nonCanonical", id="B11-escaped-slash"),
        pytest.param(b'{"a":1E2}', "nonCanonical", id="B11-exponent"),
    ],
)
def test_non_canonical_text_is_refused(frame: bytes, reason: str) -> None:
    with pytest.raises(CanonicalJsonError) as caught:
        parse_message(frame)
    assert caught.value.code == "invalidJson"
    assert caught.value.reason == reason


def test_whitespace_variant_of_a_valid_request_is_refused() -> None:
    spaced = VALID_REQUEST.replace(b",", b", ", 1)
    with pytest.raises(CanonicalJsonError) as caught:
        parse_message(spaced)
    assert caught.value.reason == "nonCanonical"


# --- B5/B12: canonical JSON that is not a valid message ---------------------------------------


@pytest.mark.parametrize("wire", [[], [request_wire()], "request", 1, None, True], ids=repr)
def test_top_level_must_be_an_object(wire: object) -> None:
    error = invalid(frame_of(wire))
    assert (error.field, error.reason) == ("", "notAnObject")


@pytest.mark.parametrize(
    ("wire", "field", "reason"),
    [
        pytest.param(request_wire(schema=None), "schema", "missingField", id="no-schema"),
        pytest.param(request_wire(schema="piwf.client.v2"), "schema", "wrongSchema", id="v2"),
        pytest.param(request_wire(schema=1), "schema", "wrongSchema", id="schema-int"),
        pytest.param(request_wire(type=None), "type", "missingField", id="no-type"),
        pytest.param(request_wire(type="ping"), "type", "unknownType", id="unknown-type"),
        pytest.param(request_wire(type=["request"]), "type", "unknownType", id="type-list"),
        pytest.param(request_wire(type={}), "type", "unknownType", id="type-object"),
        pytest.param(request_wire(extra=1), "extra", "unknownField", id="unknown-field"),
        pytest.param(request_wire(request_id="r"), "request_id", "unknownField", id="snake"),
        pytest.param(request_wire(event="x"), "event", "unknownField", id="event-field"),
        pytest.param(request_wire(requestId=None), "requestId", "missingField", id="no-rid"),
        pytest.param(request_wire(clientId=None), "clientId", "missingField", id="no-cid"),
        pytest.param(request_wire(operation=None), "operation", "missingField", id="no-op"),
        pytest.param(request_wire(payload=None), "payload", "missingField", id="no-payload"),
        pytest.param(request_wire(requestId=7), "requestId", "wrongType", id="rid-int"),
        pytest.param(request_wire(payload=[]), "payload", "wrongType", id="payload-list"),
        pytest.param(request_wire(payload="{}"), "payload", "wrongType", id="payload-str"),
        pytest.param(request_wire(runId=True), "runId", "wrongType", id="rid-bool"),
        pytest.param(
            request_wire(expectedRevision=1.5), "expectedRevision", "wrongType", id="B10-float"
        ),
        pytest.param(
            request_wire(expectedRevision=True), "expectedRevision", "wrongType", id="B10-true"
        ),
        pytest.param(
            request_wire(expectedRevision="12"), "expectedRevision", "wrongType", id="rev-str"
        ),
        pytest.param(
            request_wire(expectedRevision=1e21), "expectedRevision", "wrongType", id="rev-big"
        ),
        pytest.param(
            request_wire(expectedRevision=-1), "expectedRevision", "invalidValue", id="rev-neg"
        ),
        pytest.param(
            request_wire(idempotencyKey=""), "idempotencyKey", "invalidValue", id="B12-empty-key"
        ),
        pytest.param(
            request_wire(idempotencyKey="k" * 257),
            "idempotencyKey",
            "invalidValue",
            id="B12-257-byte-key",
        ),
        pytest.param(
            request_wire(idempotencyKey="a b"), "idempotencyKey", "invalidValue", id="key-space"
        ),
        pytest.param(
            request_wire(idempotencyKey="é"), "idempotencyKey", "invalidValue", id="key-non-ascii"
        ),
        pytest.param(
            request_wire(idempotencyKey="a\tb"), "idempotencyKey", "invalidValue", id="key-tab"
        ),
        pytest.param(
            request_wire(idempotencyKey=None), "idempotencyKey", "missingField", id="durable-no-key"
        ),
        pytest.param(
            request_wire(operation="run.get"),
            "idempotencyKey",
            "unexpectedField",
            id="read-with-key",
        ),
        # An operation that compares no revision would ignore it: the client would believe the
        # command guarded.
        pytest.param(
            request_wire(operation="run.restart"),
            "expectedRevision",
            "unexpectedField",
            id="revision-not-compared",
        ),
        pytest.param(
            request_wire(operation="run.get", idempotencyKey=None),
            "expectedRevision",
            "unexpectedField",
            id="read-with-revision",
        ),
        pytest.param(
            request_wire(operation="run.explode"), "operation", "invalidValue", id="unknown-op"
        ),
        pytest.param(request_wire(operation=3), "operation", "invalidValue", id="op-int"),
    ],
)
def test_invalid_request_names_field_and_rule(
    wire: dict[str, Any], field: str, reason: str
) -> None:
    error = invalid(frame_of(wire))
    assert (error.field, error.reason) == (field, reason)


@pytest.mark.parametrize("field", ["expectedRevision", "idempotencyKey", "runId"])
def test_null_is_not_an_absent_optional_field(field: str) -> None:
    wire = request_wire()
    wire[field] = None
    error = invalid(frame_of(wire))
    assert (error.field, error.reason) == (field, "wrongType")


def response_wire(**changes: Any) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "outcome": "rejected",
        "requestId": "req-1",
        "schema": SCHEMA,
        "type": "response",
    }
    wire.update(changes)
    return wire


@pytest.mark.parametrize(
    ("wire", "field", "reason"),
    [
        pytest.param(response_wire(outcome="ok"), "outcome", "invalidValue", id="outcome"),
        pytest.param(response_wire(outcome="Accepted"), "outcome", "invalidValue", id="case"),
        pytest.param(response_wire(receipt=[]), "receipt", "wrongType", id="receipt-list"),
        pytest.param(response_wire(revision=False), "revision", "wrongType", id="revision-bool"),
        pytest.param(response_wire(error="boom"), "error", "wrongType", id="error-str"),
        pytest.param(response_wire(error={"code": "x"}), "error.message", "missingField", id="m"),
        pytest.param(
            response_wire(error={"code": "Bad Code", "message": "m"}),
            "error.code",
            "invalidValue",
            id="error-code",
        ),
        pytest.param(
            response_wire(error={"code": "x", "message": "m", "stack": "..."}),
            "error.stack",
            "unknownField",
            id="error-extra",
        ),
        pytest.param(
            response_wire(error={"code": "x", "message": "m" * 1025}),
            "error.message",
            "invalidValue",
            id="error-long",
        ),
        pytest.param(
            response_wire(outcome="accepted", error={"code": "x", "message": "m"}),
            "error",
            "unexpectedField",
            id="error-on-success",
        ),
    ],
)
def test_invalid_response_names_field_and_rule(
    wire: dict[str, Any], field: str, reason: str
) -> None:
    error = invalid(frame_of(wire))
    assert (error.field, error.reason) == (field, reason)


@pytest.mark.parametrize(
    ("wire", "field", "reason"),
    [
        pytest.param(
            {"connectionId": "c", "packageVersion": "1", "schema": SCHEMA, "type": "hello"},
            "serverEpoch",
            "missingField",
            id="hello-no-epoch",
        ),
        pytest.param(
            {
                "connectionId": "c",
                "packageVersion": "v" * 65,
                "schema": SCHEMA,
                "serverEpoch": 1,
                "type": "hello",
            },
            "packageVersion",
            "invalidValue",
            id="hello-long-version",
        ),
        pytest.param(
            {
                "event": "Runs",
                "payload": {},
                "schema": SCHEMA,
                "subscriptionId": "s",
                "type": "event",
            },
            "event",
            "invalidValue",
            id="event-name",
        ),
        pytest.param(
            {"event": "runs", "schema": SCHEMA, "subscriptionId": "s", "type": "event"},
            "payload",
            "missingField",
            id="event-no-payload",
        ),
    ],
)
def test_invalid_hello_or_event_names_field_and_rule(
    wire: dict[str, Any], field: str, reason: str
) -> None:
    error = invalid(frame_of(wire))
    assert (error.field, error.reason) == (field, reason)


# --- messages are safe to log ------------------------------------------------------------------


@pytest.mark.parametrize(
    "wire",
    [
        request_wire(idempotencyKey=f"{CANARY} with a space"),
        request_wire(requestId=f"{CANARY}\u00e9"),
        request_wire(expectedRevision=CANARY),
        request_wire(operation=CANARY),
        request_wire(payload=CANARY),
        request_wire(schema=CANARY),
        request_wire(type=CANARY),
        response_wire(error={"code": CANARY, "message": "m"}),
        response_wire(outcome=CANARY),
    ],
    ids=lambda wire: sorted(wire)[0],
)
def test_errors_never_echo_values(wire: dict[str, Any]) -> None:
    error = invalid(frame_of(wire))
    assert CANARY not in str(error)
    assert CANARY not in error.field


def test_unknown_field_names_are_reduced_to_a_printable_form() -> None:
    error = invalid(frame_of(request_wire(**{"x\u001b[31m\n\u2028" + "y" * 100: 1})))
    assert error.reason == "unknownField"
    assert error.field.startswith("x??31m??yyy")
    assert error.field.endswith("…")
    assert len(error.field) == 65
    assert error.field[:64].isascii()
    assert "\u001b" not in str(error)
    assert "\n" not in str(error)


def test_protocol_error_codes_are_stable() -> None:
    assert ProtocolError.code == "protocolError"
    assert FrameError.code == "badFrame"
    assert InvalidMessageError.code == "invalidMessage"
    assert issubclass(InvalidMessageError, PiwfError)
    assert not issubclass(InvalidMessageError, ValueError)


def test_an_effect_receipt_of_an_older_server_reads_as_a_resolution() -> None:
    effect = {
        "effectId": "effect-1",
        "effectType": "chat.post",
        "recovery": "manual",
        "status": "applied",
        "attemptCount": 1,
    }
    assert EffectReceipt.model_validate({"effect": effect}).outcome == "resolved"
    unchanged = EffectReceipt.model_validate({"effect": effect, "outcome": "unchanged"})
    assert unchanged.to_wire() == {"effect": effect, "outcome": "unchanged"}
    with pytest.raises(ValidationError):
        EffectReceipt.model_validate({"effect": effect, "outcome": "adopted"})
