"""Effects: reservation adopt/conflict, the state machine, recovery and cancellation."""

from __future__ import annotations

import pytest

from piwf.clock import FakeClock
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, Conflict, EffectStatus, RecoveryRequired
from piwf.state import StateDatabase
from piwf.state import effects as fx
from piwf.state.enums import (
    ActorType,
    EffectAttemptOutcome,
    EffectOwnerScope,
    EffectRecovery,
    OwnerType,
    ResourceType,
)
from piwf.state.leases import Claim
from piwf.state.records import Actor, claim_resource, ensure_resource, list_events

RUNNER = Actor(ActorType.RUNNER, "runner-1")
OPERATOR = Actor(ActorType.HUMAN, "operator")


def run_resource(db: StateDatabase) -> str:
    with db.write() as tx:
        return ensure_resource(tx, ResourceType.RUN, "run-1")


def reserve(
    db: StateDatabase,
    source: str,
    payload: object,
    recovery: EffectRecovery = EffectRecovery.IDEMPOTENT,
    key: str = "visit-1",
    claim: Claim | None = None,
) -> fx.Effect | Conflict:
    with db.write() as tx:
        result = fx.reserve_effect(
            tx,
            source_resource_id=source,
            source_revision=1,
            effect_type="preview.deploy",
            idempotency_key=key,
            payload=payload,
            recovery=recovery,
            owner_scope=EffectOwnerScope.RUN,
            actor=RUNNER,
            claim=claim,
        )
    if isinstance(result, Conflict):
        return result
    return result.value


def begin(db: StateDatabase, effect_id: str) -> object:
    with db.write() as tx:
        return fx.begin_attempt(
            tx, effect_id, owner_id="runner-1", lease_generation=1, actor=RUNNER
        )


def status(db: StateDatabase, effect_id: str) -> EffectStatus:
    with db.read() as tx:
        effect = fx.get_effect(tx, effect_id)
    assert effect is not None
    return effect.status


# conformance: S7
def test_a_matching_repeated_reservation_adopts(db: StateDatabase) -> None:
    source = run_resource(db)
    first = reserve(db, source, {"target": "a"})
    with db.write() as tx:
        again = fx.reserve_effect(
            tx,
            source_resource_id=source,
            source_revision=1,
            effect_type="preview.deploy",
            idempotency_key="visit-1",
            payload={"target": "a"},
            recovery=EffectRecovery.IDEMPOTENT,
            owner_scope=EffectOwnerScope.RUN,
            actor=RUNNER,
        )
    assert isinstance(first, fx.Effect) and isinstance(again, Adopted)
    assert again.value.effect_id == first.effect_id
    assert first.effect_id == fx.effect_id_for(source, "preview.deploy", "visit-1")
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM effects") == 1


# conformance: S7
def test_another_request_under_the_same_key_is_a_conflict(db: StateDatabase) -> None:
    source = run_resource(db)
    reserve(db, source, {"target": "a"})
    assert isinstance(reserve(db, source, {"target": "b"}), Conflict)
    assert isinstance(
        reserve(db, source, {"target": "a"}, recovery=EffectRecovery.MANUAL), Conflict
    )
    assert isinstance(reserve(db, source, {"target": "b"}, key="visit-2"), fx.Effect)


def test_apply_and_settle(db: StateDatabase) -> None:
    source = run_resource(db)
    effect = reserve(db, source, {"n": 1})
    assert isinstance(effect, fx.Effect) and effect.status is EffectStatus.PENDING
    started = begin(db, effect.effect_id)
    assert isinstance(started, Applied) and started.value.status is EffectStatus.APPLYING
    with db.write() as tx:
        settled = fx.settle_effect(
            tx,
            effect.effect_id,
            attempt_number=1,
            outcome="applied",
            actor=RUNNER,
            result={"url": "https://preview"},
        )
    assert isinstance(settled, Applied) and settled.value.settled_at is not None
    with db.write() as tx:
        repeat = fx.settle_effect(
            tx,
            effect.effect_id,
            attempt_number=1,
            outcome="applied",
            actor=RUNNER,
            result={"url": "https://preview"},
        )
        other = fx.settle_effect(
            tx,
            effect.effect_id,
            attempt_number=1,
            outcome="applied",
            actor=RUNNER,
            result={"url": "https://elsewhere"},
        )
    assert isinstance(repeat, Adopted)
    assert isinstance(other, Conflict)
    again = begin(db, effect.effect_id)
    assert isinstance(again, Adopted), "a settled effect is never applied again"
    with db.read() as tx:
        attempts = fx.list_attempts(tx, effect.effect_id)
        events = [e.event_type for e in list_events(tx, effect.resource_id)]
    assert [(a.attempt_number, a.outcome) for a in attempts] == [(1, EffectAttemptOutcome.APPLIED)]
    assert events == ["effect.reserved", "effect.applying", "effect.applied"]


