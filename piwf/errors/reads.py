"""Errors of reading a run's referenced content and its logs (the ``ContentReadError`` and
``LogReadError`` branches of :mod:`piwf.errors`)."""

from __future__ import annotations

from piwf.errors.base import PiwfError


class ContentReadError(PiwfError):
    """A value sent by content reference could not be read (docs/PROTOCOL.md, ``view.content``)."""

    code = "contentRead"


class ContentReferenceError(ContentReadError):
    """A ``view.content`` request names a range the reference cannot serve (rejected)."""

    code = "contentReference"


class ContentNotFoundError(ContentReadError):
    """The reference names no stored value of its run or resource (notFound): a made-up or
    foreign digest, another media type or length, or a value deleted since it was advertised."""

    code = "contentNotFound"


class ContentMismatchError(ContentReadError):
    """The client assembled parts that do not match their reference (length, digest, media
    type or encoding); no partial value is ever returned. Read the value again."""

    code = "contentMismatch"


class LogReadError(PiwfError):
    """A ``run.logs`` read names something the run's logs cannot serve; nothing changed."""

    code = "logRead"


class NodeNotInRunError(LogReadError):
    """The run's workflow has no node of that path; the message names the ones it has."""

    code = "nodeNotFound"


class LogCursorError(LogReadError):
    """A log cursor names no attempt log of the run, or an offset past its end."""

    code = "logCursor"
