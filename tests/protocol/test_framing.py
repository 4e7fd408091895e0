"""FrameDecoder and encode_frame, fed with bytes (testing.md §5.3 B1-B4, §4 slowloris)."""

from __future__ import annotations

import pytest

from piwf import canonical
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import CanonicalJsonError, PiwfError
from piwf.protocol import (
    FrameDecoder,
    FrameError,
    FrameTooLargeError,
    Request,
    check_frame,
    encode_frame,
    encode_message,
    parse_message,
    parse_request,
    serialize,
)

M = MAX_FRAME_BYTES
CHUNK = 64 * 1024


class FakeMonotonic:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def padded_request(frame_bytes: int) -> bytes:
    """Return a valid request line (newline included) of exactly ``frame_bytes`` bytes."""
    base = Request(request_id="r1", client_id="c1", operation="run.list", payload={"pad": ""})
    overhead = len(encode_message(base))
    padded = base.model_copy(update={"payload": {"pad": "x" * (frame_bytes - overhead)}})
    line = canonical.encode(padded.to_wire()) + b"\n"
    assert len(line) == frame_bytes
    return line


# B1 (conformance: X16): frames of M-1 and M bytes pass, M+1 is refused.
@pytest.mark.parametrize("size", [M - 1, M])
def test_frame_up_to_the_limit_is_accepted(size: int) -> None:
    line = padded_request(size)
    decoder = FrameDecoder()
    [frame] = decoder.feed(line)
    assert frame == line[:-1]
    assert serialize(parse_message(frame)) == frame
    assert decoder.buffered_bytes == 0


def test_frame_one_byte_over_the_limit_is_refused() -> None:
    line = padded_request(M + 1)
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLargeError) as caught:
        decoder.feed(line)
    assert caught.value.code == "frameTooLarge"
    assert caught.value.reason == "tooLarge"
    assert caught.value.limit == M
    assert decoder.buffered_bytes == 0
    with pytest.raises(FrameTooLargeError):
        parse_message(line[:-1])


def test_oversized_frame_is_refused_before_its_newline_arrives() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"a" * (M - 1)) == []
    assert decoder.buffered_bytes == M - 1
    with pytest.raises(FrameTooLargeError):
        decoder.feed(b"a")
    assert decoder.buffered_bytes == 0


def test_body_of_limit_minus_one_bytes_completes_with_its_newline() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"a" * (M - 1))
    assert decoder.feed(b"\n") == [b"a" * (M - 1)]


# B2: 100 MiB without a newline, fed as fast as a socket would deliver it.
def test_endless_frame_is_refused_with_bounded_memory() -> None:
    decoder = FrameDecoder()
    chunk = b"a" * CHUNK
    buffered_after_each_feed: list[int] = []

    def feed_100_mib() -> None:
        for _ in range(100 * 1024 * 1024 // CHUNK):
            decoder.feed(chunk)
            buffered_after_each_feed.append(decoder.buffered_bytes)

    with pytest.raises(FrameTooLargeError):
        feed_100_mib()
    assert max(buffered_after_each_feed) <= M - 1
    # Refused in the very chunk that crossed the limit, not one chunk later.
    assert len(buffered_after_each_feed) == M // CHUNK - 1
    assert decoder.buffered_bytes == 0


def test_one_huge_chunk_is_refused_without_being_buffered() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLargeError):
        decoder.feed(b"a" * (2 * M))
    assert decoder.buffered_bytes == 0


def test_small_limit_is_enforced_including_the_newline() -> None:
    decoder = FrameDecoder(max_frame_bytes=4)
    assert decoder.feed(b"abc\n") == [b"abc"]
    with pytest.raises(FrameTooLargeError) as caught:
        decoder.feed(b"abcd\n")
    assert caught.value.limit == 4


def test_limit_must_leave_room_for_a_byte() -> None:
    with pytest.raises(ValueError, match="at least one byte"):
        FrameDecoder(max_frame_bytes=1)


# B3 (the sans-IO half: every frame comes out, in order; backpressure is the server's).
def test_ten_thousand_pipelined_frames_come_out_in_order() -> None:
    lines = [
        encode_message(
            Request(request_id=f"r{index}", client_id="c1", operation="run.list", payload={})
        )
        for index in range(10_000)
    ]
    frames = FrameDecoder().feed(b"".join(lines))
    assert len(frames) == 10_000
    assert [parse_request(frame).request_id for frame in frames] == [
        f"r{index}" for index in range(10_000)
    ]


def test_frames_split_at_every_byte_boundary() -> None:
    stream = b'{"a":1}\n{"b":[2,3]}\n{}\n'
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        frames = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert frames == [b'{"a":1}', b'{"b":[2,3]}', b"{}"]
    decoder = FrameDecoder()
    one_by_one = [frame for byte in stream for frame in decoder.feed(bytes([byte]))]
    assert one_by_one == [b'{"a":1}', b'{"b":[2,3]}', b"{}"]


