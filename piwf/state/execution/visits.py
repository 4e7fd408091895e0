"""The engine's port messages about node visits, applied durably (one transaction each).

Each ``apply_*`` function is one runner message, run inside the caller's ``BEGIN IMMEDIATE``
transaction (``with db.write() as tx``), in this order:

1. renew the exact live run claim (X1) or raise :class:`~piwf.errors.ClaimLostError` before
   anything is read or written;
2. verify the transition against the saved rows; a contradiction is a ``Conflict`` and writes
   nothing (a matching repeat is ``Adopted`` and writes nothing);
3. write blobs, bump the run revision once and append one event (``records.record_change``);
4. update the domain rows (attempts, steps, requests, updates, notifications, queue, run)
   through the modules that own them.

Results are the shared ones of :mod:`piwf.lifecycle` carrying a
:class:`~piwf.workflow.port.Committed` revision, so the server can answer the runner with them
unchanged. Visits follow seed 003's identity::

    node_started(V, 1)        no active attempt, V = last visit of the path + 1
    node_started(V, N+1)      attempt N of V is unfinished: N becomes ``interrupted``
    node_finished / failed    the active attempt closes and one ``run_steps`` row is appended
    request_interaction       the active attempt becomes ``waiting`` with one open request

Requests, parking and the finish live in :mod:`piwf.state.execution.outcomes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from piwf.lifecycle import Adopted, Applied, CommandKind, Conflict, Lineage, RunStatus
from piwf.state import blobs, decisions
from piwf.state.database import Transaction
from piwf.state.enums import AttemptStatus, FailureClass, InteractionStatus, QueueStatus
from piwf.state.execution import (
    attempts,
    messages,
    queue,
    requests,
    runners,
    runs,
    settings,
    updates,
)
from piwf.state.execution.attempts import AttemptRow
from piwf.state.execution.core import (
    RUNNER_ACTOR,
    executing_run,
    record_run_change,
    require_run_claim,
    visit_attempt,
)
from piwf.state.execution.runs import RunRow
from piwf.state.leases import Claim
from piwf.workflow import port
from piwf.workflow.context import Outcome
from piwf.workflow.port import Committed

_OUTCOME_OF_STATUS = {
    AttemptStatus.COMPLETED: Outcome.OK,
    AttemptStatus.FAILED: Outcome.FAILED,
    AttemptStatus.TIMED_OUT: Outcome.TIMED_OUT,
    AttemptStatus.CANCELLED: Outcome.CANCELLED,
}

_FAILURE_STATUS = {
    Outcome.FAILED: AttemptStatus.FAILED,
    Outcome.TIMED_OUT: AttemptStatus.TIMED_OUT,
    Outcome.CANCELLED: AttemptStatus.CANCELLED,
}


#: What one step's fields cost in a page beyond its output and error, for page budgets.
STEP_RECORD_BYTES = 256


@dataclass(frozen=True)
class SavedRunHead:
    """A saved run whose ``saved.steps`` are the first of its ``step_count`` steps; the rest
    are read with :func:`read_saved_steps` (steps are append-only, so pages read later are
    exactly the steps this head counted)."""

    saved: port.SavedRun
    step_count: int

    @property
    def complete(self) -> bool:
        """Whether ``saved`` carries every step."""
        return len(self.saved.steps) == self.step_count


def read_saved_run(tx: Transaction, run_id: str) -> port.SavedRun | None:
    """Return everything the engine may know about ``run_id`` (``None`` when it does not exist).

    Read-only; any transaction. Status mapping: a run with no node attempt yet reads ``queued``
    (it is fresh, so ``start``/``restart`` fit even after it was claimed), a running run whose
    queue row is parked reads ``parked``; otherwise the run's own status. Steps come from
    ``run_steps`` in order, visits are the highest visit per path, the active visit is the one
    unfinished attempt and ``pending`` its open (pending or answered) request.
    """
    run = runs.load_run(tx, run_id)
    if run is None:
        return None
    steps = tuple(_step(tx, step) for step in attempts.list_steps(tx, run_id))
    return _saved_run(tx, run, steps)


def read_saved_run_head(tx: Transaction, run_id: str, budget: int) -> SavedRunHead | None:
    """Return :func:`read_saved_run`'s run with only its first steps (as
    :func:`read_saved_steps` pages them within ``budget`` bytes) and its step count; ``None``
    when the run does not exist. Read-only; any transaction."""
    run = runs.load_run(tx, run_id)
    if run is None:
        return None
    count = attempts.step_count(tx, run_id)
    steps = read_saved_steps(tx, run_id, 0, count, budget)
    return SavedRunHead(_saved_run(tx, run, steps), count)


def read_saved_steps(
    tx: Transaction, run_id: str, start: int, stop: int, budget: int
) -> tuple[port.StepRecord, ...]:
    """Return the run's steps from index ``start`` on, before ``stop``, in order: as many as
    fit in ``budget`` bytes (their stored outputs and errors plus :data:`STEP_RECORD_BYTES`
    each), and always the first when it exists, whatever its size. Empty when no step of
    that range exists (the run was deleted, or never had them). Read-only; any transaction."""
    if start >= stop:
        return ()
    limit = budget // STEP_RECORD_BYTES + 1
    chosen: list[port.StepRecord] = []
    used = 0
    for attempt, value_bytes in attempts.list_step_range(tx, run_id, start, stop, limit):
        cost = value_bytes + STEP_RECORD_BYTES
        if chosen and used + cost > budget:
            break
        chosen.append(_step(tx, attempt))
        used += cost
    return tuple(chosen)


def _saved_run(tx: Transaction, run: RunRow, steps: tuple[port.StepRecord, ...]) -> port.SavedRun:
    run_id = run.run_id
    active = attempts.active_attempt(tx, run_id)
    pending = None if active is None else _pending_request(tx, active)
    return port.SavedRun(
        run_id=run.run_id,
        status=_saved_status(run, attempts.attempt_count(tx, run_id)),
        input=blobs.read_json(tx, run.input_hash),
        lineage=run.lineage,
        parent_run_id=run.parent_run_id,
        restart_number=run.restart_number,
        definition_digest=run.definition_digest.hex(),
        steps=steps,
        visits=attempts.visits_by_path(tx, run_id),
        active=None
        if active is None
        else port.ActiveVisit(
            active.path,
            active.visit,
            active.attempt,
            active.started_at or 0,
            active.deadline_at,
            active.wake_at,
            attempts.failed_tries(tx, run_id, active.path, active.visit),
            settings.attempt_copy(tx, active.attempt_id),
        ),
        pending=pending,
        park_reason=_park_reason(run),
        output=None
        if run.final_output_hash is None
        else blobs.read_json(tx, run.final_output_hash),
        error=None if run.error_hash is None else blobs.read_text(tx, run.error_hash),
    )


def apply_begin_run(
    tx: Transaction, claim: Claim, message: port.RunBegun, *, lease_ms: int
) -> port.PortResult:
    """Accept the runner's command for the run; records the resolved title.

    The command must fit the saved run: ``start``/``restart`` need a fresh run of the matching
    lineage, ``resume``/``continue`` a run that has executed; the definition digest must be the
    run's. A begin that changes nothing (the run already has a title, or none was resolved) is
    ``Adopted`` and writes nothing, so a
    runner that only begins and dies does not count as progress. Event ``run.begun``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    if message.definition_digest != run.definition_digest.hex():
        return Conflict("definition digest differs from the run's")
    command = message.command
    fresh = attempts.attempt_count(tx, run.run_id) == 0
    if command in (CommandKind.START, CommandKind.RESTART):
        lineage = Lineage.RESTART if command is CommandKind.RESTART else Lineage.ROOT
        if not fresh:
            return Conflict(f"{command.value}: run {run.run_id} has already executed")
        if run.lineage is not lineage:
            return Conflict(f"{command.value}: run {run.run_id} has another lineage")
    elif fresh:
        return Conflict(f"{command.value}: run {run.run_id} has not started")
    # A title given when the run was started wins; the resolved one only fills an empty title.
    if message.title is None or run.title is not None:
        return Adopted(Committed(run.revision))
    payload = {"command": command.value}
    revision = record_run_change(tx, run, "run.begun", RUNNER_ACTOR, claim, payload)
    runs.set_title(tx, run.run_id, message.title)
    return Applied(Committed(revision))


