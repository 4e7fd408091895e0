"""How a runner's command stops: interactive requests, parking and the terminal finish.

Same transaction contract as :mod:`piwf.state.execution.visits` (claim renewed first, one run
revision and one event per change, the shared results). The request lifecycle here is the minimal
the decision and submission transitions build on::

    request_interaction ─▶ pending ─(answer, timeout policy, accepted submission)─▶ answered
                                                                   ─node_finished─▶ settled
    pending | answered ─node_failed, finish, cancel─▶ cancelled

(an agent request's submissions are validated outside the runner:
:mod:`piwf.state.execution.submissions`).

``park`` and ``finish`` release the run claim in the same transaction as their change, so a
parked or finished run never keeps a live claim.
"""

from __future__ import annotations

from piwf.lifecycle import Adopted, Applied, Conflict, InteractionKind, RunStatus
from piwf.state import blobs, decisions
from piwf.state.database import Transaction
from piwf.state.enums import (
    AttemptStatus,
    DecisionKind,
    FailureClass,
    InteractionStatus,
    QueueStatus,
)
from piwf.state.execution import attempts, messages, queue, requests, runs, turns
from piwf.state.execution.core import (
    RUNNER_ACTOR,
    close_run_dependents,
    executing_run,
    record_run_change,
    require_run_claim,
    visit_attempt,
)
from piwf.state.leases import Claim, release_claim
from piwf.workflow import port
from piwf.workflow.port import Committed

#: Requests a person (or a client, for a checkpoint) answers get an audited decision row.
_DECISION_KINDS = {
    InteractionKind.CHECKPOINT: DecisionKind.CHECKPOINT,
    InteractionKind.HUMAN_DECISION: DecisionKind.HUMAN_DECISION,
}

_TERMINAL = {
    RunStatus.COMPLETED: (RunStatus.COMPLETED, QueueStatus.DONE, AttemptStatus.FAILED),
    RunStatus.FAILED: (RunStatus.FAILED, QueueStatus.FAILED, AttemptStatus.FAILED),
    RunStatus.TIMED_OUT: (RunStatus.TIMED_OUT, QueueStatus.FAILED, AttemptStatus.TIMED_OUT),
    RunStatus.CANCELLED: (
        RunStatus.CANCELLED,
        QueueStatus.CANCELLED,
        AttemptStatus.CANCELLED,
    ),
}


