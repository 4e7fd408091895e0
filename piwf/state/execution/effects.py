"""Managed effects proposed by a runner: reservation before the action, settlement after it.

The engine derives ``effect_key`` from (run id, effect type, full node path, visit); it becomes
the effect's idempotency key under the run's resource, so the effect id is deterministic and a
crash retry of the same visit finds the same effect. What a reservation answers::

    no effect yet ─────────────▶ reserve + begin attempt 1            Applied       (action runs)
    applied | rejected ────────▶ nothing                               Adopted(settled=...)
    applying (runner died) ─┬─ idempotent ─▶ pending, begin attempt N+1 Adopted(settled=None)
                            └─ manual ─────▶ ambiguous                  RecoveryRequired
    pending (recovered) ───────▶ begin attempt N+1                     Adopted(settled=None)
    ambiguous ─────────────────▶ nothing                               RecoveryRequired
    cancelled, another request ▶ nothing                               Conflict

Every function renews the exact live run claim first (:class:`~piwf.errors.ClaimLostError`
otherwise, nothing written) and, when it changes anything, bumps the run revision once with one
run event besides the effect's own events, so an effect change always counts as run progress.
"""

from __future__ import annotations

from piwf import canonical
from piwf.lifecycle import Adopted, Applied, Conflict, EffectStatus, RecoveryRequired
from piwf.state import blobs
from piwf.state import effects as fx
from piwf.state.database import Transaction
from piwf.state.enums import EffectOwnerScope, EffectRecovery
from piwf.state.execution import attempts
from piwf.state.execution.core import RUNNER_ACTOR, record_run_change, require_run_claim
from piwf.state.execution.runs import RunRow, load_run
from piwf.state.leases import Claim
from piwf.state.records import record_change
from piwf.workflow import port
from piwf.workflow.port import Committed


