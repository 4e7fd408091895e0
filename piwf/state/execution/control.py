"""Server-side run transitions: the scheduling claim and the client controls.

Run x queue states (seed 001; pause is the ``paused`` flag, never a status)::

    queued/queued ─claim_next_run─▶ running/starting ─ready─▶ running/running
    running/running ─park waiting─────────▶ waiting/parked       (answer, later: resumable)
    running/running ─park effectAmbiguous─▶ running/parked + effectAmbiguous
    running/* ─runner exit (recovery)─────▶ running/parked [+ runnerNoProgress] | waiting/parked
    any non-terminal ─finish | cancel_run─▶ completed/done | failed/failed | cancelled/cancelled
    any non-terminal ─pause_run───────────▶ paused, queue parked ─resume_run─▶ eligible again
    terminal ─restart_run─▶ a new child run, queued/queued

Claims: the scheduler claims with owner type ``server`` (generation + 1). Controls either renew
the claim the caller still holds or, when that claim is absent or expired, take a ``control``
claim (generation + 1, fencing the old token) and release it in the same transaction. A live
claim of another owner is never taken: that is a ``Conflict``.

Blocking failure classes (``sourceChanged``, ``runnerNoProgress``, ``effectAmbiguous``) keep a
run away from :func:`claim_next_run` until :func:`resume_run`; ``effectAmbiguous`` additionally
needs every ambiguous effect resolved first. Recovery after a runner exit lives in
:mod:`piwf.state.execution.recovery`.
"""

from __future__ import annotations

import json

from piwf import canonical
from piwf.lifecycle import Adopted, Applied, CommandKind, Conflict, RecoveryRequired, RunStatus
from piwf.state import decisions
from piwf.state.database import Transaction
from piwf.state.enums import (
    BLOCKING_FAILURE_CLASSES,
    CRASH_LOOP_LIMIT,
    AttemptStatus,
    FailureClass,
    OwnerType,
    QueueStatus,
    ResourceType,
)
from piwf.state.execution import runs
from piwf.state.execution.core import (
    RunLaunch,
    RunRow,
    attempt_count,
    close_run_dependents,
    record_run_change,
    require_run,
    set_queue,
    take_run_authority,
)
from piwf.state.leases import Claim, read_lease, release_claim
from piwf.state.records import Actor, claim_resource, ensure_resource, record_change

# Eligibility of a run for the scheduler, but for its due time; :blocking is a JSON array of
# blocking error codes and :exclude a JSON array of run ids the caller is already handling.
_ELIGIBLE_FROM = """
FROM run_queue q
JOIN runs r ON r.run_id = q.run_id
LEFT JOIN leases l ON l.resource_id = r.resource_id
WHERE q.status IN ('queued', 'parked')
  AND r.paused = 0
  AND r.status IN ('queued', 'running')
  AND (q.error_code IS NULL OR q.error_code NOT IN (SELECT value FROM json_each(:blocking)))
  AND NOT (q.error_code = 'runnerCrashed' AND q.consecutive_errors >= :crash_limit)
  AND (l.owner_id IS NULL OR l.expires_at <= :now)
  AND NOT EXISTS (SELECT 1 FROM interactive_requests i
                  WHERE i.run_id = r.run_id AND i.status = 'pending')
  AND NOT EXISTS (SELECT 1 FROM effects e
                  WHERE e.source_resource_id = r.resource_id AND e.status = 'ambiguous')
  AND r.run_id NOT IN (SELECT value FROM json_each(:exclude))
"""

_RUNNABLE_FROM = _ELIGIBLE_FROM + "  AND q.available_at <= :now\n"

_SELECT_NEXT_RUNNABLE = (
    "SELECT q.run_id " + _RUNNABLE_FROM + " ORDER BY q.available_at, q.created_at, q.run_id LIMIT 1"
)

_COUNT_RUNNABLE = "SELECT count(*) " + _RUNNABLE_FROM

# Runs that will start by themselves, now or at a scheduled time: admitted or executing runs,
# and runs waiting out a back-off (eligible but for their due time).
_HAS_ADMITTED_RUN = """
SELECT EXISTS (SELECT 1 FROM run_queue WHERE status IN ('queued', 'starting', 'running'))
"""

_HAS_ELIGIBLE_RUN = "SELECT EXISTS (SELECT 1 " + _ELIGIBLE_FROM + ")"

_START_RUN = """
UPDATE runs SET status = 'running', updated_at = ?
WHERE run_id = ? AND status IN ('queued', 'running')
"""

_START_QUEUE = """
UPDATE run_queue
SET status = 'starting', error_code = NULL, error_hash = NULL, started_at = ?, updated_at = ?
WHERE run_id = ? AND status IN ('queued', 'parked')
"""

_SET_PAUSED = "UPDATE runs SET paused = ?, updated_at = ? WHERE run_id = ?"

