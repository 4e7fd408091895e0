"""What a running reconcile may ask of the store: managed effects and child workflow runs.

Each function renews the reconcile's exact live claim first (:class:`~piwf.errors.ClaimLostError`
otherwise, nothing read or written). None of them moves the resource version: effects are their
own aggregates (with their own revisions and events) and a child run is its own run aggregate,
so a reconcile's result still commits against the version it read.

Effects use the outbox of :mod:`piwf.state.effects` with recovery ``observe``::

    reserve ─ new ─────────────▶ pending
            ├ applied/rejected ▶ returned as settled (nothing runs)
            └ applying, older claim generation ▶ ambiguous (its apply may have happened)
    begin   ─ pending ─────────▶ applying, attempt N + 1
            └ ambiguous ───────▶ pending (event effect.resolved_retry) ▶ applying: the runner
                                 observes before it may apply again
    settle  ─ applied/rejected ▶ settled     indeterminate ▶ ambiguous (attempt ``ambiguous``)

Child runs: one ``managed_resource_workflows`` row per (resource, request key) with the
fingerprint of (workflow reference, input); another fingerprint under the key is a
:class:`Conflict`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.lifecycle import Applied, Conflict, EffectStatus, RunStatus
from piwf.state import blobs
from piwf.state import effects as fx
from piwf.state.database import Transaction
from piwf.state.enums import ActorType, EffectOwnerScope, EffectRecovery, ResourceQueueReason
from piwf.state.execution import runs as run_store
from piwf.state.leases import Claim, renew_claim
from piwf.state.records import Actor, read_revision, record_change
from piwf.state.resources.managed import enqueue, get_resource_by_uid

_OTHER_KIND = """
SELECT effect_id FROM effects
WHERE source_resource_id = ? AND idempotency_key = ? AND effect_type != ?
"""

_SELECT_REQUEST = """
SELECT request_id, workflow_ref, input_fingerprint, run_id FROM managed_resource_workflows
WHERE uid = ? AND request_key = ?
"""

_INSERT_REQUEST = """
INSERT INTO managed_resource_workflows (request_id, uid, request_key, workflow_ref,
                                        input_fingerprint, run_id, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""

# Child runs that ended and whose parent has not been enqueued for it yet.
_FINISHED_CHILDREN = """
SELECT w.request_id, w.uid FROM managed_resource_workflows w
JOIN runs r ON r.run_id = w.run_id
WHERE w.notified_at IS NULL AND r.finished_at IS NOT NULL
"""

#: Run status -> the child state a reconcile sees.
_CHILD_STATES: dict[RunStatus, str] = {
    RunStatus.QUEUED: "pending",
    RunStatus.RUNNING: "running",
    RunStatus.WAITING: "waiting",
    RunStatus.COMPLETED: "succeeded",
    RunStatus.FAILED: "failed",
    RunStatus.TIMED_OUT: "failed",
    RunStatus.CANCELLED: "interrupted",
}

#: The largest child output handed back to a reconcile inline.
MAX_CHILD_OUTPUT_BYTES = 256 * 1024


@dataclass(frozen=True)
class EffectState:
    """An effect as a reconcile sees it."""

    effect_id: str
    key: str
    kind: str
    status: EffectStatus
    attempt: int
    result: JsonValue = None
    error: str | None = None


@dataclass(frozen=True)
class ChildRun:
    """A child run as a reconcile sees it."""

    request_key: str
    run_id: str
    state: str
    output: JsonValue = None
    error: str | None = None


def reserve_effect(
    tx: Transaction,
    claim: Claim,
    *,
    key: str,
    kind: str,
    request: JsonValue,
    lease_ms: int,
) -> EffectState | Conflict:
    """Reserve (or find) the effect ``key`` of the claimed resource; see the module table.

    An effect still ``applying`` under this same claim generation is a :class:`Conflict` (this
    reconcile is applying it now); the same key with another request or kind is too.
    """
    claim = renew_claim(tx, claim, lease_ms)
    actor = _actor(tx, claim)
    if tx.scalar(_OTHER_KIND, (claim.resource_id, key, kind)) is not None:
        return Conflict(f"effect key {key!r} is reserved for another kind")
    version = read_revision(tx, claim.resource_id) or 0
    reserved = fx.reserve_effect(
        tx,
        source_resource_id=claim.resource_id,
        source_revision=version,
        effect_type=kind,
        idempotency_key=key,
        payload=request,
        recovery=EffectRecovery.OBSERVE,
        owner_scope=EffectOwnerScope.RESOURCE_MANAGER,
        actor=actor,
        claim=claim,
    )
    if isinstance(reserved, Conflict):
        return reserved
    effect = reserved.value
    if effect.status is EffectStatus.APPLYING:
        if fx.open_attempt_generation(tx, effect.effect_id) == claim.generation:
            return Conflict(f"effect {key!r} is being applied by this reconcile")
        effect = fx.recover_uncertain(tx, effect.effect_id, actor=actor, claim=claim).value
    if effect.status is EffectStatus.CANCELLED:
        return Conflict(f"effect {key!r} was cancelled")
    return _state(tx, effect)


def begin_effect(
    tx: Transaction, claim: Claim, effect_id: str, *, lease_ms: int
) -> EffectState | Conflict:
    """Open the next attempt of a ``pending`` or ``ambiguous`` effect of the claimed resource.

    The attempt records the claim's owner and generation. An ambiguous effect is first moved
    back to pending (event ``effect.resolved_retry``): the runner observes before it applies.
    """
    claim = renew_claim(tx, claim, lease_ms)
    effect = fx.get_effect(tx, effect_id)
    if effect is None or effect.source_resource_id != claim.resource_id:
        return Conflict(f"no effect {effect_id} belongs to this resource")
    actor = _actor(tx, claim)
    if effect.status is EffectStatus.AMBIGUOUS:
        fx.resolve_ambiguous(
            tx, effect_id, resolution="retry", actor=actor, note="observe before apply"
        )
    begun = fx.begin_attempt(
        tx,
        effect_id,
        owner_id=claim.owner_id,
        lease_generation=claim.generation,
        actor=actor,
        claim=claim,
    )
    if not isinstance(begun, Applied):
        return Conflict(f"effect {effect_id} cannot begin an attempt ({begun.kind})")
    return _state(tx, begun.value)


def settle_effect(
    tx: Transaction,
    claim: Claim,
    effect_id: str,
    *,
    attempt: int,
    outcome: Literal["applied", "rejected", "indeterminate"],
    result: JsonValue = None,
    error: str | None = None,
    lease_ms: int,
) -> EffectState | Conflict:
    """Record how the open attempt ``attempt`` ended; ``indeterminate`` makes it ambiguous.

    A repeat of the same settlement adopts; anything else on a settled effect is a Conflict.
    """
    claim = renew_claim(tx, claim, lease_ms)
    effect = fx.get_effect(tx, effect_id)
    if effect is None or effect.source_resource_id != claim.resource_id:
        return Conflict(f"no effect {effect_id} belongs to this resource")
    actor = _actor(tx, claim)
    if outcome == "indeterminate":
        if effect.status is EffectStatus.AMBIGUOUS:
            return _state(tx, effect)
        if effect.status is not EffectStatus.APPLYING or effect.attempt_count != attempt:
            return Conflict(f"effect {effect_id} is {effect.status.value}, not applying")
        error_hash = None if error is None else blobs.put_text(tx, error)
        record_change(
            tx, effect.resource_id, effect.revision, "effect.ambiguous", actor, claim=claim
        )
        fx.close_ambiguous(tx, effect_id, attempt, error_hash)
        return _state(tx, fx.get_effect(tx, effect_id) or effect)
    settled = fx.settle_effect(
        tx,
        effect_id,
        attempt_number=attempt,
        outcome=outcome,
        actor=actor,
        result=result,
        error=error,
        claim=claim,
    )
    if isinstance(settled, Conflict):
        return settled
    return _state(tx, settled.value)


def find_child_run(
    tx: Transaction, claim: Claim, *, uid: str, request_key: str, fingerprint: bytes, lease_ms: int
) -> ChildRun | Conflict | None:
    """The child run of ``request_key``, None when there is none yet, or a Conflict when the
    key was used with another workflow or input."""
    claim = renew_claim(tx, claim, lease_ms)
    found = tx.one(_SELECT_REQUEST, (uid, request_key))
    if found is None:
        return None
    if bytes(found["input_fingerprint"]) != fingerprint:
        return Conflict(
            f"workflow request {request_key!r} exists with another workflow or input;"
            " use a new request key for a changed input"
        )
    return child_run(tx, request_key, str(found["run_id"]))


def create_child_run(
    tx: Transaction,
    claim: Claim,
    *,
    uid: str,
    request_key: str,
    workflow_ref: str,
    fingerprint: bytes,
    new_run: run_store.NewRun,
    lease_ms: int,
) -> ChildRun | Conflict:
    """Reserve the run id, commit the child run ``queued`` and its request row together.

    A request that appeared meanwhile is found instead (same rules as :func:`find_child_run`).
    """
    existing = find_child_run(
        tx, claim, uid=uid, request_key=request_key, fingerprint=fingerprint, lease_ms=lease_ms
    )
    if existing is not None:
        return existing
    row = get_resource_by_uid(tx, uid)
    if row is None:
        return Conflict(f"no managed resource {uid}")
    run_id = run_store.new_run_id()
    run_store.create_run(tx, run_id, new_run, Actor(ActorType.RESOURCE_MANAGER, row.manager))
    tx.execute(
        _INSERT_REQUEST,
        (
            f"mrw-{run_id[4:]}",
            uid,
            request_key,
            workflow_ref,
            fingerprint,
            run_id,
            tx.now,
        ),
    )
    return child_run(tx, request_key, run_id)


def child_run(tx: Transaction, request_key: str, run_id: str) -> ChildRun:
    """The state of one child run, with its output (when small) or error."""
    view = run_store.load_run(tx, run_id)
    if view is None:
        raise LookupError(f"no run {run_id}")
    output: JsonValue = None
    if view.status is RunStatus.COMPLETED:
        output = run_store.read_run_final_output(tx, run_id)
        if len(canonical.encode(output)) > MAX_CHILD_OUTPUT_BYTES:
            output = None
    error = run_store.read_run_error(tx, run_id)
    return ChildRun(
        request_key=request_key,
        run_id=run_id,
        state=_CHILD_STATES[view.status],
        output=output,
        error=None if error is None else error[:1000],
    )


def has_finished_children(tx: Transaction) -> bool:
    """Whether :func:`notify_finished_children` has anything to do (a cheap read)."""
    return tx.one(_FINISHED_CHILDREN + " LIMIT 1") is not None


def notify_finished_children(tx: Transaction) -> list[str]:
    """Enqueue the parent of every child run that ended since it was last looked at; return
    the parents' uids. Called after a run changes and on the scheduler's poll, so a server
    crash between a child's end and its parent's wake-up only delays the wake-up."""
    woken: list[str] = []
    for row in tx.all(_FINISHED_CHILDREN):
        tx.execute(
            "UPDATE managed_resource_workflows SET notified_at = ? WHERE request_id = ?",
            (tx.now, row["request_id"]),
        )
        enqueue(tx, str(row["uid"]), ResourceQueueReason.CHILD_FINISHED)
        woken.append(str(row["uid"]))
    return woken


def list_newest_child_runs(tx: Transaction, uid: str, limit: int) -> list[ChildRun]:
    """The newest ``limit`` child runs of one resource, oldest first (each read in full: its
    state, output and error); :func:`count_child_runs` counts them all."""
    rows = tx.all(
        "SELECT request_key, run_id FROM managed_resource_workflows WHERE uid = ?"
        " ORDER BY created_at DESC, request_key DESC LIMIT ?",
        (uid, limit),
    )
    return [child_run(tx, str(row[0]), str(row[1])) for row in reversed(rows)]


def count_child_runs(tx: Transaction, uid: str) -> int:
    """How many child runs the resource requested."""
    return int(tx.scalar("SELECT count(*) FROM managed_resource_workflows WHERE uid = ?", (uid,)))


def _state(tx: Transaction, effect: fx.Effect) -> EffectState:
    return EffectState(
        effect_id=effect.effect_id,
        key=effect.idempotency_key,
        kind=effect.effect_type,
        status=effect.status,
        attempt=effect.attempt_count,
        result=None if effect.result_hash is None else blobs.read_json(tx, effect.result_hash),
        error=None if effect.error_hash is None else blobs.read_text(tx, effect.error_hash),
    )


def _actor(tx: Transaction, claim: Claim) -> Actor:
    manager = tx.scalar(
        "SELECT manager_name FROM managed_resources WHERE resource_id = ?", (claim.resource_id,)
    )
    return Actor(ActorType.RESOURCE_MANAGER, None if manager is None else str(manager))
