"""The client protocol ``piwf.client.v1``: message models, parsing and serialization.

Every frame (see :mod:`piwf.protocol.framing`) is one canonical JSON object with ``schema`` and
``type``. Keys below are the exact wire names; ``?`` marks a field that is absent when unset
(``null`` is never accepted in its place)::

    hello     server → client, first frame on every connection
              {"connectionId": Id, "packageVersion": Version, "schema": "piwf.client.v1",
               "serverEpoch": Int, "type": "hello"}

    request   client → server
              {"clientId": Id, "expectedRevision"?: Int, "idempotencyKey"?: Id,
               "operation": Operation, "payload": {...}, "requestId": Id, "runId"?: Id,
               "schema": "piwf.client.v1", "type": "request"}

    response  server → client, one per request, repeating its requestId
              {"error"?: {"code": Code, "message": Text}, "outcome": Outcome,
               "receipt"?: {...}, "requestId": Id, "revision"?: Int,
               "schema": "piwf.client.v1", "type": "response"}

    event     server → client, on a subscription
              {"event": Name, "payload": {...}, "revision"?: Int, "runId"?: Id,
               "schema": "piwf.client.v1", "subscriptionId": Id, "type": "event"}

    Id       1..256 printable ASCII characters (0x21-0x7E: no space, no control character)
    Version  1..64 printable ASCII characters
    Int      integer 0..2**53-1 (never a bool, never a float such as 1.0)
    Outcome  accepted | adopted | rejected | conflict | notFound | claimLost | unavailable
    Code     camelCase error code: a lowercase letter, then letters or digits; at most 64
    Text     at most 1024 characters
    Name     a lowercase letter, then letters, digits, "_" or "."; at most 64

Rules beyond field shapes: a request for a durable operation
(:data:`~piwf.protocol.operations.DURABLE_OPERATIONS`) must carry ``idempotencyKey`` and a read
must not; a response whose outcome is ``accepted`` or ``adopted`` carries no ``error``.

Python attributes are the snake_case forms of the wire names (``request_id``), except ``schema``,
which is ``schema_id``. Models are frozen and strict, so a model that validates always
serializes back to the exact frame it was parsed from.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypeAlias, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from piwf import canonical
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import PiwfError
from piwf.protocol.errors import FrameTooLargeError, InvalidMessageError, InvalidMessageReason
from piwf.protocol.framing import NEWLINE, check_frame
from piwf.protocol.operations import REVISION_OPERATIONS, SCHEMA, Operation, is_durable

MessageType = Literal["hello", "request", "response", "event"]
MESSAGE_TYPES: tuple[MessageType, ...] = get_args(MessageType)

Outcome = Literal[
    "accepted", "adopted", "rejected", "conflict", "notFound", "claimLost", "unavailable"
]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
#: Outcomes that report success; a response with one of them carries no ``error``.
SUCCESS_OUTCOMES: frozenset[Outcome] = frozenset({"accepted", "adopted"})

MAX_ID_LENGTH: Final = 256
MAX_VERSION_LENGTH: Final = 64
MAX_ERROR_MESSAGE_LENGTH: Final = 1024

#: An id or key: 1 to 256 printable ASCII characters, no spaces.
OPAQUE_ID_PATTERN: Final = rf"^[\x21-\x7e]{{1,{MAX_ID_LENGTH}}}$"
OpaqueId = Annotated[str, Field(pattern=OPAQUE_ID_PATTERN)]
#: A resource manager's name: a lowercase letter, then lowercase letters, digits and ``-``.
MANAGER_NAME_PATTERN: Final = r"^[a-z][a-z0-9-]*$"
PackageVersion = Annotated[str, Field(pattern=rf"^[\x21-\x7e]{{1,{MAX_VERSION_LENGTH}}}$")]
Revision = Annotated[int, Field(ge=0, le=canonical.MAX_SAFE_INTEGER)]
ErrorCode = Annotated[str, Field(pattern=r"^[a-z][A-Za-z0-9]{0,63}$")]
EventName = Annotated[str, Field(pattern=r"^[a-z][A-Za-z0-9_.]{0,63}$")]
ErrorMessage = Annotated[str, Field(max_length=MAX_ERROR_MESSAGE_LENGTH)]


class _WireModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        # Validators are built on first use, not at import (see payloads.WireModel).
        defer_build=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """Return the wire object: camelCase keys, unset optional fields left out."""
        fields = type(self).model_fields
        absent = {
            name
            for name, info in fields.items()
            if not info.is_required() and getattr(self, name) is None
        }
        return self.model_dump(by_alias=True, exclude=absent)


class ErrorInfo(_WireModel):
    """A bounded, safe error in a response: a stable ``code`` and a human ``message``."""

    code: ErrorCode
    message: ErrorMessage

    @classmethod
    def of(cls, error: PiwfError) -> ErrorInfo:
        """Describe ``error`` by its wire code and message, cut to the message bound.

        PiwfError messages are safe by contract (no tokens, payloads or environment values).
        """
        text = str(error)
        if len(text) > MAX_ERROR_MESSAGE_LENGTH:
            text = text[: MAX_ERROR_MESSAGE_LENGTH - 1] + "…"
        return cls(code=error.code, message=text)


class _Envelope(_WireModel):
    schema_id: Literal["piwf.client.v1"] = Field(default=SCHEMA, alias="schema")


class Hello(_Envelope):
    """The server's first frame on every connection; a client refuses another package version."""

    type: Literal["hello"] = "hello"
    connection_id: OpaqueId
    package_version: PackageVersion
    server_epoch: Revision