_RESET_CRASHES = "UPDATE run_queue SET consecutive_errors = 0 WHERE run_id = ?"

# Pause parks the queue row but keeps its error code and text: resume decides about those.
_PARK_QUEUE_KEEPING_ERROR = """
UPDATE run_queue SET status = 'parked', updated_at = ?
WHERE run_id = ? AND status IN ('queued', 'starting', 'running', 'parked')
"""

_CANCEL_RUN = """
UPDATE runs SET status = 'cancelled', finished_at = ?, updated_at = ?
WHERE run_id = ? AND status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
"""

_COUNT_EFFECTS_IN = """
SELECT count(*) FROM effects
WHERE source_resource_id = ? AND status IN (SELECT value FROM json_each(?))
"""

_SELECT_RESTART_CHILD = """
SELECT run_id FROM runs WHERE parent_run_id = ? AND lineage_kind = 'restart'
"""

_INSERT_RESTART_RUN = """
INSERT INTO runs (run_id, resource_id, project_id, parent_run_id, root_run_id, lineage_kind,
                  restart_number, parent_terminal_fingerprint, definition_digest, workflow_ref,
                  launch_options_hash, title, status, input_hash, created_at, updated_at)
SELECT :child, :resource, project_id, run_id, root_run_id, 'restart', restart_number + 1,
       :fingerprint, definition_digest, workflow_ref, launch_options_hash, title, 'queued',
       input_hash, :now, :now
FROM runs WHERE run_id = :parent
"""

_INSERT_RESTART_QUEUE = """
INSERT INTO run_queue (run_id, status, available_at, created_at, updated_at)
VALUES (?, 'queued', ?, ?, ?)
"""

_COPY_SOURCES = """
INSERT INTO run_sources (run_id, mount_path, source_type, source_ref, source_revision)
SELECT ?, mount_path, source_type, source_ref, source_revision FROM run_sources WHERE run_id = ?
"""

_COPY_BINDING = """
INSERT INTO run_bindings (run_id, origin_session_id, execution_mode, created_at)
SELECT ?, origin_session_id, execution_mode, ? FROM run_bindings WHERE run_id = ?
"""

_UNSETTLED = json.dumps(["pending", "applying", "ambiguous"])
_AMBIGUOUS = json.dumps(["ambiguous"])
_BLOCKING = json.dumps(sorted(code.value for code in BLOCKING_FAILURE_CLASSES))


def claim_next_run(
    tx: Transaction, *, owner_id: str, lease_ms: int, exclude: tuple[str, ...] = ()
) -> RunLaunch | None:
    """Claim the next eligible run for a new runner and decide its one command.

    Eligible (ordered by ``available_at, created_at``): queue ``queued`` or ``parked`` and
    available now, not paused, run ``queued`` or ``running``, no blocking error code (nor a
    ``runnerCrashed`` streak of :data:`CRASH_LOOP_LIMIT`), lease free or expired, no pending
    request, no ambiguous effect, not in ``exclude``. The claim
    (``server``, generation + 1) is one ``lease.claimed`` change; the queue becomes ``starting``
    (its previous error cleared) and the run ``running``. Command: ``start`` for a root run and
    ``restart`` for a restart run that has no node attempt yet, else ``resume``. Returns None
    when nothing is eligible. Expects a write transaction.
    """
    params = {
        "now": tx.now,
        "blocking": _BLOCKING,
        "crash_limit": CRASH_LOOP_LIMIT,
        "exclude": json.dumps(list(exclude)),
    }
    run_id = tx.scalar(_SELECT_NEXT_RUNNABLE, params)
    if run_id is None:
        return None
    run = require_run(tx, str(run_id))
    taken = claim_resource(
        tx, run.resource_id, OwnerType.SERVER, owner_id, lease_ms, expected_revision=run.revision
    )
    if isinstance(taken, Conflict):  # pragma: no cover - eligibility checked the lease
        return None
    if attempt_count(tx, run.run_id) > 0:
        command = CommandKind.RESUME
    elif run.lineage_kind == "restart":
        command = CommandKind.RESTART
    else:
        command = CommandKind.START
    tx.execute(_START_RUN, (tx.now, run.run_id))
    tx.execute(_START_QUEUE, (tx.now, tx.now, run.run_id))
    return RunLaunch(
        claim=taken.value,
        run_id=run.run_id,
        command=command,
        launch_revision=run.revision + 1,
        parent_run_id=run.parent_run_id if command is CommandKind.RESTART else None,
    )


def count_runnable(tx: Transaction) -> int:
    """Return how many runs :func:`claim_next_run` could claim now (any transaction)."""
    params = {
        "now": tx.now,
        "blocking": _BLOCKING,
        "crash_limit": CRASH_LOOP_LIMIT,
        "exclude": "[]",
    }
    return int(tx.scalar(_COUNT_RUNNABLE, params))