def apply_request_interaction(
    tx: Transaction, claim: Claim, message: port.InteractionRequested, *, lease_ms: int
) -> port.PortResult:
    """Commit the pending request of the active visit; the attempt becomes ``waiting``.

    The run stays ``running`` until the engine parks it. A repeat of the same request is
    ``Adopted``; the same id with other content, a second request of the attempt or a visit
    that is not active is a ``Conflict``. Event ``interaction.requested``. A checkpoint or a
    human decision also opens its audited decision (:mod:`piwf.state.decisions`) with the
    absolute deadline of its timeout policy, in the same transaction.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    kind = message.kind
    if message.timeout_ms is not None and message.timeout_ms <= 0:
        return Conflict("timeout_ms must be positive")
    active = visit_attempt(tx, run, message.path, message.visit)
    if isinstance(active, Conflict):
        return active
    content_hash = blobs.put_json(tx, message.content)
    on_timeout_hash = None if message.on_timeout is None else blobs.put_json(tx, message.on_timeout)
    existing = requests.get_request(tx, message.request_id)
    if existing is not None:
        same = (
            existing.attempt_id == active.attempt_id
            and existing.kind is kind
            and existing.content_hash == content_hash
            and existing.on_timeout_hash == on_timeout_hash
            and existing.timeout_ms == message.timeout_ms
        )
        if same:
            return Adopted(Committed(run.revision))
        return Conflict(f"request {message.request_id} exists with other content")
    other = requests.open_request(tx, active.attempt_id)
    if other is not None:
        return Conflict(f"visit already has request {other.request_id}")
    payload = {"requestId": message.request_id, "kind": kind.value}
    revision = record_run_change(tx, run, "interaction.requested", RUNNER_ACTOR, claim, payload)
    requests.insert_request(
        tx,
        request_id=message.request_id,
        run_id=run.run_id,
        attempt_id=active.attempt_id,
        kind=kind,
        content_hash=content_hash,
        on_timeout_hash=on_timeout_hash,
        timeout_ms=message.timeout_ms,
    )
    attempts.set_waiting(tx, active.attempt_id)
    messages.request_opened(tx, run.run_id, message.request_id, kind, message.content)
    decision_kind = _DECISION_KINDS.get(kind)
    if decision_kind is not None:
        decisions.open_decision_in(
            tx,
            request_id=message.request_id,
            run_id=run.run_id,
            kind=decision_kind,
            content=message.content,
            on_timeout=message.on_timeout,
            actor=RUNNER_ACTOR,
            claim=claim,
        )
    return Applied(Committed(revision))


def apply_park(
    tx: Transaction, claim: Claim, message: port.RunParked, *, lease_ms: int
) -> port.PortResult:
    """Stop the run without a terminal status and release the claim, in one change.

    - ``waiting``: the active visit's request must be open. A pending request makes the run
      ``waiting`` with queue ``parked`` (event ``run.waiting``); an already answered one keeps
      it ``running`` with queue ``parked`` and available now, so a resume consumes the answer
      (event ``run.parked``).
    - ``effectAmbiguous``: the run must have an ambiguous effect; it stays ``running`` with
      queue ``parked`` and error ``effectAmbiguous`` (detail as the queue's error text) until an
      operator resolves the effect and resumes (event ``run.effect_ambiguous``).
    - ``timer``: ``wake_at_ms`` must be the active attempt's committed wake time (a timer visit,
      which then waits, or a retry's pending try); the run stays ``running`` with queue
      ``parked`` and available at that instant, so the scheduler resumes it then and no child
      or slot is held meanwhile (event ``run.sleeping``).

    The active attempt stays open in both cases (the next runner retries or consumes it).
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    active = visit_attempt(tx, run, message.path, message.visit)
    if isinstance(active, Conflict):
        return active
    payload = {"reason": message.reason.value, "path": message.path, "visit": message.visit}
    if message.reason is port.ParkReason.WAITING:
        request = requests.open_request(tx, active.attempt_id)
        if request is None or message.request_id not in (None, request.request_id):
            return Conflict(f"visit {message.visit} of {message.path!r} has no open request")
        answered = request.status is InteractionStatus.ANSWERED
        event = "run.parked" if answered else "run.waiting"
        revision = record_run_change(tx, run, event, RUNNER_ACTOR, claim, payload)
        if not answered:
            runs.set_status(tx, run.run_id, RunStatus.WAITING)
        queue.set_queue(tx, run.run_id, QueueStatus.PARKED, available_now=answered)
    elif message.reason is port.ParkReason.TIMER:
        if message.wake_at_ms is None or message.wake_at_ms != active.wake_at:
            return Conflict(f"visit {message.visit} of {message.path!r} has no such wake time")
        payload["wakeAt"] = message.wake_at_ms
        revision = record_run_change(tx, run, "run.sleeping", RUNNER_ACTOR, claim, payload)
        if active.status is AttemptStatus.RUNNING:
            attempts.set_waiting(tx, active.attempt_id)
        queue.set_queue(tx, run.run_id, QueueStatus.PARKED)
        queue.delay(tx, run.run_id, message.wake_at_ms)
    else:
        if not run.has_ambiguous_effect:
            return Conflict(f"run {run.run_id} has no ambiguous effect")
        revision = record_run_change(tx, run, "run.effect_ambiguous", RUNNER_ACTOR, claim, payload)
        queue.set_queue(
            tx,
            run.run_id,
            QueueStatus.PARKED,
            error_code=FailureClass.EFFECT_AMBIGUOUS,
            error_text=message.detail,
        )
    release_claim(tx, claim)
    return Applied(Committed(revision))


def apply_finish(
    tx: Transaction, claim: Claim, message: port.RunFinished, *, lease_ms: int
) -> port.PortResult:
    """Give the run its terminal status and release the claim, in one change.

    ``completed`` stores the final output (JSON blob); ``failed``/``timed_out``/``cancelled``
    store the error (text blob; the status name when the engine sent none). The queue row becomes
    ``done``/``failed``/``cancelled`` (error code ``nodeFailed`` for a failed run, or
    ``inputRejected`` when the message says the workflow refused the run's input). Whatever is
    still open is closed in the same change: the active attempt, open requests, pending effects
    (``cancelled``) and applying ones (``ambiguous``). A ``completed`` finish with an active
    visit, or a non-terminal status, is a ``Conflict``. Event ``run.<status>``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    terminal = _TERMINAL.get(message.status)
    if terminal is None:
        return Conflict(f"{message.status.value} is not a terminal status")
    status, queue_status, attempt_status = terminal
    if status is RunStatus.COMPLETED and attempts.active_attempt(tx, run.run_id) is not None:
        return Conflict(f"run {run.run_id} still has an active visit")
    output_hash = None
    error_hash = None
    if status is RunStatus.COMPLETED:
        output_hash = blobs.put_json(tx, message.output)
    else:
        error_hash = blobs.put_text(tx, message.error or status.value)
    payload = {"status": status.value, "path": message.path}
    revision = record_run_change(tx, run, f"run.{status.value}", RUNNER_ACTOR, claim, payload)
    close_run_dependents(tx, run, attempt_status=attempt_status, actor=RUNNER_ACTOR, claim=claim)
    runs.finish(tx, run.run_id, status, output_hash=output_hash, error_hash=error_hash)
    error = None if status is RunStatus.COMPLETED else (message.error or status.value)
    messages.run_ended(tx, run.run_id, status.value, output=message.output, error=error)
    turns.end_turns_of_run(tx, run.run_id)
    failure = None
    if status is RunStatus.FAILED:
        failure = (
            FailureClass.INPUT_REJECTED if message.input_rejected else FailureClass.NODE_FAILED
        )
    queue.set_queue(tx, run.run_id, queue_status, error_code=failure)
    release_claim(tx, claim)
    return Applied(Committed(revision))