def apply_node_started(
    tx: Transaction, claim: Claim, message: port.NodeStarted, *, lease_ms: int
) -> port.PortResult:
    """Open attempt 1 of a new visit, attempt N+1 of the unfinished visit (crash retry), or
    start the pending attempt a retry policy opened (its next try).

    A new visit must be the path's last visit + 1; a retry keeps the visit number, closes
    attempt N as ``interrupted`` and moves the live runner's no-progress baseline (a retry
    alone is not progress). The same open attempt again is ``Adopted``. A retry of a visit
    that waits on a request, or any other numbering, is a ``Conflict``. A timer visit commits
    its ``wake_at`` here; an attempt of a workflow with live settings is given (and keeps)
    its scope's newest copy. Event ``node.started``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    active = attempts.active_attempt(tx, run.run_id)
    interrupted: AttemptRow | None = None
    if active is not None:
        if (active.path, active.visit) != (message.path, message.visit):
            return Conflict(f"visit {active.visit} of {active.path!r} is still active")
        if message.attempt == active.attempt and active.status is AttemptStatus.PENDING:
            return _start_pending_try(tx, claim, run, active, message)
        if message.attempt == active.attempt:
            given = settings.attempt_copy(tx, active.attempt_id)
            return Adopted(Committed(run.revision, settings=given))
        if message.attempt != active.attempt + 1:
            return Conflict(f"attempt {message.attempt} does not follow attempt {active.attempt}")
        if active.status is AttemptStatus.WAITING:
            return Conflict(f"visit {active.visit} of {active.path!r} waits on a request")
        interrupted = active
    else:
        last = attempts.last_visit(tx, run.run_id, message.path)
        if (message.visit, message.attempt) != (last + 1, 1):
            return Conflict(
                f"visit {message.visit} attempt {message.attempt} of {message.path!r} is not next"
            )
    payload = {"path": message.path, "visit": message.visit, "attempt": message.attempt}
    revision = record_run_change(tx, run, "node.started", RUNNER_ACTOR, claim, payload)
    if interrupted is not None:
        attempts.interrupt(tx, interrupted.attempt_id)
        # Reopening a crashed visit is bookkeeping, not progress: it moves the live runner's
        # no-progress baseline, so a node that kills every runner is retried once, then parks
        # runnerNoProgress instead of looping.
        runners.move_progress_baseline(tx, run.run_id, revision)
    attempt_id = attempts.open_attempt(
        tx,
        run_id=run.run_id,
        path=message.path,
        visit=message.visit,
        attempt=message.attempt,
        node_type=message.kind,
        lease_generation=claim.generation,
        started_at=message.started_at_ms,
        deadline_at=message.deadline_ms,
        wake_at=message.wake_at_ms,
    )
    return Applied(Committed(revision, settings=_settings_copy(tx, run, attempt_id, message)))


def _settings_copy(
    tx: Transaction, run: RunRow, attempt_id: str, message: port.NodeStarted
) -> port.SettingsCopy | None:
    """The settings copy a starting attempt keeps (its scope created on first use)."""
    if message.settings is None:
        return None
    scope = settings.open_copy(tx, run.run_id, message.settings)
    return settings.stamp_attempt(tx, attempt_id, scope)


def _start_pending_try(
    tx: Transaction, claim: Claim, run: RunRow, active: AttemptRow, message: port.NodeStarted
) -> port.PortResult:
    """The pending attempt of a retry policy's next try starts (not before its wake time)."""
    if active.wake_at is not None and message.started_at_ms < active.wake_at:
        return Conflict(f"attempt {active.attempt} of {active.path!r} waits until {active.wake_at}")
    payload = {"path": message.path, "visit": message.visit, "attempt": message.attempt}
    revision = record_run_change(tx, run, "node.started", RUNNER_ACTOR, claim, payload)
    attempts.start_pending(
        tx,
        active,
        started_at=message.started_at_ms,
        deadline_at=message.deadline_ms,
        lease_generation=claim.generation,
    )
    copy = _settings_copy(tx, run, active.attempt_id, message)
    return Applied(Committed(revision, settings=copy))