def apply_reserve_effect(
    tx: Transaction, claim: Claim, message: port.EffectReservation, *, lease_ms: int
) -> port.PortResult:
    """Reserve the managed effect of the active visit before its action runs (see the table).

    Checks that the visit is the active one and that ``request_fingerprint`` is the SHA-256 of
    the request's canonical JSON. The effect is reserved with ``source_resource_id`` = the run's
    resource, ``idempotency_key`` = ``effect_key`` and the message's recovery; a new attempt
    records the claim's owner and generation. An effect still ``applying`` under this same claim
    generation is a ``Conflict`` (the action may be running right now). Run events:
    ``effect.reserved``, ``effect.retried``; an ``applying`` manual effect of an older
    generation becomes ``ambiguous`` (the effect's event) and the answer is
    ``RecoveryRequired`` with the run revision unchanged.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = load_run(tx, message.run_id)
    if run is None or not run.executing:
        return Conflict(f"run {message.run_id} is not executing")
    active = attempts.active_attempt(tx, run.run_id)
    if active is None or (active.path, active.visit) != (message.path, message.visit):
        return Conflict(f"visit {message.visit} of {message.path!r} is not the active visit")
    if canonical.digest_hex(message.request) != message.request_fingerprint:
        return Conflict("request fingerprint does not match the request")
    recovery = EffectRecovery(message.recovery.value)  # a workflow's recovery, as stored
    effect_id = fx.effect_id_for(run.resource_id, message.effect_type, message.effect_key)
    reserved = fx.reserve_effect(
        tx,
        source_resource_id=run.resource_id,
        source_revision=run.revision + 1,
        effect_type=message.effect_type,
        idempotency_key=message.effect_key,
        payload=message.request,
        recovery=recovery,
        owner_scope=EffectOwnerScope.RUN,
        actor=RUNNER_ACTOR,
        claim=claim,
    )
    if isinstance(reserved, Conflict):
        return Conflict(f"managed effect key reused with another request: {reserved.evidence}")
    effect = reserved.value
    if isinstance(reserved, Applied):
        _begin(tx, effect_id, claim)
        revision = _run_event(tx, run, "effect.reserved", claim, effect, message)
        return Applied(Committed(revision))
    if effect.status in (EffectStatus.APPLIED, EffectStatus.REJECTED):
        return Adopted(Committed(run.revision, settled=_settled(tx, effect)))
    if effect.status is EffectStatus.AMBIGUOUS:
        return RecoveryRequired("effectAmbiguous")
    if effect.status is EffectStatus.CANCELLED:
        return Conflict(f"effect {effect_id} was cancelled")
    if effect.status is EffectStatus.APPLYING:
        if fx.open_attempt_generation(tx, effect_id) == claim.generation:
            return Conflict(f"effect {effect_id} is applying under this generation")
        recovered = fx.recover_uncertain(tx, effect_id, actor=RUNNER_ACTOR, claim=claim).value
        if recovered.status is EffectStatus.AMBIGUOUS:
            # The effect records its own ``effect.ambiguous`` event; the run revision stays as
            # the runner knows it (a RecoveryRequired answer carries none), so the park it
            # sends next applies (the run's record of it is that ``run.parked``).
            return RecoveryRequired("effectAmbiguous")
    _begin(tx, effect_id, claim)
    revision = _run_event(tx, run, "effect.retried", claim, effect, message)
    return Adopted(Committed(revision))


def apply_settle_effect(
    tx: Transaction, claim: Claim, message: port.EffectSettlement, *, lease_ms: int
) -> port.PortResult:
    """Record how the open attempt of the run's effect ``effect_key`` ended.

    ``applied``/``rejected`` go through ``effects.settle_effect`` (a repeat of the same
    settlement is ``Adopted``); ``ambiguous`` closes the attempt ``ambiguous`` and makes the
    effect ``ambiguous`` (never retried automatically). An unknown key, or an effect that is not
    applying, is a ``Conflict``. Run events: ``effect.settled``, ``effect.ambiguous``.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    run = load_run(tx, message.run_id)
    if run is None or not run.executing:
        return Conflict(f"run {message.run_id} is not executing")
    effect = fx.find_effect(tx, run.resource_id, message.effect_key)
    if effect is None:
        return Conflict(f"no effect {message.effect_key} is reserved by this run")
    if message.outcome is port.EffectOutcome.AMBIGUOUS:
        if effect.status is EffectStatus.AMBIGUOUS:
            return Adopted(Committed(run.revision))
        if effect.status is not EffectStatus.APPLYING:
            return Conflict(f"effect is {effect.status.value}, not applying")
        _settle_ambiguous(tx, effect, message.error, claim)
        revision = _run_event(tx, run, "effect.ambiguous", claim, effect, None)
        return Applied(Committed(revision))
    settled = fx.settle_effect(
        tx,
        effect.effect_id,
        attempt_number=effect.attempt_count,
        outcome="applied" if message.outcome is port.EffectOutcome.APPLIED else "rejected",
        actor=RUNNER_ACTOR,
        result=message.result,
        error=message.error,
        claim=claim,
    )
    if isinstance(settled, Conflict):
        return Conflict(settled.evidence)
    if isinstance(settled, Adopted):
        return Adopted(Committed(run.revision))
    revision = _run_event(tx, run, "effect.settled", claim, settled.value, None)
    return Applied(Committed(revision))


def _begin(tx: Transaction, effect_id: str, claim: Claim) -> fx.Effect:
    begun = fx.begin_attempt(
        tx,
        effect_id,
        owner_id=claim.owner_id,
        lease_generation=claim.generation,
        actor=RUNNER_ACTOR,
        claim=claim,
    )
    if not isinstance(begun, Applied):  # pragma: no cover - only a pending effect reaches here
        raise AssertionError(f"effect {effect_id} could not begin: {begun}")
    return begun.value


def _settle_ambiguous(tx: Transaction, effect: fx.Effect, error: str | None, claim: Claim) -> None:
    error_hash = None if error is None else blobs.put_text(tx, error)
    record_change(
        tx, effect.resource_id, effect.revision, "effect.ambiguous", RUNNER_ACTOR, claim=claim
    )
    fx.close_ambiguous(tx, effect.effect_id, effect.attempt_count, error_hash)


def _settled(tx: Transaction, effect: fx.Effect) -> port.SettledEffect:
    return port.SettledEffect(
        outcome=port.EffectOutcome(effect.status.value),
        result=None if effect.result_hash is None else blobs.read_json(tx, effect.result_hash),
        error=None if effect.error_hash is None else blobs.read_text(tx, effect.error_hash),
    )


def _run_event(
    tx: Transaction,
    run: RunRow,
    event_type: str,
    claim: Claim,
    effect: fx.Effect,
    message: port.EffectReservation | None,
) -> int:
    payload: dict[str, object] = {"effectId": effect.effect_id}
    if message is not None:
        payload.update(path=message.path, visit=message.visit)
    return record_run_change(tx, run, event_type, RUNNER_ACTOR, claim, payload)