class Request(_Envelope):
    """One transport attempt of a command or read.

    ``request_id`` names the attempt only; a retry after a lost connection uses a new one with
    the same ``client_id``, ``idempotency_key`` and payload, and adopts the stored receipt.
    """

    type: Literal["request"] = "request"
    request_id: OpaqueId
    client_id: OpaqueId
    operation: Operation
    idempotency_key: OpaqueId | None = None
    run_id: OpaqueId | None = None
    expected_revision: Revision | None = None
    payload: dict[str, Any]

    @model_validator(mode="after")
    def _idempotency_key_matches_operation(self) -> Request:
        durable = is_durable(self.operation)
        if durable and self.idempotency_key is None:
            raise PydanticCustomError(
                "idempotencyKeyRequired", "a durable operation needs an idempotency key"
            )
        if not durable and self.idempotency_key is not None:
            raise PydanticCustomError(
                "idempotencyKeyUnexpected", "a read operation takes no idempotency key"
            )
        if self.expected_revision is not None and self.operation not in REVISION_OPERATIONS:
            raise PydanticCustomError(
                "expectedRevisionUnexpected",
                "{operation} takes no expectedRevision (only resource.apply, resource.delete,"
                " run.cancel, run.pause and run.resume compare one)",
                {"operation": self.operation},
            )
        return self


class Response(_Envelope):
    """The answer to one request; ``request_id`` repeats the request's."""

    type: Literal["response"] = "response"
    request_id: OpaqueId
    outcome: Outcome
    revision: Revision | None = None
    receipt: dict[str, Any] | None = None
    error: ErrorInfo | None = None

    @model_validator(mode="after")
    def _no_error_on_success(self) -> Response:
        if self.outcome in SUCCESS_OUTCOMES and self.error is not None:
            raise PydanticCustomError("errorOnSuccess", "a successful response carries no error")
        return self


class Event(_Envelope):
    """One update on a subscription (a snapshot, a page, an availability change)."""

    type: Literal["event"] = "event"
    subscription_id: OpaqueId
    event: EventName
    revision: Revision | None = None
    run_id: OpaqueId | None = None
    payload: dict[str, Any]


Message: TypeAlias = "Hello | Request | Response | Event"
ServerMessage: TypeAlias = "Hello | Response | Event"

_MODELS: dict[str, type[Hello] | type[Request] | type[Response] | type[Event]] = {
    "hello": Hello,
    "request": Request,
    "response": Response,
    "event": Event,
}
#: The wire names each message type allows (pydantic would also accept the Python names).
_WIRE_NAMES: dict[str, frozenset[str]] = {
    kind: frozenset(info.alias or name for name, info in model.model_fields.items())
    for kind, model in _MODELS.items()
}


def parse_message(frame: bytes) -> Message:
    """Parse one frame body (without its newline) into the message its ``type`` names.

    Raises :class:`~piwf.protocol.errors.FrameError` (or ``FrameTooLargeError``) when the body
    breaks a framing rule, :class:`piwf.errors.CanonicalJsonError` when it is not canonical JSON,
    and :class:`~piwf.protocol.errors.InvalidMessageError` when the JSON is not a valid message:
    not an object, another schema, an unknown ``type``, an unknown, missing, ``null`` or
    wrongly typed field, or a value outside its rule. Nothing else is raised for any input.
    """
    check_frame(frame)
    return _from_wire(canonical.decode(frame))


def parse_request(frame: bytes) -> Request:
    """Parse a frame a server received; anything but a request is ``unexpectedType``."""
    message = parse_message(frame)
    if not isinstance(message, Request):
        raise InvalidMessageError(
            "type", "unexpectedType", f"a client sends requests, not {message.type} messages"
        )
    return message