# conformance: S7
def test_an_uncertain_idempotent_effect_returns_to_pending_and_retries(
    db: StateDatabase,
) -> None:
    source = run_resource(db)
    effect = reserve(db, source, {"n": 1})
    assert isinstance(effect, fx.Effect)
    begin(db, effect.effect_id)
    with db.write() as tx:
        recovered = fx.recover_uncertain(tx, effect.effect_id, actor=RUNNER)
    assert isinstance(recovered, Applied) and recovered.value.status is EffectStatus.PENDING
    second = begin(db, effect.effect_id)
    assert isinstance(second, Applied) and second.value.attempt_count == 2
    with db.read() as tx:
        outcomes = [a.outcome for a in fx.list_attempts(tx, effect.effect_id)]
    assert outcomes == [EffectAttemptOutcome.INTERRUPTED, None]


# conformance: S7
def test_an_uncertain_manual_effect_becomes_ambiguous_and_is_never_retried(
    db: StateDatabase,
) -> None:
    source = run_resource(db)
    effect = reserve(db, source, {"n": 1}, recovery=EffectRecovery.MANUAL)
    assert isinstance(effect, fx.Effect)
    begin(db, effect.effect_id)
    with db.write() as tx:
        fx.recover_uncertain(tx, effect.effect_id, actor=RUNNER)
    assert status(db, effect.effect_id) is EffectStatus.AMBIGUOUS
    assert isinstance(begin(db, effect.effect_id), RecoveryRequired)
    with db.read() as tx:
        assert len(fx.list_attempts(tx, effect.effect_id)) == 1


@pytest.mark.parametrize(
    ("resolution", "expected"),
    [("applied", EffectStatus.APPLIED), ("retry", EffectStatus.PENDING)],
)
def test_an_operator_resolves_an_ambiguous_effect(
    db: StateDatabase, resolution: str, expected: EffectStatus
) -> None:
    source = run_resource(db)
    effect = reserve(db, source, {"n": 1}, recovery=EffectRecovery.MANUAL)
    assert isinstance(effect, fx.Effect)
    begin(db, effect.effect_id)
    with db.write() as tx:
        fx.recover_uncertain(tx, effect.effect_id, actor=RUNNER)
        resolved = fx.resolve_ambiguous(
            tx,
            effect.effect_id,
            resolution=resolution,
            actor=OPERATOR,  # type: ignore[arg-type]
        )
    assert isinstance(resolved, Applied) and resolved.value.status is expected
    with db.write() as tx:
        repeat = fx.resolve_ambiguous(
            tx,
            effect.effect_id,
            resolution=resolution,
            actor=OPERATOR,  # type: ignore[arg-type]
        )
    assert isinstance(repeat, Adopted)
    with db.read() as tx:
        events = list_events(tx, effect.resource_id)
    assert events[-1].event_type == f"effect.resolved_{resolution}"
    assert events[-1].actor_type is ActorType.HUMAN


def test_resolving_an_effect_that_is_not_ambiguous_is_a_conflict(db: StateDatabase) -> None:
    source = run_resource(db)
    effect = reserve(db, source, {"n": 1})
    assert isinstance(effect, fx.Effect)
    with db.write() as tx:
        result = fx.resolve_ambiguous(tx, effect.effect_id, resolution="applied", actor=OPERATOR)
    assert isinstance(result, Conflict)
    # the refusal names the effect's own run, and for a pending effect what moves it on
    run = "run-1"
    assert result.evidence == (
        "effect is pending, not ambiguous: there is nothing to resolve (only an effect that may"
        f" or may not have happened takes a resolution; piwf run show {run} lists a run's"
        " effects with their status; its run's next runner applies it (piwf run resume"
        f" {run} if the run is parked))"
    )


