"""Every failed request gets a typed answer at once; every failure is logged in one safe line.

Handlers, deferred replies (a resolver's answer, a ``run.wait`` timer) and loop duties meet
the same failures; this module decides what each one becomes::

    raised                                   typed error               outcome       stored
    StateUnavailableError (full, I/O,        itself                    unavailable   no
      damaged, locked database)
    ClaimLostError of the server epoch       itself                    unavailable   no
    BackupError (a destination to fix)       itself                    rejected      by handler
    any other PiwfError                      itself                    rejected      by handler
    sqlite3.Error, OSError                   StateUnavailableError     unavailable   no
                                             (piwf.state.failures)
    anything else (a bug)                    InternalError             rejected      no

The log line names the operation, the error code and a reason that holds no payload value, no
path from a request and no traceback: a state error's own message (built from SQLite's result
name or ``ENAME: strerror``), else only the exception's class. Repeats of one warning are
bounded by the server log's rate limit (:mod:`piwf.server.server_log`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from piwf.errors import (
    BackupError,
    ClaimLostError,
    InternalError,
    PiwfError,
    StateUnavailableError,
)
from piwf.protocol.client_v1 import ErrorInfo, Outcome, Request, Response
from piwf.state.failures import state_error_of
from piwf.state.server_epoch import SERVER_RESOURCE

log = logging.getLogger("piwf.server")

Reply = Callable[[Response], None]

#: Longest reason written to the log.
MAX_REASON_CHARS = 300


def typed_failure(error: Exception, operation: str) -> PiwfError:
    """The typed error of an exception raised while serving ``operation``."""
    if isinstance(error, PiwfError):
        return error
    typed = state_error_of(error, operation)
    if typed is not None:
        return typed
    return InternalError(
        f"{operation} failed inside the server ({type(error).__name__}); nothing was changed. "
        "Retrying will likely fail the same way: report it with the server log"
    )


def outcome_of(error: PiwfError) -> Outcome:
    """``unavailable`` when retrying later can succeed with nothing to fix, else ``rejected``."""
    if isinstance(error, StateUnavailableError):
        return "unavailable"
    if isinstance(error, ClaimLostError) and error.resource_id == SERVER_RESOURCE:
        return "unavailable"
    return "rejected"


def is_server_failure(error: PiwfError) -> bool:
    """Whether ``error`` is the server's trouble (logged) rather than a refused request."""
    return isinstance(error, (StateUnavailableError, InternalError, BackupError, ClaimLostError))


def safe_reason(error: PiwfError) -> str:
    """A reason for the log: the message of errors whose text piwf builds itself (state
    failures, backup refusals, internal errors), else the class name only."""
    if isinstance(error, (StateUnavailableError, InternalError, BackupError)):
        return str(error)[:MAX_REASON_CHARS]
    return type(error).__name__


def log_failure(what: str, error: PiwfError) -> None:
    """Log one bounded line about a failure of the server's own (no payload, no traceback)."""
    log.warning("%s failed: %s: %s", what, error.code, safe_reason(error))


def failure_response(request: Request, error: Exception) -> Response:
    """The typed answer to ``request`` after ``error``; server failures are logged once."""
    typed = typed_failure(error, request.operation)
    if is_server_failure(typed):
        log_failure(request.operation, typed)
    return Response(
        request_id=request.request_id, outcome=outcome_of(typed), error=ErrorInfo.of(typed)
    )


@contextmanager
def answering(request: Request, reply: Reply) -> Iterator[None]:
    """Run a block that serves ``request``; if it raises, answer the typed failure instead.

    A block that already answered keeps its answer (a reply is sent at most once by the loop).
    """
    try:
        yield
    except Exception as error:
        reply(failure_response(request, error))


@dataclass
class RetryDelay:
    """Delays between retries of one duty while the database cannot serve: 0.1 s doubling to
    at most 2 s, back to the start after a success (bounded rate, no tight loop)."""

    first_s: float = 0.1
    max_s: float = 2.0
    attempts: int = 0

    def next_s(self) -> float:
        """The delay before the next retry."""
        delay: float = min(self.max_s, self.first_s * float(2**self.attempts))
        self.attempts = min(self.attempts + 1, 16)
        return delay

    def reset(self) -> None:
        """The duty succeeded: the next failure starts from the first delay again."""
        self.attempts = 0


def retry_later(
    call_later: Callable[[float, Callable[[], None]], object],
    delay: RetryDelay,
    wanted: Callable[[], bool],
    again: Callable[[], object],
) -> None:
    """Run ``again`` after ``delay``'s next wait if it is still ``wanted`` then; a run of
    ``again`` that needed no further retry resets the delay."""

    def retry() -> None:
        if not wanted():
            return
        scheduled = delay.attempts
        again()
        if delay.attempts == scheduled:  # it went through this time
            delay.reset()

    call_later(delay.next_s(), retry)
