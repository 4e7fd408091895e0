"""The root of the error tree and the errors any layer raises about what it was given or could
not do: a value that is not canonical JSON, an argument a call cannot take, a bug inside the
server, an optional extra that is not installed. The tree is drawn in :mod:`piwf.errors`."""

from __future__ import annotations

from typing import ClassVar


class PiwfError(Exception):
    """Base class of every error piwf raises on purpose; ``code`` is stable on the wire."""

    code: ClassVar[str] = "piwfError"


class CanonicalJsonError(PiwfError, ValueError):
    """A value or text is not canonical JSON; ``reason`` names the broken rule."""

    code = "invalidJson"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.path: list[str] = []  # where the refused part sits, innermost step first


class InvalidArgumentError(PiwfError, ValueError):
    """A call was given an argument it cannot take (wrong type, out of range, too large); nothing
    was sent. The message names each argument and what it allows, never the value given."""

    code = "invalidArgument"


class RequestTooLargeError(InvalidArgumentError):
    """A request (a run's input, an answer) would not fit its 1 MiB frame; nothing was sent."""

    code = "requestTooLarge"


class InternalError(PiwfError):
    """An unexpected failure inside the server (a bug); the operation was undone and nothing
    was stored. The message names the operation and the exception class, never its text."""

    code = "internalError"


class MissingExtraError(PiwfError):
    """A command needs an optional extra that is not installed; the message names the
    ``pip install 'piwf[...]'`` that brings it."""

    code = "missingExtra"