def test_cancel_turns_pending_cancelled_and_applying_ambiguous(db: StateDatabase) -> None:
    source = run_resource(db)
    pending = reserve(db, source, {"n": 1}, key="a")
    applying = reserve(db, source, {"n": 2}, key="b")
    assert isinstance(pending, fx.Effect) and isinstance(applying, fx.Effect)
    begin(db, applying.effect_id)
    with db.write() as tx:
        fx.cancel_effect(tx, pending.effect_id, actor=RUNNER)
        fx.cancel_effect(tx, applying.effect_id, actor=RUNNER)
    assert status(db, pending.effect_id) is EffectStatus.CANCELLED
    assert status(db, applying.effect_id) is EffectStatus.AMBIGUOUS
    with db.read() as tx:
        outcomes = [a.outcome for a in fx.list_attempts(tx, applying.effect_id)]
    assert outcomes == [EffectAttemptOutcome.INTERRUPTED]
    assert isinstance(begin(db, pending.effect_id), Conflict)


def test_a_stale_claim_cannot_reserve(db: StateDatabase, clock: FakeClock) -> None:
    source = run_resource(db)
    with db.write() as tx:
        taken = claim_resource(tx, source, OwnerType.SERVER, "server-a", 1000)
    assert isinstance(taken, Applied)
    clock.advance(1000)
    with pytest.raises(ClaimLostError):
        reserve(db, source, {"n": 1}, claim=taken.value)
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM effects") == 0
        assert tx.scalar("SELECT count(*) FROM resources WHERE resource_type = 'effect'") == 0


def test_the_unsettled_effects_of_a_source_are_its_pending_applying_and_ambiguous_ones(
    db: StateDatabase,
) -> None:
    source = run_resource(db)
    with db.write() as tx:
        other = ensure_resource(tx, ResourceType.RUN, "run-2")
    settled = reserve(db, source, {"n": 1}, key="settled")
    pending = reserve(db, source, {"n": 2}, key="pending")
    applying = reserve(db, source, {"n": 3}, key="applying")
    ambiguous = reserve(db, source, {"n": 4}, EffectRecovery.MANUAL, key="ambiguous")
    elsewhere = reserve(db, other, {"n": 5}, key="elsewhere")
    for effect in (settled, pending, applying, ambiguous, elsewhere):
        assert isinstance(effect, fx.Effect)
    assert isinstance(settled, fx.Effect) and isinstance(applying, fx.Effect)
    assert isinstance(ambiguous, fx.Effect) and isinstance(pending, fx.Effect)
    for effect in (settled, applying, ambiguous):
        begin(db, effect.effect_id)
    with db.write() as tx:
        fx.settle_effect(tx, settled.effect_id, attempt_number=1, outcome="applied", actor=RUNNER)
        fx.recover_uncertain(tx, ambiguous.effect_id, actor=RUNNER)
    with db.read() as tx:
        found = fx.list_unsettled_effects(tx, source)
        everything = fx.list_effects(tx, source)
    assert [(e.effect_id, e.status) for e in found] == [
        (e.effect_id, e.status) for e in everything if e.status is not EffectStatus.APPLIED
    ]
    assert {e.effect_id: e.status for e in found} == {
        pending.effect_id: EffectStatus.PENDING,
        applying.effect_id: EffectStatus.APPLYING,
        ambiguous.effect_id: EffectStatus.AMBIGUOUS,
    }


def test_a_listing_shows_the_newest_effects_and_every_unsettled_one_in_reservation_order(
    db: StateDatabase, clock: FakeClock
) -> None:
    """Reserved in one millisecond or over several, the newest are the last reserved; an older
    effect still pending is shown too; another source's effects, reserved in between, are
    neither listed nor counted."""
    source = run_resource(db)
    with db.write() as tx:
        other = ensure_resource(tx, ResourceType.RUN, "run-2")
    mine = []
    for n in range(7):
        effect = reserve(db, source, {"n": n}, key=f"z-{6 - n}")  # keys sort against the order
        assert isinstance(reserve(db, other, {"n": n}, key=f"other-{n}"), fx.Effect)
        assert isinstance(effect, fx.Effect)
        mine.append(effect.effect_id)
        if n % 2:
            clock.advance(1)
    for effect_id in mine[1:]:  # all but the oldest settle
        begin(db, effect_id)
        with db.write() as tx:
            fx.settle_effect(tx, effect_id, attempt_number=1, outcome="applied", actor=RUNNER)
    with db.read() as tx:
        shown = fx.list_shown_effects(tx, source, 3)
        assert [e.effect_id for e in shown] == [mine[0], *mine[-3:]]
        assert shown[0].status is EffectStatus.PENDING
        assert [e.effect_id for e in fx.list_shown_effects(tx, source, 50)] == mine
        assert {e.effect_id for e in fx.list_effects(tx, source)} == set(mine)
        assert (fx.count_effects(tx, source), fx.count_effects(tx, other)) == (7, 7)
