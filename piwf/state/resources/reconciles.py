"""Reconciles of managed resources: the claim, the runner row, the result, failure and recovery.

::

    queue row due, lease free ─claim_next_reconcile─▶ claim (generation + 1, owner type
        resource_manager) ─record_reconcile_launch─▶ runner row ``starting`` (before the spawn)
        ─record_reconcile_process─▶ pid + start identity ─mark_reconcile_running─▶ ``running``
        ─finish_reconcile | fail_reconcile─▶ result committed, claim released
        ─record_reconcile_exit─▶ ``exited | timedOut | crashed | claimLost | orphaned``

Every result and failure renews the exact live claim first: a worker that lost its claim gets
:class:`~piwf.errors.ClaimLostError` and writes nothing (no failure, no retry). A result commits
with compare-and-set on the resource version it read: if anything wrote the resource meanwhile
the result is dropped and the resource is due again at once (``conflict``). A failure backs off
``min(60 s, 1 s · 2^min(errors, 6))`` where ``errors`` counts the failures before this one, and
turns every effect it left ``applying`` into ``ambiguous`` (its next reconcile observes first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.lifecycle import Conflict, EffectStatus
from piwf.state import blobs
from piwf.state import effects as fx
from piwf.state.database import Transaction
from piwf.state.enums import (
    ActorType,
    OwnerType,
    ReconcileOutcome,
    ResourceQueueReason,
    ResourceRunnerStatus,
)
from piwf.state.leases import Claim, release_claim, renew_claim, take_claim
from piwf.state.records import Actor, read_revision
from piwf.state.resources import runners
from piwf.state.resources.managed import (
    ResourceRow,
    dequeue,
    get_resource_by_uid,
    read_finalizers,
    read_queue,
    remove_resource,
    schedule,
)
from piwf.state.resources.runners import (
    RunnerRow,
    insert_runner,
    live_runner,
    record_reconcile_exit,
)
from piwf.state.resources.status import StatusPatch, write_status_patch

#: The error backoff: ``min(60 s, 1 s · 2^min(errors, 6))``.
BACKOFF_BASE_MS = 1000
BACKOFF_MAX_MS = 60_000
BACKOFF_MAX_EXPONENT = 6

_READY_FROM = """
FROM managed_resource_queue q
JOIN managed_resources m ON m.uid = q.uid
LEFT JOIN leases l ON l.resource_id = m.resource_id
WHERE q.available_at <= :now
  AND (l.owner_id IS NULL OR l.expires_at <= :now)
  AND NOT EXISTS (SELECT 1 FROM managed_resource_runners r
                  WHERE r.resource_id = m.resource_id AND r.status IN ('starting', 'running'))
  AND q.uid NOT IN (SELECT value FROM json_each(:exclude))