def apply_node_finished(
    tx: Transaction, claim: Claim, message: port.NodeFinished, *, lease_ms: int
) -> port.PortResult:
    """Close the active attempt ``completed`` with its output blob and append its step.

    ``request_id`` must name the attempt's answered request (which becomes ``settled``), and
    must be absent when the attempt has no request. A settings route's finish is a
    ``Conflict`` (``settingsChanged``) when a newer settings change was accepted than the one
    it chose from. A finished node ends the run's crash streak. Event ``node.finished``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    active = _exact_active(tx, run, message.path, message.visit, message.attempt)
    if isinstance(active, Conflict):
        return active
    request = requests.open_request(tx, active.attempt_id)
    if request is not None:
        if request.request_id != message.request_id:
            return Conflict(f"request {request.request_id} is still open")
        if request.status is not InteractionStatus.ANSWERED:
            return Conflict(f"request {request.request_id} has no answer")
    elif message.request_id is not None:
        return Conflict(f"request {message.request_id} is not open")
    if message.settings_change_number is not None:
        newest = settings.newest_scope(tx, run.run_id, message.path.rpartition("/")[0])
        if newest is not None and newest.change_number != message.settings_change_number:
            return Conflict(
                f"{port.SETTINGS_CHANGED}: settings change {newest.change_number} was accepted"
                f" after change {message.settings_change_number} this route chose from"
            )
    output_hash = blobs.put_json(tx, message.output)
    payload = {"path": message.path, "visit": message.visit, "attempt": message.attempt}
    revision = record_run_change(tx, run, "node.finished", RUNNER_ACTOR, claim, payload)
    attempts.finish_attempt(
        tx,
        active,
        AttemptStatus.COMPLETED,
        finished_at=message.finished_at_ms,
        output_hash=output_hash,
    )
    if request is not None:
        requests.settle(tx, request.request_id)
    if run.consecutive_errors:  # read with the run in this transaction
        queue.end_crash_streak(tx, run.run_id)
    return Applied(Committed(revision))


def apply_node_failed(
    tx: Transaction, claim: Claim, message: port.NodeFailed, *, lease_ms: int
) -> port.PortResult:
    """Close the active attempt ``failed``/``timed_out``/``cancelled`` with an error text blob
    and, when the message carries one, its failure record (a JSON blob, ``failure_hash``).

    The step is appended (routing on ``$result.outcome`` replays it) and an open request of the
    attempt is cancelled. Outcome ``ok`` is a ``Conflict``. Event ``node.failed`` (its payload
    names the visit and outcome only: the record's texts are the user's and stay in blobs).

    With ``retry_at_ms`` (a retry policy tries again) no step is appended: the attempt closes
    with its failure and attempt + 1 opens ``pending`` until that instant, in the same change
    (event ``node.retrying``). A cancelled try, or an attempt with a request, is not retried.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    status = _FAILURE_STATUS.get(message.outcome)
    if status is None:
        return Conflict(f"outcome {message.outcome.value} is not a failure")
    active = _exact_active(tx, run, message.path, message.visit, message.attempt)
    if isinstance(active, Conflict):
        return active
    error_hash = blobs.put_text(tx, message.error)
    failure_hash = None if message.failure is None else attempts.store_failure(tx, message.failure)
    payload: dict[str, object] = {
        "path": message.path,
        "visit": message.visit,
        "attempt": message.attempt,
        "outcome": message.outcome.value,
    }
    if message.retry_at_ms is not None:
        return _retry_later(tx, claim, run, active, message, error_hash, failure_hash, payload)
    revision = record_run_change(tx, run, "node.failed", RUNNER_ACTOR, claim, payload)
    request = requests.open_request(tx, active.attempt_id)
    if request is not None:
        reason = f"visit {message.visit} of {message.path!r} ended {message.outcome.value}"
        decisions.cancel_unresolved_in(tx, run.run_id, reason=reason, actor=RUNNER_ACTOR)
        requests.cancel(tx, request.request_id)
    attempts.finish_attempt(
        tx,
        active,
        status,
        finished_at=message.finished_at_ms,
        error_hash=error_hash,
        failure_hash=failure_hash,
    )
    return Applied(Committed(revision))


