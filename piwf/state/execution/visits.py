"""The engine's port messages about node visits, applied durably (one transaction each).

Each ``apply_*`` function is one runner message, run inside the caller's ``BEGIN IMMEDIATE``
transaction (``with db.write() as tx``), in this order:

1. renew the exact live run claim (X1) or raise :class:`~piwf.errors.ClaimLostError` before
   anything is read or written;
2. verify the transition against the saved rows; a contradiction is a ``Conflict`` and
   writes nothing (a matching repeat is ``Adopted`` and writes nothing);
3. write blobs, bump the run revision once and append one event (``records.record_change``);
4. update the domain rows (attempts, steps, requests, updates, notifications, queue, run).

Results are the port's own dataclasses (``Applied(revision)`` and friends), so the server
can answer the runner with them unchanged. Visits follow seed 003's identity::

    node_started(V, 1)        no active attempt, V = last visit of the path + 1
    node_started(V, N+1)      attempt N of V is unfinished: N becomes ``interrupted``
    node_finished / failed    the active attempt closes and one ``run_steps`` row is appended
    request_interaction       the active attempt becomes ``waiting`` with one open request

Requests, parking and the finish live in :mod:`piwf.state.execution.outcomes`.
"""

from __future__ import annotations

from piwf import canonical
from piwf.lifecycle import (
    Adopted,
    AnsweredBy,
    Applied,
    CommandKind,
    Conflict,
    InteractionKind,
    Lineage,
    NotifyKind,
    RunStatus,
)
from piwf.state import blobs, decisions
from piwf.state.database import Transaction
from piwf.state.enums import AttemptStatus, FailureClass, InteractionStatus, QueueStatus
from piwf.state.execution.core import (
    RUNNER_ACTOR,
    SELECT_OPEN_REQUEST,
    AttemptRow,
    RunRow,
    active_attempt,
    attempt_count,
    attempt_id_for,
    executing_run,
    load_run,
    optional_bytes,
    record_run_change,
    require_run_claim,
    visit_attempt,
)
from piwf.state.leases import Claim
from piwf.workflow import port
from piwf.workflow.context import Outcome
from piwf.workflow.port import Committed

_SELECT_STEPS = """
SELECT a.node_path, a.visit, a.attempt_number, a.status, a.output_hash, a.error_hash,
       a.started_at, a.finished_at
FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
WHERE s.run_id = ? ORDER BY s.step_index
"""

_SELECT_VISITS = """
SELECT node_path, max(visit) AS visit FROM node_attempts WHERE run_id = ? GROUP BY node_path
"""

_SELECT_LAST_VISIT = """
SELECT coalesce(max(visit), 0) FROM node_attempts WHERE run_id = ? AND node_path = ?
"""


_INSERT_ATTEMPT = """
INSERT INTO node_attempts (attempt_id, run_id, node_path, visit, attempt_number, node_type,
                           status, lease_generation, started_at, deadline_at, created_at,
                           updated_at)
VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)
"""

_INTERRUPT_ATTEMPT = """
UPDATE node_attempts SET status = 'interrupted', finished_at = ?, updated_at = ?
WHERE attempt_id = ? AND status IN ('pending', 'running')
"""

_CLOSE_ATTEMPT = """
UPDATE node_attempts
SET status = ?, output_hash = ?, error_hash = ?, finished_at = ?, updated_at = ?
WHERE attempt_id = ? AND status IN ('pending', 'running', 'waiting')
"""

_APPEND_STEP = """
INSERT INTO run_steps (run_id, step_index, attempt_id)
VALUES (?, (SELECT coalesce(max(step_index) + 1, 0) FROM run_steps WHERE run_id = ?), ?)
"""

_SELECT_UPDATE = """
SELECT update_id, data_hash FROM workflow_updates
WHERE attempt_id = ? AND update_type = ? AND update_key = ?
ORDER BY update_seq DESC LIMIT 1
"""

_NEXT_UPDATE_SEQ = """
SELECT coalesce(max(update_seq), 0) + 1 FROM workflow_updates WHERE attempt_id = ?
"""

