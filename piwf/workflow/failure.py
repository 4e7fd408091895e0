"""What a failed node attempt records about its failure: one bounded, structured record.

The engine builds a :class:`NodeFailure` for every visit that ends ``failed``, ``timed_out`` or
``cancelled`` and sends it with :class:`~piwf.workflow.port.NodeFailed`; the port that commits
the visit stores it with the attempt. The record holds what the user's own code raised (its
type, its ``str()``, the file, line, function and source line of each frame), never a frame's
locals or variables, and every text in it is bounded::

    kind        exception   workflow code raised: errorType, message, traceback
                exit        a shell command ended non-zero: exitCode or signal, stderrTail
                timedOut    the deadline passed (no traceback)
                cancelled   the run was cancelled (no traceback)
                reported    piwf failed the visit itself (output not JSON, an effect key
                            conflict, an agent that gave up): message only

    message     at most MAX_MESSAGE_BYTES of UTF-8; messageCut when longer
    traceback   the newest MAX_TRACEBACK_FRAMES frames, newest last, at most
                MAX_TRACEBACK_BYTES; older frames are cut with one marker line first
                (tracebackCut); piwf's own calling frames before the user's code are dropped
    stderrTail  the last MAX_STDERR_LINES lines and at most MAX_STDERR_BYTES of stderr
                (stderrCut when earlier output was left out)

Texts are made valid Unicode (a lone surrogate becomes ``?``) so a record always crosses a
canonical-JSON transport.
"""

from __future__ import annotations

import traceback as tracebacks
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from piwf.lifecycle import StrEnum
from piwf.workflow.context import Outcome

MAX_MESSAGE_BYTES: Final = 4 * 1024
MAX_TRACEBACK_FRAMES: Final = 32
MAX_TRACEBACK_BYTES: Final = 16 * 1024
MAX_STDERR_LINES: Final = 20
MAX_STDERR_BYTES: Final = 2 * 1024

#: Workflow files load under module names with this prefix (:mod:`piwf.workflow.sources`); an
#: exception class defined in one is named by its qualified name alone.
WORKFLOW_MODULE_PREFIX: Final = "_piwf_workflow_"

_PACKAGE = Path(__file__).resolve().parent.parent
#: The directories of piwf's own calling frames: the engine and the runner, not the built-in
#: workflows (which are workflow code like any other).
_INTERNAL_DIRS: Final = (_PACKAGE / "workflow", _PACKAGE / "runner")


class FailureKind(StrEnum):
    """What ended a failed visit (the closed set above)."""

    EXCEPTION = "exception"
    EXIT = "exit"
    TIMED_OUT = "timedOut"
    CANCELLED = "cancelled"
    REPORTED = "reported"


@dataclass(frozen=True)
class NodeFailure:
    """The failure record of one attempt (see the module docstring for each field's bound).

    ``error_type`` is the exception's qualified name (``KeyError``,
    ``myproject.errors.QuotaError``); ``exit_code`` and ``signal`` (``SIGKILL``) describe a
    shell command that ended non-zero.
    """

    kind: FailureKind
    message: str
    error_type: str | None = None
    message_cut: bool = False
    traceback: str | None = None
    traceback_cut: bool = False
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: str | None = None
    stderr_cut: bool = False


@dataclass(frozen=True)
class AttemptFailure:
    """The failure record of one attempt, with the visit it belongs to and how it ended."""

    path: str
    visit: int
    attempt: int
    outcome: Outcome
    failure: NodeFailure


def valid_text(text: str) -> str:
    """Return ``text`` as valid Unicode: each lone surrogate becomes ``?``."""
    return text.encode("utf-8", "replace").decode("utf-8")


def bounded_head(text: str, limit: int) -> tuple[str, bool]:
    """Return the first ``limit`` UTF-8 bytes of ``text`` (whole characters) and whether it
    was cut."""
    data = valid_text(text).encode("utf-8")
    if len(data) <= limit:
        return data.decode("utf-8"), False
    return data[:limit].decode("utf-8", "ignore"), True