def _retry_later(
    tx: Transaction,
    claim: Claim,
    run: RunRow,
    active: AttemptRow,
    message: port.NodeFailed,
    error_hash: bytes,
    failure_hash: bytes | None,
    payload: dict[str, object],
) -> port.PortResult:
    assert message.retry_at_ms is not None
    status = _FAILURE_STATUS[message.outcome]
    if status is AttemptStatus.CANCELLED or active.status is not AttemptStatus.RUNNING:
        return Conflict(f"attempt {message.attempt} of {message.path!r} cannot be retried")
    if requests.open_request(tx, active.attempt_id) is not None:
        return Conflict(f"attempt {message.attempt} of {message.path!r} has an open request")
    payload["retryAt"] = message.retry_at_ms
    revision = record_run_change(tx, run, "node.retrying", RUNNER_ACTOR, claim, payload)
    attempts.fail_try(
        tx,
        active,
        status,
        finished_at=message.finished_at_ms,
        error_hash=error_hash,
        failure_hash=failure_hash,
    )
    attempts.open_attempt(
        tx,
        run_id=run.run_id,
        path=message.path,
        visit=message.visit,
        attempt=message.attempt + 1,
        node_type=active.node_type,
        lease_generation=claim.generation,
        started_at=None,
        deadline_at=None,
        wake_at=message.retry_at_ms,
        pending=True,
    )
    return Applied(Committed(revision))


