"""piwf.server.failures: what a failure becomes, what the log keeps, how retries are spaced."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from piwf.errors import (
    BackupError,
    ClaimLostError,
    InternalError,
    RunCommandError,
    StateCorruptError,
    StateFullError,
    StateIoError,
)
from piwf.protocol.client_v1 import Request, Response
from piwf.server.failures import (
    RetryDelay,
    answering,
    failure_response,
    outcome_of,
    retry_later,
    typed_failure,
)

SECRET = "/home/someone/private/backup.sqlite"
MALFORMED = "database disk image is malformed"


def request(operation: str = "state.backup") -> Request:
    return Request(
        request_id="req-1",
        client_id="client-1",
        operation=operation,  # type: ignore[arg-type]
        idempotency_key="key-1",
        payload={"destination": SECRET},
    )


@pytest.mark.parametrize(
    ("error", "typed", "outcome"),
    [
        (sqlite3.OperationalError("database or disk is full"), StateFullError, "unavailable"),
        (
            sqlite3.DatabaseError("database disk image is malformed"),
            StateCorruptError,
            "unavailable",
        ),
        (OSError(5, "Input/output error", SECRET), StateIoError, "unavailable"),
        (KeyError(SECRET), InternalError, "rejected"),
        (BackupError("the backup directory does not exist"), BackupError, "rejected"),
        (RunCommandError("run run-1 cannot be paused"), RunCommandError, "rejected"),
        (ClaimLostError("expired", "server", 3), ClaimLostError, "unavailable"),
        (ClaimLostError("expired", "run:run-1", 3), ClaimLostError, "rejected"),
    ],
)
def test_each_failure_has_one_typed_error_and_outcome(
    error: Exception, typed: type[Exception], outcome: str
) -> None:
    failure = typed_failure(error, "state.backup")
    assert type(failure) is typed
    assert outcome_of(failure) == outcome
    assert SECRET not in str(failure)


def test_an_internal_error_names_the_operation_and_class_only() -> None:
    failure = typed_failure(ValueError(f"bad {SECRET}"), "run.list")
    assert str(failure).startswith("run.list failed inside the server (ValueError)")
    assert SECRET not in str(failure)


def test_answering_replies_once_with_the_typed_error_and_logs_one_safe_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers: list[Response] = []
    caplog.set_level(logging.INFO, logger="piwf.server")
    with answering(request(), answers.append):
        raise OSError(28, "No space left on device", SECRET)
    (answer,) = answers
    assert answer.outcome == "unavailable" and answer.error is not None
    assert answer.error.code == "stateFull"
    assert "ENOSPC: No space left on device" in answer.error.message
    (record,) = caplog.records
    line = record.getMessage()
    assert line.startswith("state.backup failed: stateFull: ")
    assert SECRET not in line and record.exc_info is None, "no payload, no traceback"


def test_an_ordinary_refusal_is_answered_but_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="piwf.server")
    answer = failure_response(request("run.pause"), RunCommandError("run run-1 is finished"))
    assert (answer.outcome, answer.error and answer.error.code) == ("rejected", "runCommand")
    assert caplog.records == []


def test_a_block_that_succeeds_is_left_alone() -> None:
    answers: list[Response] = []
    with answering(request(), answers.append):
        pass
    assert answers == []


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(message: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("piwf.server", level, __file__, 1, message, args, None)


def test_retry_delays_grow_to_a_cap_and_reset_after_a_success() -> None:
    delay = RetryDelay()
    assert [delay.next_s() for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    delay.reset()
    assert delay.next_s() == 0.1


def test_retry_later_runs_again_while_wanted_and_resets_once_through() -> None:
    scheduled: list[tuple[float, object]] = []
    delay = RetryDelay()
    outcomes = iter([False, True])  # fails once more, then goes through
    wanted = True

    def again() -> None:
        if not next(outcomes):
            retry_later(lambda s, f: scheduled.append((s, f)), delay, lambda: wanted, again)

    retry_later(lambda s, f: scheduled.append((s, f)), delay, lambda: wanted, again)
    first_delay, first = scheduled.pop(0)
    first()  # type: ignore[operator]
    second_delay, second = scheduled.pop(0)
    assert (first_delay, second_delay) == (0.1, 0.2)
    second()  # type: ignore[operator]
    assert scheduled == [] and delay.attempts == 0, "through: the next failure starts at 0.1 s"
    wanted = False
    retry_later(lambda s, f: scheduled.append((s, f)), delay, lambda: wanted, again)
    scheduled.pop(0)[1]()  # type: ignore[operator]
    assert scheduled == [], "no longer wanted: nothing runs"
