"""Hypothesis strategies for piwf.client.v1 messages and for mutations of their frames."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from piwf.canonical import MAX_SAFE_INTEGER
from piwf.protocol import (
    DURABLE_OPERATIONS,
    OPERATIONS,
    OUTCOMES,
    ErrorInfo,
    Event,
    Hello,
    Message,
    Request,
    Response,
)
from piwf.protocol.operations import REVISION_OPERATIONS

PRINTABLE_ASCII = "".join(chr(code) for code in range(0x21, 0x7F))

unicode_text = st.text(st.characters(codec="utf-8"), max_size=10)
opaque_ids = st.one_of(
    st.text(PRINTABLE_ASCII, min_size=1, max_size=12),
    st.text(PRINTABLE_ASCII, min_size=256, max_size=256),
)
revisions = st.integers(min_value=0, max_value=MAX_SAFE_INTEGER)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER),
    # Doubles from 2**53 to 1e21 are written in integer form: unsafe integers, refused.
    st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda value: abs(value) <= MAX_SAFE_INTEGER or abs(value) >= 1e21
    ),
    unicode_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(unicode_text, children, max_size=4),
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(unicode_text, json_values, max_size=5)


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


@st.composite
def hellos(draw: st.DrawFn) -> Hello:
    """Valid hellos."""
    return Hello(
        connection_id=draw(opaque_ids),
        package_version=draw(st.text(PRINTABLE_ASCII, min_size=1, max_size=64)),
        server_epoch=draw(revisions),
    )


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """Valid requests: durable operations carry an idempotency key, reads never do, and only
    an operation that compares a revision may carry one."""
    operation = draw(st.sampled_from(OPERATIONS))
    key = draw(opaque_ids) if operation in DURABLE_OPERATIONS else None
    compares = operation in REVISION_OPERATIONS
    return Request(
        request_id=draw(opaque_ids),
        client_id=draw(opaque_ids),
        operation=operation,
        idempotency_key=key,
        run_id=draw(_optional(opaque_ids)),
        expected_revision=draw(_optional(revisions)) if compares else None,
        payload=draw(json_objects),
    )


@st.composite
def error_infos(draw: st.DrawFn) -> ErrorInfo:
    """Valid response errors."""
    return ErrorInfo(
        code=draw(st.from_regex(r"\A[a-z][A-Za-z0-9]{0,20}\Z")),
        message=draw(st.text(st.characters(codec="utf-8"), max_size=40)),
    )


@st.composite
def responses(draw: st.DrawFn) -> Response:
    """Valid responses: a success outcome never carries an error."""
    outcome = draw(st.sampled_from(OUTCOMES))
    error = None if outcome in ("accepted", "adopted") else draw(_optional(error_infos()))
    return Response(
        request_id=draw(opaque_ids),
        outcome=outcome,
        revision=draw(_optional(revisions)),
        receipt=draw(_optional(json_objects)),
        error=error,
    )


@st.composite
def events(draw: st.DrawFn) -> Event:
    """Valid events."""
    return Event(
        subscription_id=draw(opaque_ids),
        event=draw(st.from_regex(r"\A[a-z][A-Za-z0-9_.]{0,20}\Z")),
        revision=draw(_optional(revisions)),
        run_id=draw(_optional(opaque_ids)),
        payload=draw(json_objects),
    )


messages: st.SearchStrategy[Message] = st.one_of(hellos(), requests(), responses(), events())


@st.composite
def mutated(draw: st.DrawFn, frame: bytes, donor: bytes) -> bytes:
    """Apply one to three byte-level mutations to ``frame``.

    Flips a bit, sets a byte to a JSON-significant one, truncates, splices in the tail of
    ``donor`` (another valid frame), inserts random bytes or deletes a run of bytes.
    """
    data = bytearray(frame)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        kind = draw(st.sampled_from(["flip", "truncate", "splice", "insert", "delete", "set"]))
        at = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif kind == "set" and data:
            data[at] = draw(st.sampled_from(b'{}[]",:\\0123456789-.eE tfn\x00\r\n\xff\xc3'))
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice":
            cut = draw(st.integers(min_value=0, max_value=len(donor)))
            data[at:] = donor[cut:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            width = draw(st.integers(min_value=1, max_value=8))
            del data[at : at + width]
    return bytes(data)