def error_message(error: BaseException) -> str:
    """Return ``str(error)``, or a note when its ``__str__`` itself raises."""
    try:
        return str(error)
    except Exception as broken:
        return f"<str() of the exception raised {type(broken).__name__}>"


def error_type_name(error: BaseException) -> str:
    """Return the qualified name of ``error``'s class (builtins and workflow files: bare)."""
    cls = type(error)
    module = getattr(cls, "__module__", None) or ""
    if module == "builtins" or module.startswith(WORKFLOW_MODULE_PREFIX):
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def describe_error(error: BaseException) -> str:
    """Return ``Type: message`` for an error raised by workflow code.

    The message is kept whole (a long error text travels by content reference); only the
    failure record bounds it.
    """
    message = valid_text(error_message(error))
    name = type(error).__name__
    return f"{name}: {message}" if message else name


def exception_failure(error: BaseException, outcome: Outcome = Outcome.FAILED) -> NodeFailure:
    """Return the record of a visit whose code raised ``error`` and ended ``outcome``.

    A raise that ended the visit ``timed_out`` or ``cancelled`` (the code saw its signal)
    records that kind and the message, without a traceback.
    """
    message, cut = bounded_head(error_message(error), MAX_MESSAGE_BYTES)
    if outcome is not Outcome.FAILED:
        return NodeFailure(_STOPPED_KIND[outcome], message, message_cut=cut)
    text, traceback_cut = _chained_traceback(error)
    return NodeFailure(
        kind=FailureKind.EXCEPTION,
        message=message,
        error_type=error_type_name(error),
        message_cut=cut,
        traceback=text,
        traceback_cut=traceback_cut,
    )


def reported_failure(outcome: Outcome, text: str) -> NodeFailure:
    """Return the record of a visit piwf failed itself, or that timed out or was cancelled."""
    message, cut = bounded_head(text, MAX_MESSAGE_BYTES)
    return NodeFailure(_STOPPED_KIND.get(outcome, FailureKind.REPORTED), message, message_cut=cut)


def exit_failure(
    message: str, *, exit_code: int | None, signal: str | None, stderr_tail: str, stderr_cut: bool
) -> NodeFailure:
    """Return the record of a shell command that ended with ``exit_code`` or ``signal``."""
    bounded, cut = bounded_head(message, MAX_MESSAGE_BYTES)
    return NodeFailure(
        kind=FailureKind.EXIT,
        message=bounded,
        message_cut=cut,
        exit_code=exit_code,
        signal=signal,
        stderr_tail=valid_text(stderr_tail),
        stderr_cut=stderr_cut,
    )


_ENDED: Final = {
    Outcome.FAILED: "failed",
    Outcome.TIMED_OUT: "timed out",
    Outcome.CANCELLED: "was cancelled",
}


def node_error_text(path: str, visit: int, attempt: int, outcome: Outcome, error: str) -> str:
    """Return the run's error when the visit of ``path`` ended it: ``node "fetch" failed:
    KeyError: 'missing'``, naming the visit and attempt when either is above 1."""
    where = ", ".join(
        f"{label} {number}"
        for label, number in (("visit", visit), ("attempt", attempt))
        if number > 1
    )
    named = f'node "{path}"' + (f" ({where})" if where else "")
    return f"{named} {_ENDED.get(outcome, outcome.value)}: {error}"


def tail_lines(data: bytes, *, earlier_dropped: bool) -> tuple[str, bool]:
    """Return the last :data:`MAX_STDERR_LINES` lines of ``data`` within
    :data:`MAX_STDERR_BYTES`, and whether anything before them was left out.

    ``earlier_dropped`` says ``data`` is already the end of a longer stream; its first line is
    then partial and is dropped when a whole line follows it.
    """
    cut = earlier_dropped
    if len(data) > MAX_STDERR_BYTES:
        data, cut = data[-MAX_STDERR_BYTES:], True
    lines = data.decode("utf-8", "replace").splitlines()
    if cut and len(lines) > 1:
        lines = lines[1:]
    if len(lines) > MAX_STDERR_LINES:
        lines, cut = lines[-MAX_STDERR_LINES:], True
    return "\n".join(lines), cut


