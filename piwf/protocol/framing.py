"""Newline-delimited frames, bounded in size and in time. No sockets here: callers feed bytes.

A stream is a sequence of frames; each frame is one canonical JSON document and a ``\\n``::

    {"schema":"piwf.client.v1","type":"hello",...}\\n{"schema":"piwf.client.v1",...}\\n
    └──────────── frame body, <= limit - 1 bytes ──┘└ terminator

- A frame is at most ``limit`` bytes (:data:`~piwf.config.MAX_FRAME_BYTES`, 1 MiB) *including*
  its newline. Once an unfinished frame can no longer fit, :class:`FrameDecoder` raises
  :class:`FrameTooLargeError` at once: it never holds more than ``limit - 1`` bytes, however many
  bytes arrive without a newline.
- Canonical JSON has no raw control characters and no byte-order mark, so the decoder refuses a
  frame that ends in ``\\r`` (a CRLF terminator), contains a NUL byte, starts with a UTF-8 BOM or
  is empty. Everything else about the body (UTF-8, JSON, canonical form) is checked by
  :func:`piwf.canonical.decode` when the frame is parsed.
- Any framing error leaves the stream without trustworthy boundaries: the decoder refuses every
  later feed, and the receiver closes the connection.
- Slow senders: :attr:`FrameDecoder.frame_started_at` is the monotonic time at which the first
  byte of the unfinished frame arrived (``None`` between frames), so a server loop can close a
  connection whose frame is not complete within a per-frame deadline, however steadily it
  trickles bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from piwf import canonical
from piwf.config import MAX_FRAME_BYTES
from piwf.protocol.errors import FrameError, FrameErrorReason, FrameTooLargeError

NEWLINE = b"\n"
_UTF8_BOM = b"\xef\xbb\xbf"


class FrameDecoder:
    """Split a byte stream into frames, enforcing the size limit and the byte-level rules.

    ``clock`` returns monotonic seconds (default :func:`time.monotonic`); it is read once per
    :meth:`feed` that leaves an unfinished frame behind, to stamp :attr:`frame_started_at`.
    """

    def __init__(
        self,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_frame_bytes < 2:
            raise ValueError("a frame needs room for at least one byte and its newline")
        self._limit = max_frame_bytes
        self._clock = clock
        self._buffer = bytearray()
        self._started_at: float | None = None
        self._failed = False

    @property
    def max_frame_bytes(self) -> int:
        """The largest accepted frame in bytes, newline included."""
        return self._limit

    @property
    def buffered_bytes(self) -> int:
        """How many bytes of an unfinished frame are held; never more than ``limit - 1``."""
        return len(self._buffer)

    @property
    def frame_started_at(self) -> float | None:
        """Clock time at which the unfinished frame's first byte arrived; ``None`` when idle."""
        return self._started_at

    @property
    def failed(self) -> bool:
        """True once a framing error was raised; the decoder then refuses every feed."""
        return self._failed

    def frame_overdue(self, now: float, timeout: float) -> bool:
        """Return True when the unfinished frame began more than ``timeout`` seconds before ``now``.

        ``now`` must come from the decoder's clock. False when no frame is in progress: an idle
        connection is the business of an idle timeout, not of the frame deadline.
        """
        return self._started_at is not None and now - self._started_at > timeout

    def feed(self, data: bytes) -> list[bytes]:
        """Consume ``data`` and return the frames it completed, in order, without newlines.

        Bytes after the last newline are kept for the next call. Raises
        :class:`FrameTooLargeError` as soon as the unfinished frame cannot fit the limit, and
        :class:`FrameError` for an empty frame, a CRLF terminator, a NUL byte or a leading BOM;
        the error's ``frames`` holds the frames completed by this call before the bad one. After
        any error the decoder holds nothing and refuses further feeds (``streamFailed``).
        """
        if self._failed:
            raise FrameError("streamFailed", "the stream already broke a framing rule")
        frames: list[bytes] = []
        start = 0
        end = len(data)
        while start < end:
            newline = data.find(NEWLINE, start)
            if newline == -1:
                self._hold(data, start, end, frames)
                break
            if len(self._buffer) + (newline - start) + 1 > self._limit:
                raise self._fail(FrameTooLargeError(self._limit, tuple(frames)))
            if self._buffer:
                self._buffer += data[start:newline]
                frame = bytes(self._buffer)
                self._buffer.clear()
            else:
                frame = bytes(data[start:newline])
            self._started_at = None
            rule = _broken_rule(frame)
            if rule is not None:
                raise self._fail(FrameError(rule[0], rule[1], tuple(frames)))
            frames.append(frame)
            start = newline + 1
        return frames

    def finish(self) -> None:
        """Declare the end of the stream; raise :class:`FrameError` if a frame is unfinished."""
        if self._buffer and not self._failed:
            raise self._fail(
                FrameError("truncatedFrame", "the stream ended in the middle of a frame")
            )

    def _hold(self, data: bytes, start: int, end: int, frames: list[bytes]) -> None:
        # A body of limit - 1 bytes still fits; one byte more cannot, whatever follows.
        if len(self._buffer) + (end - start) > self._limit - 1:
            raise self._fail(FrameTooLargeError(self._limit, tuple(frames)))
        if not self._buffer:
            self._started_at = self._clock()
        self._buffer += data[start:end]

    def _fail(self, error: FrameError) -> FrameError:
        self._failed = True
        self._buffer = bytearray()
        self._started_at = None
        return error


def check_frame(frame: bytes, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
    """Apply the decoder's per-frame rules to one frame body (without its newline).

    For frames that arrive already delimited (a test, a WebSocket message). Raises
    :class:`FrameTooLargeError` or :class:`FrameError`; a ``\\n`` inside the body is refused
    (``embeddedNewline``) because on a stream it would split the frame in two.
    """
    if len(frame) + 1 > max_frame_bytes:
        raise FrameTooLargeError(max_frame_bytes)
    if NEWLINE in frame:
        raise FrameError("embeddedNewline", "a frame body must not contain a newline")
    rule = _broken_rule(frame)
    if rule is not None:
        raise FrameError(*rule)


def encode_frame(value: object, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Return the canonical JSON of ``value`` followed by ``\\n``, ready to write.

    Raises :class:`piwf.errors.CanonicalJsonError` when ``value`` is not canonical-JSON
    encodable and :class:`FrameTooLargeError` when the frame would exceed the limit (the peer
    would refuse it; large values travel as content references instead).
    """
    frame = canonical.encode(value) + NEWLINE
    if len(frame) > max_frame_bytes:
        raise FrameTooLargeError(max_frame_bytes)
    return frame


def _broken_rule(frame: bytes) -> tuple[FrameErrorReason, str] | None:
    if not frame:
        return "emptyFrame", "empty frame"
    if frame.startswith(_UTF8_BOM):
        return "byteOrderMark", "a frame must not start with a byte-order mark"
    if frame.endswith(b"\r"):
        return "crlfTerminator", "frames end with LF, not CRLF"
    if b"\x00" in frame:
        return "nulByte", "a frame must not contain a NUL byte"
    return None