def apply_publish_update(
    tx: Transaction, claim: Claim, message: port.UpdatePublished, *, lease_ms: int
) -> port.PortResult:
    """Keep the latest update per (active attempt, type, key); it takes the attempt's next seq.

    The same data again is ``Adopted``. Names outside 1..256 characters, or a visit that is not
    the active one, are a ``Conflict``. Event ``node.update``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    if not (1 <= len(message.update_type) <= 256 and 1 <= len(message.key) <= 256):
        return Conflict("update type and key must have 1..256 characters")
    active = visit_attempt(tx, run, message.path, message.visit)
    if isinstance(active, Conflict):
        return active
    data_hash = blobs.put_json(tx, message.data)
    existing = updates.latest_update(tx, active.attempt_id, message.update_type, message.key)
    if existing is not None and existing.data_hash == data_hash:
        return Adopted(Committed(run.revision))
    payload = {"path": message.path, "visit": message.visit, "updateType": message.update_type}
    revision = record_run_change(tx, run, "node.update", RUNNER_ACTOR, claim, payload)
    updates.publish_update(
        tx,
        attempt_id=active.attempt_id,
        update_type=message.update_type,
        key=message.key,
        data_hash=data_hash,
        run_revision=revision,
        replaces=existing,
    )
    return Applied(Committed(revision))


def apply_notify(
    tx: Transaction, claim: Claim, message: port.NotificationRequested, *, lease_ms: int
) -> port.PortResult:
    """Store one notification of the active visit under its stable id (text blob message).

    A repeat of the same notification is ``Adopted``; the same id with other content is a
    ``Conflict``. Event ``run.notification``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    existing = updates.get_notification(tx, message.notification_id)
    if existing is not None:
        same = (
            existing.run_id == run.run_id
            and (existing.path, existing.visit) == (message.path, message.visit)
            and existing.kind is message.kind
            and existing.message_hash == blobs.put_text(tx, message.message)
        )
        if same:
            return Adopted(Committed(run.revision))
        return Conflict(f"notification {message.notification_id} has other content")
    active = visit_attempt(tx, run, message.path, message.visit)
    if isinstance(active, Conflict):
        return active
    message_hash = blobs.put_text(tx, message.message)
    payload = {"notificationId": message.notification_id, "kind": message.kind.value}
    revision = record_run_change(tx, run, "run.notification", RUNNER_ACTOR, claim, payload)
    updates.insert_notification(
        tx,
        notification_id=message.notification_id,
        run_id=run.run_id,
        attempt_id=active.attempt_id,
        path=message.path,
        visit=message.visit,
        kind=message.kind,
        message_hash=message_hash,
        run_revision=revision,
    )
    messages.notified(tx, run.run_id, message.notification_id, message.kind.value, message.message)
    return Applied(Committed(revision))


def _exact_active(
    tx: Transaction, run: RunRow, path: str, visit: int, attempt: int
) -> AttemptRow | Conflict:
    active = visit_attempt(tx, run, path, visit)
    if isinstance(active, Conflict):
        return active
    if active.attempt != attempt:
        return Conflict(f"attempt {attempt} is not the active attempt {active.attempt}")
    return active


def _pending_request(tx: Transaction, active: AttemptRow) -> port.PendingRequest | None:
    request = requests.open_request(tx, active.attempt_id)
    if request is None:
        return None
    return port.PendingRequest(
        request_id=request.request_id,
        path=active.path,
        visit=active.visit,
        kind=request.kind,
        content=blobs.read_json(tx, request.content_hash),
        answered=request.status is InteractionStatus.ANSWERED,
        answer=None if request.answer_hash is None else blobs.read_json(tx, request.answer_hash),
        answered_by=request.answered_by,
    )


def _step(tx: Transaction, attempt: AttemptRow) -> port.StepRecord:
    assert attempt.finished_at is not None
    return port.StepRecord(
        path=attempt.path,
        visit=attempt.visit,
        attempt=attempt.attempt,
        outcome=_OUTCOME_OF_STATUS[attempt.status],
        output=None if attempt.output_hash is None else blobs.read_json(tx, attempt.output_hash),
        error=None if attempt.error_hash is None else blobs.read_text(tx, attempt.error_hash),
        started_at_ms=attempt.started_at or 0,
        finished_at_ms=attempt.finished_at,
    )


def _saved_status(run: RunRow, attempt_count: int) -> RunStatus:
    if run.status in (RunStatus.QUEUED, RunStatus.RUNNING) and attempt_count == 0:
        return RunStatus.QUEUED
    if run.status is RunStatus.RUNNING and run.queue_status is QueueStatus.PARKED:
        return RunStatus.PARKED
    return run.status


def _park_reason(run: RunRow) -> port.ParkReason | None:
    if run.status is RunStatus.WAITING:
        return port.ParkReason.WAITING
    if run.error_code == FailureClass.EFFECT_AMBIGUOUS.value:
        return port.ParkReason.EFFECT_AMBIGUOUS
    return None
