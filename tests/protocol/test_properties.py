"""Generated frames: exact round trips, and only typed errors for mutated input (B11, B20)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piwf import canonical
from piwf.errors import PiwfError
from piwf.protocol import (
    FrameDecoder,
    FrameError,
    Message,
    encode_message,
    parse_message,
    serialize,
)

from .strategies import json_values, messages, mutated, unicode_text

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=200, deadline=None)
@given(messages)
def test_every_valid_message_round_trips_exactly(message: Message) -> None:
    line = encode_message(message)
    [frame] = FrameDecoder().feed(line)
    parsed = parse_message(frame)
    assert parsed == message
    assert encode_message(parsed) == line


def accepted_frames_are_canonical(frame: bytes) -> None:
    """The B11 property: an accepted frame ``f`` satisfies ``serialize(parse(f)) == f``."""
    try:
        message = parse_message(frame)
    except PiwfError:
        return
    assert serialize(message) == frame


@FUZZ
@given(messages, messages, st.data())
def test_mutated_frames_raise_only_typed_errors(
    message: Message, donor: Message, data: st.DataObject
) -> None:
    frame = data.draw(mutated(serialize(message), serialize(donor)))
    # Anything but a PiwfError (KeyError, TypeError, RecursionError, ValidationError) fails here.
    accepted_frames_are_canonical(frame)


@FUZZ
@given(st.lists(messages, min_size=1, max_size=4), st.data())
def test_mutated_streams_in_random_chunks_raise_only_typed_errors(
    batch: list[Message], data: st.DataObject
) -> None:
    stream = b"".join(encode_message(message) for message in batch)
    stream = data.draw(mutated(stream, encode_message(batch[0])))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = FrameDecoder()
    frames: list[bytes] = []
    try:
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            frames += decoder.feed(stream[start:end])
        decoder.finish()
    except FrameError as error:
        frames += error.frames
    for frame in frames:
        accepted_frames_are_canonical(frame)


@FUZZ
@given(messages, st.data())
def test_mutated_wire_objects_raise_only_typed_errors(
    message: Message, data: st.DataObject
) -> None:
    # Byte mutations rarely survive JSON parsing; these keep valid canonical JSON and attack
    # the validation layer: a field replaced by any JSON value, removed, or a field added.
    wire = message.to_wire()
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "add":
            wire[data.draw(unicode_text)] = data.draw(json_values)
        elif wire:
            key = data.draw(st.sampled_from(sorted(wire)))
            if action == "replace":
                wire[key] = data.draw(json_values)
            else:
                del wire[key]
    accepted_frames_are_canonical(canonical.encode(wire))


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_typed_errors(frame: bytes) -> None:
    accepted_frames_are_canonical(frame)