def parse_server_message(frame: bytes) -> ServerMessage:
    """Parse a frame a client received; a request is ``unexpectedType``."""
    message = parse_message(frame)
    if isinstance(message, Request):
        raise InvalidMessageError("type", "unexpectedType", "a server does not send requests")
    return message


def serialize(message: Message) -> bytes:
    """Return the canonical frame body of ``message`` (no newline), the inverse of parsing.

    Raises :class:`~piwf.protocol.errors.FrameTooLargeError` when the frame with its newline
    would exceed :data:`~piwf.config.MAX_FRAME_BYTES`, and
    :class:`piwf.errors.CanonicalJsonError` when a payload holds a value JSON cannot carry.
    """
    body = canonical.encode(message.to_wire())
    if len(body) + len(NEWLINE) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(MAX_FRAME_BYTES)
    return body


def encode_message(message: Message) -> bytes:
    """Return ``serialize(message)`` followed by the newline: the bytes to write."""
    return serialize(message) + NEWLINE


def _from_wire(value: object) -> Message:
    if not isinstance(value, dict):
        raise InvalidMessageError("", "notAnObject", "a message must be a JSON object")
    if "schema" not in value:
        raise InvalidMessageError("schema", "missingField", "message is missing 'schema'")
    if value["schema"] != SCHEMA:
        raise InvalidMessageError("schema", "wrongSchema", f"schema must be {SCHEMA!r}")
    kind = value.get("type")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        if "type" not in value:
            raise InvalidMessageError("type", "missingField", "message is missing 'type'")
        raise InvalidMessageError(
            "type", "unknownType", "type must be one of " + ", ".join(MESSAGE_TYPES)
        )
    assert isinstance(kind, str)
    allowed = _WIRE_NAMES[kind]
    for key, item in value.items():
        if key not in allowed:
            name = canonical.safe_name(key)
            raise InvalidMessageError(
                name, "unknownField", f"a {kind} message has no field {name!r}"
            )
        if item is None:
            raise InvalidMessageError(
                key, "wrongType", f"{kind} field {key!r} must be {_rule(key)}, not null"
            )
    try:
        return model.model_validate(value)
    except ValidationError as error:
        raise _invalid(kind, error) from None


_CUSTOM_RULES: dict[str, tuple[str, InvalidMessageReason]] = {
    "idempotencyKeyRequired": ("idempotencyKey", "missingField"),
    "idempotencyKeyUnexpected": ("idempotencyKey", "unexpectedField"),
    "expectedRevisionUnexpected": ("expectedRevision", "unexpectedField"),
    "errorOnSuccess": ("error", "unexpectedField"),
}

_ID_RULE = "a string of 1 to 256 printable ASCII characters (no space)"
_INT_RULE = "an integer from 0 to 2**53 - 1"
_OBJECT_RULE = "a JSON object"
_FIELD_RULES: dict[str, str] = {
    "clientId": _ID_RULE,
    "connectionId": _ID_RULE,
    "error": "an object with 'code' and 'message'",
    "error.code": "a camelCase error code of at most 64 characters",
    "error.message": f"a string of at most {MAX_ERROR_MESSAGE_LENGTH} characters",
    "event": "an event name of at most 64 characters",
    "expectedRevision": _INT_RULE,
    "idempotencyKey": _ID_RULE,
    "operation": "a piwf.client.v1 operation name",
    "outcome": "one of " + ", ".join(OUTCOMES),
    "packageVersion": "a string of 1 to 64 printable ASCII characters",
    "payload": _OBJECT_RULE,
    "receipt": _OBJECT_RULE,
    "requestId": _ID_RULE,
    "revision": _INT_RULE,
    "runId": _ID_RULE,
    "serverEpoch": _INT_RULE,
    "subscriptionId": _ID_RULE,
}


def _invalid(kind: str, error: ValidationError) -> InvalidMessageError:
    """Turn pydantic's first complaint into an error that never repeats an input value."""
    first = error.errors(include_url=False, include_context=False, include_input=False)[0]
    error_type = first["type"]
    if error_type in _CUSTOM_RULES:
        field, custom_reason = _CUSTOM_RULES[error_type]
        return InvalidMessageError(field, custom_reason, f"{kind}: {first['msg']}")
    field = ".".join(canonical.safe_name(str(part)) for part in first["loc"])
    if error_type == "missing":
        return InvalidMessageError(field, "missingField", f"a {kind} message needs {field!r}")
    if error_type == "extra_forbidden":
        return InvalidMessageError(field, "unknownField", f"a {kind} message has no {field!r}")
    reason: InvalidMessageReason = "wrongType" if error_type.endswith("_type") else "invalidValue"
    return InvalidMessageError(field, reason, f"{kind} field {field!r} must be {_rule(field)}")


def _rule(field: str) -> str:
    return _FIELD_RULES.get(field, "a valid value")