_INSERT_UPDATE = """
INSERT INTO workflow_updates (update_id, attempt_id, update_seq, run_revision, update_type,
                              update_key, data_hash, recorded_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

# One record per (attempt, type, key): a newer publish replaces the data and takes the next seq.
_REPLACE_UPDATE = """
UPDATE workflow_updates SET update_seq = ?, run_revision = ?, data_hash = ?, recorded_at = ?
WHERE update_id = ?
"""

_SELECT_NOTIFICATION = """
SELECT run_id, node_path, visit, kind, message_hash FROM run_notifications
WHERE notification_id = ?
"""

_INSERT_NOTIFICATION = """
INSERT INTO run_notifications (notification_id, run_id, attempt_id, node_path, visit, kind,
                               message_hash, run_revision, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""


_SETTLE_REQUEST = """
UPDATE interactive_requests SET status = 'settled', updated_at = ?
WHERE request_id = ? AND status = 'answered'
"""

_CANCEL_REQUEST = """
UPDATE interactive_requests SET status = 'cancelled', updated_at = ?
WHERE request_id = ? AND status IN ('pending', 'answered')
"""


_SET_TITLE = "UPDATE runs SET title = ?, updated_at = ? WHERE run_id = ?"


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


_RESET_CRASHES = """
UPDATE run_queue SET consecutive_errors = 0 WHERE run_id = ? AND consecutive_errors > 0
"""


def read_saved_run(tx: Transaction, run_id: str) -> port.SavedRun | None:
    """Return everything the engine may know about ``run_id`` (``None`` when it does not exist).

    Read-only; any transaction. Status mapping: a run with no node attempt yet reads ``queued``
    (it is fresh, so ``start``/``restart`` fit even after it was claimed), a running run whose
    queue row is parked reads ``parked``; otherwise the run's own status. Steps come from
    ``run_steps`` in order, visits are the highest visit per path, the active visit is the one
    unfinished attempt and ``pending`` its open (pending or answered) request.
    """
    run = load_run(tx, run_id)
    if run is None:
        return None
    active = active_attempt(tx, run_id)
    pending = None if active is None else _pending_request(tx, active)
    return port.SavedRun(
        run_id=run.run_id,
        status=_saved_status(run, attempt_count(tx, run_id)),
        input=blobs.read_json(tx, run.input_hash),
        lineage=Lineage.RESTART if run.lineage_kind == "restart" else Lineage.ROOT,
        parent_run_id=run.parent_run_id,
        restart_number=run.restart_number,
        definition_digest=run.definition_digest.hex(),
        steps=tuple(_steps(tx, run_id)),
        visits={row["node_path"]: row["visit"] for row in tx.all(_SELECT_VISITS, (run_id,))},
        active=None
        if active is None
        else port.ActiveVisit(
            active.path, active.visit, active.attempt, active.started_at or 0, active.deadline_at
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
    command = CommandKind(message.command.value)
    fresh = attempt_count(tx, run.run_id) == 0
    if command in (CommandKind.START, CommandKind.RESTART):
        lineage = "restart" if command is CommandKind.RESTART else None
        if not fresh:
            return Conflict(f"{command.value}: run {run.run_id} has already executed")
        if run.lineage_kind != lineage:
            return Conflict(f"{command.value}: run {run.run_id} has another lineage")
    elif fresh:
        return Conflict(f"{command.value}: run {run.run_id} has not started")
    # A title given when the run was started wins; the resolved one only fills an empty title.
    if message.title is None or run.title is not None:
        return Adopted(Committed(run.revision))
    payload = {"command": command.value}
    revision = record_run_change(tx, run, "run.begun", RUNNER_ACTOR, claim, payload)
    tx.execute(_SET_TITLE, (message.title, tx.now, run.run_id))
    return Applied(Committed(revision))


_MOVE_PROGRESS_BASELINE = """
UPDATE run_runners SET ready_revision = ?
WHERE run_id = ? AND status IN ('ready', 'running')
"""


def apply_node_started(
    tx: Transaction, claim: Claim, message: port.NodeStarted, *, lease_ms: int
) -> port.PortResult:
    """Open attempt 1 of a new visit, or attempt N+1 of the unfinished visit (crash retry).

    A new visit must be the path's last visit + 1; a retry keeps the visit number, closes
    attempt N as ``interrupted`` and moves the live runner's no-progress baseline (a retry
    alone is not progress). The same open attempt again is ``Adopted``. A retry of a visit
    that waits on a request, or any other numbering, is a ``Conflict``. Event ``node.started``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    active = active_attempt(tx, run.run_id)
    interrupted: AttemptRow | None = None
    if active is not None:
        if (active.path, active.visit) != (message.path, message.visit):
            return Conflict(f"visit {active.visit} of {active.path!r} is still active")
        if message.attempt == active.attempt:
            return Adopted(Committed(run.revision))
        if message.attempt != active.attempt + 1:
            return Conflict(f"attempt {message.attempt} does not follow attempt {active.attempt}")
        if active.status is AttemptStatus.WAITING:
            return Conflict(f"visit {active.visit} of {active.path!r} waits on a request")
        interrupted = active
    else:
        last = int(tx.scalar(_SELECT_LAST_VISIT, (run.run_id, message.path)))
        if (message.visit, message.attempt) != (last + 1, 1):
            return Conflict(
                f"visit {message.visit} attempt {message.attempt} of {message.path!r} is not next"
            )
    payload = {"path": message.path, "visit": message.visit, "attempt": message.attempt}
    revision = record_run_change(tx, run, "node.started", RUNNER_ACTOR, claim, payload)
    if interrupted is not None:
        tx.execute(_INTERRUPT_ATTEMPT, (tx.now, tx.now, interrupted.attempt_id))
        # Reopening a crashed visit is bookkeeping, not progress: it moves the live runner's
        # no-progress baseline, so a node that kills every runner is retried once, then parks
        # runnerNoProgress instead of looping.
        tx.execute(_MOVE_PROGRESS_BASELINE, (revision, run.run_id))
    tx.execute(
        _INSERT_ATTEMPT,
        (
            attempt_id_for(run.run_id, message.path, message.visit, message.attempt),
            run.run_id,
            message.path,
            message.visit,
            message.attempt,
            message.kind,
            claim.generation,
            message.started_at_ms,
            message.deadline_ms,
            tx.now,
            tx.now,
        ),
    )
    return Applied(Committed(revision))


def apply_node_finished(
    tx: Transaction, claim: Claim, message: port.NodeFinished, *, lease_ms: int
) -> port.PortResult:
    """Close the active attempt ``completed`` with its output blob and append its step.

    ``request_id`` must name the attempt's answered request (which becomes ``settled``), and
    must be absent when the attempt has no request. Event ``node.finished``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = executing_run(tx, message.run_id)
    if isinstance(run, Conflict):
        return run
    active = _exact_active(tx, run, message.path, message.visit, message.attempt)
    if isinstance(active, Conflict):
        return active
    request = tx.one(SELECT_OPEN_REQUEST, (active.attempt_id,))
    if request is not None:
        if request["request_id"] != message.request_id:
            return Conflict(f"request {request['request_id']} is still open")
        if request["status"] != InteractionStatus.ANSWERED.value:
            return Conflict(f"request {request['request_id']} has no answer")
    elif message.request_id is not None:
        return Conflict(f"request {message.request_id} is not open")
    output_hash = blobs.put_json(tx, message.output)
    payload = {"path": message.path, "visit": message.visit, "attempt": message.attempt}
    revision = record_run_change(tx, run, "node.finished", RUNNER_ACTOR, claim, payload)
    tx.execute(
        _CLOSE_ATTEMPT,
        (
            AttemptStatus.COMPLETED.value,
            output_hash,
            None,
            message.finished_at_ms,
            tx.now,
            active.attempt_id,
        ),
    )
    if request is not None:
        tx.execute(_SETTLE_REQUEST, (tx.now, request["request_id"]))
    tx.execute(_APPEND_STEP, (run.run_id, run.run_id, active.attempt_id))
    tx.execute(_RESET_CRASHES, (run.run_id,))  # a finished node ends a crash streak
    return Applied(Committed(revision))


def apply_node_failed(
    tx: Transaction, claim: Claim, message: port.NodeFailed, *, lease_ms: int
) -> port.PortResult:
    """Close the active attempt ``failed``/``timed_out``/``cancelled`` with an error text blob.

    The step is appended (routing on ``$result.outcome`` replays it) and an open request of the
    attempt is cancelled. Outcome ``ok`` is a ``Conflict``. Event ``node.failed``.
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
    payload = {
        "path": message.path,
        "visit": message.visit,
        "attempt": message.attempt,
        "outcome": message.outcome.value,
    }
    revision = record_run_change(tx, run, "node.failed", RUNNER_ACTOR, claim, payload)
    request = tx.one(SELECT_OPEN_REQUEST, (active.attempt_id,))
    if request is not None:
        reason = f"visit {message.visit} of {message.path!r} ended {message.outcome.value}"
        decisions.cancel_unresolved_in(tx, run.run_id, reason=reason, actor=RUNNER_ACTOR)
        tx.execute(_CANCEL_REQUEST, (tx.now, request["request_id"]))
    tx.execute(
        _CLOSE_ATTEMPT,
        (status.value, None, error_hash, message.finished_at_ms, tx.now, active.attempt_id),
    )
    tx.execute(_APPEND_STEP, (run.run_id, run.run_id, active.attempt_id))
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
    existing = tx.one(_SELECT_UPDATE, (active.attempt_id, message.update_type, message.key))
    if existing is not None and bytes(existing["data_hash"]) == data_hash:
        return Adopted(Committed(run.revision))
    payload = {"path": message.path, "visit": message.visit, "updateType": message.update_type}
    revision = record_run_change(tx, run, "node.update", RUNNER_ACTOR, claim, payload)
    sequence = int(tx.scalar(_NEXT_UPDATE_SEQ, (active.attempt_id,)))
    if existing is not None:
        tx.execute(_REPLACE_UPDATE, (sequence, revision, data_hash, tx.now, existing["update_id"]))
    else:
        identity = ["piwf.update.v1", active.attempt_id, message.update_type, message.key]
        update_id = "update-" + canonical.digest_hex(identity)[:40]
        tx.execute(
            _INSERT_UPDATE,
            (
                update_id,
                active.attempt_id,
                sequence,
                revision,
                message.update_type,
                message.key,
                data_hash,
                tx.now,
            ),
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
    kind = NotifyKind(message.kind.value)
    existing = tx.one(_SELECT_NOTIFICATION, (message.notification_id,))
    if existing is not None:
        same = (
            existing["run_id"] == run.run_id
            and (existing["node_path"], existing["visit"]) == (message.path, message.visit)
            and existing["kind"] == kind.value
            and bytes(existing["message_hash"]) == blobs.put_text(tx, message.message)
        )
        if same:
            return Adopted(Committed(run.revision))
        return Conflict(f"notification {message.notification_id} has other content")
    active = visit_attempt(tx, run, message.path, message.visit)
    if isinstance(active, Conflict):
        return active
    message_hash = blobs.put_text(tx, message.message)
    payload = {"notificationId": message.notification_id, "kind": kind.value}
    revision = record_run_change(tx, run, "run.notification", RUNNER_ACTOR, claim, payload)
    tx.execute(
        _INSERT_NOTIFICATION,
        (
            message.notification_id,
            run.run_id,
            active.attempt_id,
            message.path,
            message.visit,
            kind.value,
            message_hash,
            revision,
            tx.now,
        ),
    )
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
    row = tx.one(SELECT_OPEN_REQUEST, (active.attempt_id,))
    if row is None:
        return None
    answered = row["status"] == InteractionStatus.ANSWERED.value
    answer_hash = optional_bytes(row["answer_hash"])
    return port.PendingRequest(
        request_id=row["request_id"],
        path=active.path,
        visit=active.visit,
        kind=InteractionKind(row["kind"]),
        content=blobs.read_json(tx, bytes(row["content_hash"])),
        answered=answered,
        answer=None if answer_hash is None else blobs.read_json(tx, answer_hash),
        answered_by=None
        if row["answered_by"] is None
        else AnsweredBy(AnsweredBy(row["answered_by"]).value),
    )


def _steps(tx: Transaction, run_id: str) -> list[port.StepRecord]:
    steps = []
    for row in tx.all(_SELECT_STEPS, (run_id,)):
        output_hash = optional_bytes(row["output_hash"])
        error_hash = optional_bytes(row["error_hash"])
        steps.append(
            port.StepRecord(
                path=row["node_path"],
                visit=row["visit"],
                attempt=row["attempt_number"],
                outcome=_OUTCOME_OF_STATUS[AttemptStatus(row["status"])],
                output=None if output_hash is None else blobs.read_json(tx, output_hash),
                error=None if error_hash is None else blobs.read_text(tx, error_hash),
                started_at_ms=row["started_at"] or 0,
                finished_at_ms=row["finished_at"],
            )
        )
    return steps


def _saved_status(run: RunRow, attempts: int) -> RunStatus:
    if run.status in (RunStatus.QUEUED, RunStatus.RUNNING) and attempts == 0:
        return RunStatus.QUEUED
    if run.status is RunStatus.RUNNING and run.queue_status is QueueStatus.PARKED:
        return RunStatus.PARKED
    return RunStatus(run.status.value)


def _park_reason(run: RunRow) -> port.ParkReason | None:
    if run.status is RunStatus.WAITING:
        return port.ParkReason.WAITING
    if run.error_code == FailureClass.EFFECT_AMBIGUOUS.value:
        return port.ParkReason.EFFECT_AMBIGUOUS
    return None