def has_scheduled_work(tx: Transaction) -> bool:
    """Whether any run work will start without outside action, now or at a scheduled time.

    True while a run is queued, starting or running; while a run waits out a relaunch back-off
    (it is eligible but for its ``available_at``); or while an unresolved decision has a
    deadline (its timeout policy must fire on time). An idle server must not exit while this
    holds (seed 001 "Server lifecycle": a scheduled wake keeps it alive). Any transaction.
    """
    params = {
        "now": tx.now,
        "blocking": _BLOCKING,
        "crash_limit": CRASH_LOOP_LIMIT,
        "exclude": "[]",
    }
    return (
        bool(tx.scalar(_HAS_ADMITTED_RUN))
        or bool(tx.scalar(_HAS_ELIGIBLE_RUN, params))
        or decisions.next_deadline(tx) is not None
    )


def cancel_run(
    tx: Transaction,
    run_id: str,
    *,
    actor: Actor,
    control_owner_id: str,
    lease_ms: int,
    expected_revision: int | None = None,
    claim: Claim | None = None,
) -> Applied[runs.RunView] | Adopted[runs.RunView] | Conflict:
    """Cancel a queued, executing, waiting, parked or paused run in one transaction.

    Authority: the server passes its own live ``claim`` for an executing run; otherwise a
    ``control`` claim (generation + 1) is taken, which needs the lease absent or expired — a
    live claim is never force-cancelled (``Conflict``). One change (event ``run.cancelled``)
    then commits run and queue ``cancelled``, the active attempt ``cancelled``, open requests
    ``cancelled``, pending effects ``cancelled`` and applying ones ``ambiguous``, and releases the
    claim. Already cancelled is ``Adopted``; another terminal status or a stale
    ``expected_revision`` is a ``Conflict``. Raises ``LookupError`` for an unknown run. The
    server stops the fenced runner only after this commits.
    """
    run = require_run(tx, run_id)
    if run.status is RunStatus.CANCELLED:
        return Adopted(_view(tx, run_id))
    if run.terminal:
        return Conflict(f"run {run_id} is already {run.status.value}")
    if expected_revision is not None and expected_revision != run.revision:
        return Conflict(f"run {run_id} is at revision {run.revision}, not {expected_revision}")
    authority = take_run_authority(
        tx,
        run,
        claim=claim,
        owner_type=OwnerType.CONTROL,
        owner_id=control_owner_id,
        lease_ms=lease_ms,
    )
    if isinstance(authority, Conflict):
        return authority
    record_run_change(tx, run, "run.cancelled", actor, authority)
    close_run_dependents(
        tx, run, attempt_status=AttemptStatus.CANCELLED, actor=actor, claim=authority
    )
    tx.execute(_CANCEL_RUN, (tx.now, tx.now, run_id))
    set_queue(tx, run_id, QueueStatus.CANCELLED)
    release_claim(tx, authority)
    return Applied(_view(tx, run_id))


def pause_run(
    tx: Transaction,
    run_id: str,
    *,
    actor: Actor,
    control_owner_id: str,
    lease_ms: int,
    expected_revision: int | None = None,
    claim: Claim | None = None,
) -> Applied[runs.RunView] | Adopted[runs.RunView] | Conflict:
    """Set the durable pause: ``paused = 1``, queue ``parked``, claim released (one change).

    Authority as in :func:`cancel_run`. The run status and its active attempt stay as they are
    (resume retries the visit from the last durable boundary). Already paused is ``Adopted``; a
    terminal run or a stale ``expected_revision`` is a ``Conflict``. Event ``run.paused``.
    """
    run = require_run(tx, run_id)
    if run.terminal:
        return Conflict(f"run {run_id} is {run.status.value}")
    if run.paused:
        return Adopted(_view(tx, run_id))
    if expected_revision is not None and expected_revision != run.revision:
        return Conflict(f"run {run_id} is at revision {run.revision}, not {expected_revision}")
    authority = take_run_authority(
        tx,
        run,
        claim=claim,
        owner_type=OwnerType.CONTROL,
        owner_id=control_owner_id,
        lease_ms=lease_ms,
    )
    if isinstance(authority, Conflict):
        return authority
    record_run_change(tx, run, "run.paused", actor, authority)
    tx.execute(_SET_PAUSED, (1, tx.now, run_id))
    tx.execute(_PARK_QUEUE_KEEPING_ERROR, (tx.now, run_id))
    release_claim(tx, authority)
    return Applied(_view(tx, run_id))


