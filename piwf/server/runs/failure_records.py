"""The wire form of the failure records of a run's attempts (``run.get``, the run view).

A record is what the engine kept of an attempt that failed, timed out or was cancelled: its
type, message and traceback (bounded by the engine), or a shell command's exit and the end of
its stderr. These read it through :mod:`piwf.state.execution.attempts` and never change it.
"""

from __future__ import annotations

from piwf.lifecycle import RunStatus
from piwf.protocol.payloads import FailedOutcome, NodeFailureInfo
from piwf.state import Transaction
from piwf.state.execution import attempts
from piwf.state.execution import runs as run_store
from piwf.workflow.context import Outcome
from piwf.workflow.failure import AttemptFailure

_FAILED_OUTCOMES: dict[Outcome, FailedOutcome] = {
    Outcome.FAILED: "failed",
    Outcome.TIMED_OUT: "timed_out",
    Outcome.CANCELLED: "cancelled",
}


def run_failure(tx: Transaction, view: run_store.RunRow) -> NodeFailureInfo | None:
    """The failure record of the node that ended ``view``, when a node's failure ended it.

    Only a finished run that did not complete has one: the record of its last step, which is
    the visit that ended it (bounded by the engine, so the answer stays small).
    """
    if view.finished_at is None or view.status is RunStatus.COMPLETED:
        return None
    found = attempts.last_step_failure(tx, view.run_id)
    return None if found is None else failure_info(found)


def step_failure(tx: Transaction, attempt: attempts.AttemptRow) -> NodeFailureInfo | None:
    """The failure record of one finished attempt (a step of the run view), if it kept one."""
    found = attempts.failure_of_attempt(tx, attempt)
    return None if found is None else failure_info(found)


def failure_info(found: AttemptFailure) -> NodeFailureInfo:
    """The wire form of one attempt's failure record."""
    failure = found.failure
    return NodeFailureInfo(
        path=found.path,
        visit=found.visit,
        attempt=found.attempt,
        outcome=_FAILED_OUTCOMES[found.outcome],
        kind=failure.kind.value,
        message=failure.message,
        error_type=failure.error_type,
        message_cut=failure.message_cut,
        traceback=failure.traceback,
        traceback_cut=failure.traceback_cut,
        exit_code=failure.exit_code,
        signal=failure.signal,
        stderr_tail=failure.stderr_tail,
        stderr_cut=failure.stderr_cut,
    )
