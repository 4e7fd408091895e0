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

from piwf import canonical
from piwf.lifecycle import (
    Adopted,
    Applied,
    CommandKind,
    Conflict,
    InteractionKind,
    Lineage,
    RecoveryRequired,
    RunStatus,
)
from piwf.state import blobs, decisions
from piwf.state.database import Transaction
from piwf.state.enums import (
    AttemptStatus,
    FailureClass,
    OwnerType,
    QueueStatus,
    ResourceType,
)
from piwf.state.execution import attempts, messages, queue, requests, runs, turns
from piwf.state.execution.core import (
    RunLaunch,
    close_run_dependents,
    record_run_change,
    take_run_authority,
    unsettled_effects_refusal,
)
from piwf.state.leases import Claim, read_lease, release_claim
from piwf.state.records import Actor, claim_resource, ensure_resource, record_change


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
    run_id = queue.next_runnable(tx, exclude)
    if run_id is None:
        return None
    run = runs.require_run(tx, run_id)
    taken = claim_resource(
        tx, run.resource_id, OwnerType.SERVER, owner_id, lease_ms, expected_revision=run.revision
    )
    if isinstance(taken, Conflict):  # pragma: no cover - eligibility checked the lease
        return None
    if attempts.attempt_count(tx, run.run_id) > 0:
        command = CommandKind.RESUME
    elif run.lineage is Lineage.RESTART:
        command = CommandKind.RESTART
    else:
        command = CommandKind.START
    runs.mark_started(tx, run.run_id)
    queue.mark_starting(tx, run.run_id)
    return RunLaunch(
        claim=taken.value,
        run_id=run.run_id,
        command=command,
        launch_revision=run.revision + 1,
        parent_run_id=run.parent_run_id if command is CommandKind.RESTART else None,
    )


def count_runnable(tx: Transaction) -> int:
    """Return how many runs :func:`claim_next_run` could claim now (any transaction)."""
    return queue.count_runnable(tx)


def has_scheduled_work(tx: Transaction) -> bool:
    """Whether any run work will start without outside action, now or at a scheduled time.

    True while a run is queued, starting or running; while a run waits out a relaunch back-off
    (it is eligible but for its ``available_at``); or while an unresolved decision has a
    deadline (its timeout policy must fire on time). An idle server must not exit while this
    holds (seed 001 "Server lifecycle": a scheduled wake keeps it alive). Any transaction.
    """
    return queue.has_admitted_or_eligible_run(tx) or decisions.next_deadline(tx) is not None


def cancel_run(
    tx: Transaction,
    run_id: str,
    *,
    actor: Actor,
    control_owner_id: str,
    lease_ms: int,
    expected_revision: int | None = None,
    claim: Claim | None = None,
) -> Applied[runs.RunRow] | Adopted[runs.RunRow] | Conflict:
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
    run = runs.require_run(tx, run_id)
    if run.status is RunStatus.CANCELLED:
        return Adopted(runs.require_run(tx, run_id))
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
    runs.finish(tx, run_id, RunStatus.CANCELLED)
    messages.run_ended(tx, run_id, RunStatus.CANCELLED.value, error="cancelled")
    turns.end_turns_of_run(tx, run_id)
    queue.set_queue(tx, run_id, QueueStatus.CANCELLED)
    release_claim(tx, authority)
    return Applied(runs.require_run(tx, run_id))


def pause_run(
    tx: Transaction,
    run_id: str,
    *,
    actor: Actor,
    control_owner_id: str,
    lease_ms: int,
    expected_revision: int | None = None,
    claim: Claim | None = None,
) -> Applied[runs.RunRow] | Adopted[runs.RunRow] | Conflict:
    """Set the durable pause: ``paused = 1``, queue ``parked``, claim released (one change).

    Authority as in :func:`cancel_run`. The run status and its active attempt stay as they are
    (resume retries the visit from the last durable boundary). Already paused is ``Adopted``; a
    terminal run or a stale ``expected_revision`` is a ``Conflict``. Event ``run.paused``.
    """
    run = runs.require_run(tx, run_id)
    if run.terminal:
        return Conflict(f"run {run_id} is {run.status.value}")
    if run.paused:
        return Adopted(runs.require_run(tx, run_id))
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
    runs.set_paused(tx, run_id, True)
    messages.run_paused(tx, run_id)
    queue.park_keeping_error(tx, run_id)
    release_claim(tx, authority)
    return Applied(runs.require_run(tx, run_id))