def resume_run(
    tx: Transaction, run_id: str, *, actor: Actor, expected_revision: int | None = None
) -> Applied[runs.RunView] | Adopted[runs.RunView] | Conflict | RecoveryRequired:
    """Clear the pause and any error code and make the run eligible now (one change).

    This is the only way out of ``runnerNoProgress``, ``sourceChanged``, ``protocolRejected``,
    ``effectAmbiguous`` and a blocked ``runnerCrashed`` streak (it ends every crash streak);
    the last also needs no ambiguous effect left (``RecoveryRequired("effectAmbiguous")``). A
    ``queued`` run's queue row becomes ``queued``; a ``running`` run's becomes ``parked`` and
    available now (the seed's "stopped at a durable boundary and can resume"); a ``waiting``
    run stays parked for its answer. A run that is neither paused nor parked with an error is
    ``Adopted``; a terminal run, a live claim or a stale ``expected_revision`` is a
    ``Conflict``. Event ``run.resumed``.
    """
    run = require_run(tx, run_id)
    if run.terminal:
        return Conflict(f"run {run_id} is {run.status.value}")
    if expected_revision is not None and expected_revision != run.revision:
        return Conflict(f"run {run_id} is at revision {run.revision}, not {expected_revision}")
    parked_with_error = run.queue_status is QueueStatus.PARKED and run.error_code is not None
    if not run.paused and not parked_with_error:
        return Adopted(_view(tx, run_id))
    if run.error_code == FailureClass.EFFECT_AMBIGUOUS.value and _count_effects(
        tx, run, _AMBIGUOUS
    ):
        return RecoveryRequired("effectAmbiguous")
    lease = read_lease(tx, run.resource_id)
    if lease is not None and lease.is_live(tx.now):
        return Conflict(f"run {run_id} is held by a live claim (generation {lease.generation})")
    record_run_change(tx, run, "run.resumed", actor, None, {"errorCode": run.error_code})
    tx.execute(_SET_PAUSED, (0, tx.now, run_id))
    tx.execute(_RESET_CRASHES, (run_id,))
    queued = run.status is RunStatus.QUEUED
    status = QueueStatus.QUEUED if queued else QueueStatus.PARKED
    set_queue(tx, run_id, status, available_now=run.status is not RunStatus.WAITING)
    return Applied(_view(tx, run_id))


def restart_run(
    tx: Transaction, run_id: str, *, new_run_id: str, actor: Actor
) -> Applied[runs.RunView] | Adopted[runs.RunView] | Conflict:
    """Queue a fresh restart of a terminal run: same definition, input, sources and binding.

    The child gets ``parent_run_id``, ``lineage_kind = 'restart'``, ``restart_number + 1``, the
    parent's root and ``parent_terminal_fingerprint`` = SHA-256 of the canonical JSON
    ``[parent run id, parent revision]``; nothing else is copied (no steps, outputs, requests
    or effects). A parent restarts at most once: when its restart exists, that child is
    ``Adopted`` (whatever ``new_run_id`` says). A run that is not terminal or still has an
    unsettled (pending, applying, ambiguous) effect, or a ``new_run_id`` already in use, is a
    ``Conflict``. Event ``run.created`` on the child; the parent is not changed.
    """
    parent = require_run(tx, run_id)
    child_id = tx.scalar(_SELECT_RESTART_CHILD, (run_id,))
    if child_id is not None:
        return Adopted(_view(tx, str(child_id)))
    if not parent.terminal:
        return Conflict(f"run {run_id} is {parent.status.value}; only a terminal run restarts")
    if _count_effects(tx, parent, _UNSETTLED):
        return Conflict(f"run {run_id} has unsettled effects")
    if runs.get_run(tx, new_run_id) is not None:
        return Conflict(f"run {new_run_id} already exists")
    fingerprint = canonical.digest([parent.run_id, parent.revision])
    resource_id = ensure_resource(tx, ResourceType.RUN, new_run_id)
    payload = {
        "parentRunId": parent.run_id,
        "lineage": "restart",
        "restartNumber": parent.restart_number + 1,
    }
    record_change(tx, resource_id, 0, "run.created", actor, payload=payload)
    tx.execute(
        _INSERT_RESTART_RUN,
        {
            "child": new_run_id,
            "resource": resource_id,
            "fingerprint": fingerprint,
            "now": tx.now,
            "parent": parent.run_id,
        },
    )
    tx.execute(_INSERT_RESTART_QUEUE, (new_run_id, tx.now, tx.now, tx.now))
    tx.execute(_COPY_SOURCES, (new_run_id, parent.run_id))
    tx.execute(_COPY_BINDING, (new_run_id, tx.now, parent.run_id))
    return Applied(_view(tx, new_run_id))


def _count_effects(tx: Transaction, run: RunRow, statuses: str) -> int:
    return int(tx.scalar(_COUNT_EFFECTS_IN, (run.resource_id, statuses)))


def _view(tx: Transaction, run_id: str) -> runs.RunView:
    view = runs.get_run(tx, run_id)
    assert view is not None
    return view