"""

_SELECT_NEXT_READY = (
    "SELECT q.uid " + _READY_FROM + " ORDER BY q.available_at, q.created_at LIMIT 1"
)

_COUNT_READY = "SELECT count(*) " + _READY_FROM


@dataclass(frozen=True)
class ReconcileLaunch:
    """A resource claimed for one reconcile, with the snapshot its runner receives.

    ``claim`` holds the raw token: keep it in the server process and never log it.
    """

    claim: Claim
    uid: str
    manager: str
    project_path: str | None
    resource_version: int
    resource_generation: int
    queue_version: int
    timeout_ms: int
    snapshot: dict[str, JsonValue]

    @property
    def resource_id(self) -> str:
        """The aggregate the claim is on."""
        return self.claim.resource_id


@dataclass(frozen=True)
class ResultIn:
    """A validated reconcile result: ``settled``, ``requeue`` or ``requeueAfter`` + a patch."""

    kind: ReconcileOutcome
    patch: StatusPatch
    after_ms: int | None = None


def backoff_ms(errors_before: int) -> int:
    """The delay after a failure that follows ``errors_before`` consecutive failures."""
    exponent = min(max(errors_before, 0), BACKOFF_MAX_EXPONENT)
    return min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * (1 << exponent))


def count_ready_reconciles(tx: Transaction, exclude: Sequence[str] = ()) -> int:
    """How many resources :func:`claim_next_reconcile` could claim now."""
    return int(
        tx.scalar(_COUNT_READY, {"now": tx.now, "exclude": canonical.encode_text(list(exclude))})
    )


def claim_next_reconcile(
    tx: Transaction, *, owner_id: str, lease_ms: int, exclude: Sequence[str] = ()
) -> ReconcileLaunch | None:
    """Claim the next due resource (by due time, then queue age) for one reconcile.

    Due: queue row ``available_at <= now``, lease free or expired, no live runner row, uid not
    in ``exclude``. The claim takes generation + 1 (fencing every older token); the resource
    version is not changed by it. Returns None when nothing is due.
    """
    found = tx.scalar(
        _SELECT_NEXT_READY, {"now": tx.now, "exclude": canonical.encode_text(list(exclude))}
    )
    if found is None:
        return None
    row = get_resource_by_uid(tx, str(found))
    queue = read_queue(tx, str(found))
    assert row is not None
    assert queue is not None
    taken = take_claim(tx, row.resource_id, OwnerType.RESOURCE_MANAGER, owner_id, lease_ms)
    if isinstance(taken, Conflict):  # pragma: no cover - the lease was checked in the query
        return None
    return ReconcileLaunch(
        claim=taken.value,
        uid=row.uid,
        manager=row.manager,
        project_path=row.project_path,
        resource_version=row.resource_version,
        resource_generation=row.generation,
        queue_version=queue.queue_version,
        timeout_ms=row.timeout_ms,
        snapshot=snapshot_of(tx, row),
    )


def snapshot_of(tx: Transaction, row: ResourceRow) -> dict[str, JsonValue]:
    """The resource as a reconcile sees it (the launch envelope's ``resource``)."""
    snapshot: dict[str, JsonValue] = {
        "uid": row.uid,
        "manager": row.manager,
        "key": row.key,
        "resourceVersion": row.resource_version,
        "generation": row.generation,
        "observedGeneration": row.observed_generation,
        "spec": blobs.read_json(tx, row.spec_hash),
        "status": blobs.read_json(tx, row.status_hash),
        "conditions": blobs.read_json(tx, row.conditions_hash),
        "finalizers": list(read_finalizers(tx, row.uid)),
    }
    if row.deletion_requested_at is not None:
        snapshot["deletionTimestamp"] = row.deletion_requested_at
    return snapshot


def record_reconcile_launch(
    tx: Transaction,
    launch: ReconcileLaunch,
    *,
    reconcile_id: str,
    server_epoch: int,
    lease_ms: int,
) -> Claim:
    """Renew the claim and record the runner row (``starting``) before the process exists."""
    claim = renew_claim(tx, launch.claim, lease_ms)
    insert_runner(
        tx,
        reconcile_id=reconcile_id,
        resource_id=launch.resource_id,
        uid=launch.uid,
        claim_generation=claim.generation,
        server_epoch=server_epoch,
        resource_version=launch.resource_version,
        resource_generation=launch.resource_generation,
        queue_version=launch.queue_version,
        deadline_at=tx.now + launch.timeout_ms,
    )
    return claim


def finish_reconcile(
    tx: Transaction, claim: Claim, reconcile_id: str, result: ResultIn, *, lease_ms: int
) -> ReconcileOutcome:
    """Commit a reconcile's result in one step; return what it did.

    Renews the exact live claim (:class:`~piwf.errors.ClaimLostError`: nothing written). If
    the resource version moved since the reconcile read it, nothing of the result is written
    and the resource is due now (``conflict``). Otherwise the patch is applied (a change
    bumps the version with event ``reconcile.status``; an equal status writes nothing), the
    observed generation becomes the one the reconcile read, and then: a deleting resource
    that settled with no finalizer is removed (``deleted``); ``settled`` drops the queue row
    unless it was enqueued again meanwhile; ``requeue``/``requeueAfter`` schedule the next
    reconcile. The error streak ends and the claim is released.
    """
    claim = renew_claim(tx, claim, lease_ms)
    runner = live_runner(tx, reconcile_id, claim)
    row = get_resource_by_uid(tx, runner.uid)
    if row is None or read_revision(tx, row.resource_id) != runner.resource_version:
        if row is not None:
            schedule(tx, row.uid, ResourceQueueReason.CONFLICT, tx.now, errors=0)
        return _close(tx, claim, runner, ReconcileOutcome.CONFLICT)
    actor = Actor(ActorType.RESOURCE_MANAGER, row.manager)
    write_status_patch(tx, row, runner, result.patch, actor, claim)
    finalizers = read_finalizers(tx, row.uid)
    deleting = row.deletion_requested_at is not None
    if result.kind is ReconcileOutcome.SETTLED and deleting and not finalizers:
        remove_resource(tx, row, actor, claim=claim)
        return _close(tx, claim, runner, ReconcileOutcome.DELETED)
    if result.kind is ReconcileOutcome.SETTLED:
        queue = read_queue(tx, row.uid)
        if queue is not None and queue.queue_version == runner.queue_version:
            dequeue(tx, row.uid, runner.queue_version)
        elif queue is not None:
            schedule(tx, row.uid, queue.reason, tx.now, errors=0)
    elif result.kind is ReconcileOutcome.REQUEUE:
        schedule(tx, row.uid, ResourceQueueReason.REQUEUE, tx.now, errors=0)
    elif (event := _event_since_start(tx, runner)) is not None:
        schedule(tx, row.uid, event, tx.now, errors=0)
    else:
        after = result.after_ms or 0
        schedule(tx, row.uid, ResourceQueueReason.REQUEUE_AFTER, tx.now + after, errors=0)
    return _close(tx, claim, runner, result.kind)


def _event_since_start(tx: Transaction, runner: runners.RunnerRow) -> ResourceQueueReason | None:
    """The reason of an event (an apply, a ``reconcile`` request, a child run's end) that
    enqueued the resource while this reconcile ran, or None. Such an event is due now: a
    later due time the reconcile asks for (``requeueAfter``, a failure's backoff) must not
    postpone it."""
    queue = read_queue(tx, runner.uid)
    if queue is None or queue.queue_version == runner.queue_version:
        return None
    return queue.reason


def fail_reconcile(
    tx: Transaction,
    claim: Claim,
    reconcile_id: str,
    error: str,
    *,
    lease_ms: int,
    count_error: bool = True,
) -> int:
    """Record a failed reconcile and schedule its retry; return the due time.

    Renews the exact live claim first (:class:`~piwf.errors.ClaimLostError`: a replaced worker
    records no failure and schedules no retry). Effects left ``applying`` become ``ambiguous``.
    With ``count_error`` the retry backs off (see :func:`backoff_ms`); without it (the server
    stopped the reconcile) the resource is due again at once.
    """
    claim = renew_claim(tx, claim, lease_ms)
    runner = live_runner(tx, reconcile_id, claim)
    row = get_resource_by_uid(tx, runner.uid)
    actor = Actor(ActorType.RESOURCE_MANAGER, None if row is None else row.manager)
    recover_applying_effects(tx, runner.resource_id, actor=actor, claim=claim)
    due = tx.now
    if row is not None:
        queue = read_queue(tx, row.uid)
        errors = 0 if queue is None else queue.consecutive_errors
        event = _event_since_start(tx, runner)
        if count_error and event is not None:  # the streak counts; the event is not postponed
            schedule(tx, row.uid, event, due, errors=errors + 1, error=error)
        elif count_error:
            due = tx.now + backoff_ms(errors)
            schedule(tx, row.uid, ResourceQueueReason.ERROR, due, errors=errors + 1, error=error)
        else:
            schedule(tx, row.uid, ResourceQueueReason.INTERRUPTED, due, errors=errors, error=error)
    runners.record_error(tx, reconcile_id, error)
    _close(tx, claim, runner, ReconcileOutcome.FAILED)
    return due


def recover_applying_effects(
    tx: Transaction, resource_id: str, *, actor: Actor, claim: Claim | None = None
) -> list[str]:
    """Turn every ``applying`` effect of the resource ``ambiguous`` (recovery ``observe``):
    nobody knows whether its apply happened, so the next reconcile observes before acting."""
    decided = []
    for effect in fx.list_unsettled_effects(tx, resource_id):
        if effect.status is not EffectStatus.APPLYING:
            continue
        recovered = fx.recover_uncertain(tx, effect.effect_id, actor=actor, claim=claim).value
        if recovered.status is EffectStatus.AMBIGUOUS:
            decided.append(effect.effect_id)
    return decided


def recover_orphaned_reconcile(
    tx: Transaction, runner: RunnerRow, *, owner_id: str, lease_ms: int
) -> bool:
    """Startup recovery of a reconcile whose server died: close the row ``orphaned``, fence the
    old claim with a new one, make its applying effects ambiguous and requeue the resource at
    once (no error counted); release the new claim. False when its claim is still live."""
    record_reconcile_exit(tx, runner.reconcile_id, ResourceRunnerStatus.ORPHANED)
    taken = take_claim(tx, runner.resource_id, OwnerType.RESOURCE_MANAGER, owner_id, lease_ms)
    if isinstance(taken, Conflict):
        return False
    claim = taken.value
    row = get_resource_by_uid(tx, runner.uid)
    actor = Actor(ActorType.SERVER, owner_id)
    recover_applying_effects(tx, runner.resource_id, actor=actor, claim=claim)
    if row is not None:
        queue = read_queue(tx, row.uid)
        errors = 0 if queue is None else queue.consecutive_errors
        schedule(tx, row.uid, ResourceQueueReason.INTERRUPTED, tx.now, errors=errors)
    release_claim(tx, claim)
    return True


def _close(
    tx: Transaction, claim: Claim, runner: RunnerRow, outcome: ReconcileOutcome
) -> ReconcileOutcome:
    runners.record_result(tx, runner.reconcile_id, outcome)
    release_claim(tx, claim)
    return outcome