def test_empty_feed_changes_nothing() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"") == []
    assert decoder.frame_started_at is None


# B4: byte-level rules.
@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (b'{"a":1}\r\n', "crlfTerminator"),
        (b'{"a":"\x00"}\n', "nulByte"),
        (b'\x00{"a":1}\n', "nulByte"),
        (b'\xef\xbb\xbf{"a":1}\n', "byteOrderMark"),
        (b"\n", "emptyFrame"),
    ],
)
def test_bad_frame_bytes_are_refused(stream: bytes, reason: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as caught:
        decoder.feed(stream)
    assert caught.value.code == "badFrame"
    assert caught.value.reason == reason
    assert decoder.failed
    body = stream[:-1]
    with pytest.raises(FrameError) as direct:
        parse_message(body)
    assert direct.value.reason == reason


def test_invalid_utf8_passes_framing_and_fails_parsing() -> None:
    [frame] = FrameDecoder().feed(b'{"a":"\xff"}\n')
    with pytest.raises(CanonicalJsonError) as caught:
        parse_message(frame)
    assert caught.value.code == "invalidJson"
    assert caught.value.reason == "badEncoding"


def test_frames_before_a_bad_frame_travel_with_the_error() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as caught:
        decoder.feed(b'{"a":1}\n{"b":2}\n{"c":3}\r\n{"d":4}\n')
    assert caught.value.frames == (b'{"a":1}', b'{"b":2}')


def test_failed_stream_refuses_every_later_feed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError):
        decoder.feed(b"\r\n")
    with pytest.raises(FrameError) as caught:
        decoder.feed(b'{"a":1}\n')
    assert caught.value.reason == "streamFailed"
    assert decoder.buffered_bytes == 0
    assert decoder.frame_started_at is None
    decoder.finish()  # the failure was already reported


def test_finish_reports_an_unfinished_frame() -> None:
    decoder = FrameDecoder()
    decoder.feed(b'{"a":1}\n')
    decoder.finish()
    decoder = FrameDecoder()
    decoder.feed(b'{"a":')
    with pytest.raises(FrameError) as caught:
        decoder.finish()
    assert caught.value.reason == "truncatedFrame"


def test_check_frame_refuses_an_embedded_newline() -> None:
    with pytest.raises(FrameError) as caught:
        check_frame(b'{"a":1}\n{"b":2}')
    assert caught.value.reason == "embeddedNewline"


def started_at(decoder: FrameDecoder) -> float | None:
    return decoder.frame_started_at


# Slowloris: the per-frame deadline runs from the frame's first byte, however it trickles.
def test_frame_started_at_marks_the_first_byte_of_each_frame() -> None:
    clock = FakeMonotonic()
    decoder = FrameDecoder(clock=clock)
    assert started_at(decoder) is None
    assert not decoder.frame_overdue(clock.now, 0.5)

    decoder.feed(b'{"a"')
    assert started_at(decoder) == 100.0
    clock.now = 100.4
    decoder.feed(b":")  # a trickled byte does not restart the deadline
    assert started_at(decoder) == 100.0
    assert not decoder.frame_overdue(clock.now, 0.5)
    clock.now = 100.6
    assert decoder.frame_overdue(clock.now, 0.5)

    clock.now = 101.0
    assert decoder.feed(b'1}\n{"b"') == [b'{"a":1}']
    assert started_at(decoder) == 101.0  # the next frame's own first byte

    assert decoder.feed(b":2}\n") == [b'{"b":2}']
    assert started_at(decoder) is None
    clock.now = 500.0
    assert not decoder.frame_overdue(clock.now, 0.5)  # idle is not overdue


def test_encode_frame_is_canonical_json_and_a_newline() -> None:
    assert (
        encode_frame({"b": 1.0, "a": [True, None, "é"]}) == '{"a":[true,null,"é"],"b":1}\n'.encode()
    )


def test_encode_frame_refuses_what_the_peer_would_refuse() -> None:
    with pytest.raises(FrameTooLargeError):
        encode_frame({"pad": "x" * M})
    with pytest.raises(FrameTooLargeError):
        encode_frame("abc", max_frame_bytes=5)
    assert encode_frame("ab", max_frame_bytes=5) == b'"ab"\n'
    with pytest.raises(CanonicalJsonError):
        encode_frame(float("nan"))


def test_serialize_refuses_a_message_over_the_limit() -> None:
    request = Request(
        request_id="r1", client_id="c1", operation="run.list", payload={"pad": "x" * M}
    )
    with pytest.raises(FrameTooLargeError):
        serialize(request)
    with pytest.raises(FrameTooLargeError):
        encode_message(request)


def test_framing_errors_belong_to_the_piwf_tree() -> None:
    assert issubclass(FrameTooLargeError, FrameError)
    assert issubclass(FrameError, PiwfError)
    assert not issubclass(FrameError, ValueError)
