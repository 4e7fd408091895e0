"""Errors of the wire protocols: framing and message validation.

Each class carries a stable wire ``code`` and a ``reason`` naming the exact rule that was broken::

    PiwfError
    ├── CanonicalJsonError            invalidJson     (piwf.errors; text is not canonical JSON)
    └── ProtocolError                 protocolError
        ├── FrameError                badFrame        (reason: FrameErrorReason)
        │   └── FrameTooLargeError    frameTooLarge   (limit: the frame limit in bytes)
        └── InvalidMessageError       invalidMessage  (field, reason: InvalidMessageReason)

Every one of them means the peer broke the protocol, and the receiver closes that one connection.
A :class:`FrameError` also means the byte stream has lost its frame boundaries, so no later byte
of that stream can be trusted.

Messages and attributes never contain frame bytes or field values: they name the rule and, for
:class:`InvalidMessageError`, the wire field (an unknown field name is reduced to a short,
printable form first), so they are safe to log and to send back to the peer.
"""

from __future__ import annotations

from typing import Literal

from piwf.errors import PiwfError

FrameErrorReason = Literal[
    "byteOrderMark",
    "crlfTerminator",
    "embeddedNewline",
    "emptyFrame",
    "nulByte",
    "streamFailed",
    "tooLarge",
    "truncatedFrame",
]
InvalidMessageReason = Literal[
    "invalidValue",
    "missingField",
    "notAnObject",
    "unexpectedField",
    "unexpectedType",
    "unknownField",
    "unknownType",
    "wrongSchema",
    "wrongType",
]


class ProtocolError(PiwfError):
    """The peer broke a wire protocol; the connection that carried it must be closed."""

    code = "protocolError"


class FrameError(ProtocolError):
    """A frame broke a framing rule; ``reason`` names the rule.

    ``frames`` holds the complete, valid frames that the same :meth:`FrameDecoder.feed
    <piwf.protocol.framing.FrameDecoder.feed>` call split off before it met the bad one, in order,
    so a receiver may still answer them before it closes the connection.
    """

    code = "badFrame"

    def __init__(
        self, reason: FrameErrorReason, message: str, frames: tuple[bytes, ...] = ()
    ) -> None:
        super().__init__(message)
        self.reason: FrameErrorReason = reason
        self.frames = frames


class FrameTooLargeError(FrameError):
    """A frame, newline included, is longer than ``limit`` bytes."""

    code = "frameTooLarge"

    def __init__(self, limit: int, frames: tuple[bytes, ...] = ()) -> None:
        super().__init__(
            "tooLarge", f"frame exceeds the limit of {limit} bytes (newline included)", frames
        )
        self.limit = limit


class InvalidMessageError(ProtocolError):
    """A canonical JSON frame is not a valid message.

    ``field`` is the wire path of the offending field (``"idempotencyKey"``, ``"error.code"``),
    or ``""`` when the frame as a whole is wrong; ``reason`` names the broken rule.
    """

    code = "invalidMessage"

    def __init__(self, field: str, reason: InvalidMessageReason, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.reason: InvalidMessageReason = reason