def resume_run(
    tx: Transaction, run_id: str, *, actor: Actor, expected_revision: int | None = None
) -> Applied[runs.RunRow] | Adopted[runs.RunRow] | Conflict | RecoveryRequired:
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
    run = runs.require_run(tx, run_id)
    if run.terminal:
        return Conflict(f"run {run_id} is {run.status.value}")
    if expected_revision is not None and expected_revision != run.revision:
        return Conflict(f"run {run_id} is at revision {run.revision}, not {expected_revision}")
    parked_with_error = run.queue_status is QueueStatus.PARKED and run.error_code is not None
    if not run.paused and not parked_with_error:
        return Adopted(runs.require_run(tx, run_id))
    if run.error_code == FailureClass.EFFECT_AMBIGUOUS.value and run.has_ambiguous_effect:
        return RecoveryRequired("effectAmbiguous")
    lease = read_lease(tx, run.resource_id)
    if lease is not None and lease.is_live(tx.now):
        return Conflict(f"run {run_id} is held by a live claim (generation {lease.generation})")
    record_run_change(tx, run, "run.resumed", actor, None, {"errorCode": run.error_code})
    runs.set_paused(tx, run_id, False)
    if run.paused:
        _present_open_request_again(tx, run_id)
    queue.end_crash_streak(tx, run_id)
    queued = run.status is RunStatus.QUEUED
    status = QueueStatus.QUEUED if queued else QueueStatus.PARKED
    queue.set_queue(tx, run_id, status, available_now=run.status is not RunStatus.WAITING)
    return Applied(runs.require_run(tx, run_id))


def _present_open_request_again(tx: Transaction, run_id: str) -> None:
    """A resumed interactive run presents its still-pending step once more (``resumed``); a
    protected decision was never withdrawn by the pause, so it gets no new message."""
    for request in requests.pending_requests(tx, run_id):
        if request.kind is not InteractionKind.HUMAN_DECISION:
            content = blobs.read_json(tx, request.content_hash)
            messages.present_again(tx, run_id, request.request_id, request.kind, content)


def restart_run(
    tx: Transaction, run_id: str, *, new_run_id: str, actor: Actor
) -> Applied[runs.RunRow] | Adopted[runs.RunRow] | Conflict:
    """Queue a fresh restart of a terminal run: same definition, input, sources and binding.

    The child gets ``parent_run_id``, ``lineage_kind = 'restart'``, ``restart_number + 1``, the
    parent's root and ``parent_terminal_fingerprint`` = SHA-256 of the canonical JSON
    ``[parent run id, parent revision]``; nothing else is copied (no steps, outputs, requests
    or effects). A parent restarts at most once: when its restart exists, that child is
    ``Adopted`` (whatever ``new_run_id`` says). A run that is not terminal or still has an
    unsettled (pending, applying, ambiguous) effect, or a ``new_run_id`` already in use, is a
    ``Conflict``. Event ``run.created`` on the child; the parent is not changed.
    """
    parent = runs.require_run(tx, run_id)
    child_id = runs.restart_child_of(tx, run_id)
    if child_id is not None:
        return Adopted(runs.require_run(tx, child_id))
    if not parent.terminal:
        return Conflict(f"run {run_id} is {parent.status.value}; only a terminal run restarts")
    unsettled = unsettled_effects_refusal(tx, parent, then="restart it")
    if unsettled is not None:
        return Conflict(unsettled)
    if runs.load_run(tx, new_run_id) is not None:
        return Conflict(f"run {new_run_id} already exists")
    session = messages.session_of(tx, run_id)
    holder = None if session is None else messages.session_holder(tx, session)
    if holder is not None:
        return Conflict(f"session {session} is reserved by run {holder} until it ends")
    fingerprint = canonical.digest([parent.run_id, parent.revision])
    resource_id = ensure_resource(tx, ResourceType.RUN, new_run_id)
    payload = {
        "parentRunId": parent.run_id,
        "lineage": "restart",
        "restartNumber": parent.restart_number + 1,
    }
    record_change(tx, resource_id, 0, "run.created", actor, payload=payload)
    runs.insert_restart(
        tx, parent, child_id=new_run_id, child_resource_id=resource_id, fingerprint=fingerprint
    )
    return Applied(runs.require_run(tx, new_run_id))