_STOPPED_KIND: Final = {
    Outcome.TIMED_OUT: FailureKind.TIMED_OUT,
    Outcome.CANCELLED: FailureKind.CANCELLED,
}


_CAUSE: Final = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT: Final = "\nDuring handling of the above exception, another exception occurred:\n\n"
#: The earlier exceptions of a chain (``raise ... from``, a raise inside ``except``) a record
#: keeps at most, newest first; each within what is left of MAX_TRACEBACK_BYTES.
MAX_CHAINED: Final = 4
_CHAINED_MESSAGE_BYTES: Final = 1024


def _chained_traceback(error: BaseException) -> tuple[str | None, bool]:
    """Format ``error``'s frames preceded, as Python prints them, by the exceptions it was
    raised from or while handling (each with its ``Type: message`` line and the separator
    line Python writes), newest kept first within the same bounds."""
    text, cut = _bounded_traceback(error.__traceback__)
    body = text or ""
    size = len(body.encode("utf-8"))
    seen = {id(error)}
    current = error
    for _ in range(MAX_CHAINED + 1):
        earlier, separator = _earlier(current)
        if earlier is None or id(earlier) in seen:
            return body or None, cut
        seen.add(id(earlier))
        frames, _ = _bounded_traceback(earlier.__traceback__)
        message, _ = bounded_head(error_message(earlier), _CHAINED_MESSAGE_BYTES)
        name = error_type_name(earlier)
        section = f"{frames or ''}{name}: {message}\n" if message else f"{frames or ''}{name}\n"
        section = valid_text(section) + separator
        added = len(section.encode("utf-8"))
        if len(seen) > MAX_CHAINED + 1 or size + added > MAX_TRACEBACK_BYTES - 256:
            return f"  ... earlier chained exceptions cut\n{separator}{body}", True
        body, size, current = section + body, size + added, earlier
    return body or None, cut


def _earlier(error: BaseException) -> tuple[BaseException | None, str]:
    """The exception ``error`` was raised from (``__cause__``) or while handling (an
    unsuppressed ``__context__``), with the line Python prints between them."""
    if error.__cause__ is not None:
        return error.__cause__, _CAUSE
    if error.__context__ is not None and not error.__suppress_context__:
        return error.__context__, _CONTEXT
    return None, ""


def _bounded_traceback(tb: TracebackType | None) -> tuple[str | None, bool]:
    """Format the frames of ``tb`` newest last, cut to the bounds from the oldest end."""
    frames = list(tracebacks.walk_tb(tb))
    while frames and _internal(frames[0][0].f_code.co_filename):
        frames.pop(0)
    if not frames:
        return None, False
    total = len(frames)
    summary = tracebacks.StackSummary.extract(
        iter(frames[-MAX_TRACEBACK_FRAMES:]), capture_locals=False
    )
    entries = [_format_frame(item) for item in summary]
    budget = MAX_TRACEBACK_BYTES - 256  # room for the marker lines
    size = sum(len(entry.encode("utf-8")) for entry in entries)
    while len(entries) > 1 and size > budget:
        size -= len(entries.pop(0).encode("utf-8"))
    marks = []
    dropped = total - len(entries)
    if dropped:
        marks.append(f"  ... {dropped} older frames cut; the newest {len(entries)} follow\n")
    if size > budget:  # one frame alone is too long: keep its end (the line it stopped at)
        entries = [entries[0].encode("utf-8")[-budget:].decode("utf-8", "ignore")]
        marks.append(f"  ... the frame below is cut to its last {budget} bytes\n")
    return "".join(marks + entries), bool(marks)


def _format_frame(frame: tracebacks.FrameSummary) -> str:
    """One frame as Python prints it: file, line and function, then the source line."""
    text = f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n'
    if frame.line:
        text += f"    {frame.line.strip()}\n"
    return valid_text(text)


def _internal(filename: str) -> bool:
    try:
        parent = Path(filename).resolve().parent
    except (OSError, ValueError):
        return False
    return parent in _INTERNAL_DIRS
