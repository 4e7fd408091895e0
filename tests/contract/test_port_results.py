"""The typed result of every port call, proposed by hand, on both ports.

The engine never sends most of these combinations; a runner that is buggy, stale or hostile
can. Each port must answer them the same way: ``Applied`` for a new change, ``Adopted`` for an
equal one already committed, ``Conflict`` for one that contradicts what is saved and
``RecoveryRequired`` when an operator must act. Revisions are each port's own and not compared.
"""

from __future__ import annotations

from typing import Any

from piwf.workflow import compute, identity
from piwf.workflow import port as p
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.context import Outcome
from piwf.workflow.nodes import NotifyKind, Recovery

from .ports import RUN, PortUnderTest
from .workflows import chain

WORKFLOW: CompiledWorkflow = chain(("work", compute(lambda ctx: None)))
REQUEST_ID = identity.request_id(RUN, "work", 1)


def begin(command: p.CommandKind = p.CommandKind.START, title: str | None = "t") -> p.RunBegun:
    return p.RunBegun(RUN, command, WORKFLOW.digest, title)


def started(path: str = "work", visit: int = 1, attempt: int = 1, kind: str = "action") -> Any:
    return p.NodeStarted(RUN, path, visit, attempt, kind, 1_000, None, None)


def reservation(
    request: Any, *, key_type: str = "svc.apply", recovery: Recovery = Recovery.IDEMPOTENT
) -> p.EffectReservation:
    return p.EffectReservation(
        run_id=RUN,
        path="work",
        visit=1,
        effect_key=identity.effect_key(RUN, key_type, "work", 1),
        effect_type=key_type,
        recovery=recovery,
        request=request,
        request_fingerprint=identity.request_fingerprint(request),
    )


def kinds(*results: p.PortResult) -> list[str]:
    return [type(result).__name__ for result in results]


def test_begin_checks_the_command_and_adopts_a_repeat(subject: PortUnderTest) -> None:
    subject.create(WORKFLOW)
    with subject.direct() as port:
        other_digest = p.RunBegun(RUN, p.CommandKind.START, "00" * 32, None)
        assert kinds(
            port.begin_run(begin(p.CommandKind.RESUME)),
            port.begin_run(begin(p.CommandKind.RESTART)),
            port.begin_run(other_digest),
            port.begin_run(begin(title="Greeting")),
            port.begin_run(begin(title="Greeting")),
        ) == ["Conflict", "Conflict", "Conflict", "Applied", "Adopted"]
        assert kinds(port.node_started(started())) == ["Applied"]
        # Once a visit exists the run is no longer fresh: start no longer fits.
        assert kinds(port.begin_run(begin()), port.begin_run(begin(p.CommandKind.RESUME))) == [
            "Conflict",
            "Adopted",
        ]


def test_node_started_numbers_visits_and_attempts(subject: PortUnderTest) -> None:
    subject.create(WORKFLOW)
    with subject.direct() as port:
        port.begin_run(begin())
        assert kinds(
            port.node_started(started(visit=2)),
            port.node_started(started(attempt=2)),
            port.node_started(started()),
            port.node_started(started()),
            port.node_started(started(path="other")),
            port.node_started(started(attempt=3)),
            port.node_started(started(attempt=2)),
            port.node_finished(p.NodeFinished(RUN, "work", 1, 1, {"n": 1}, 2_000)),
            port.node_finished(p.NodeFinished(RUN, "work", 1, 2, {"n": 1}, 2_000)),
            port.node_started(started(visit=1)),
            port.node_started(started(visit=2)),
        ) == [
            "Conflict",
            "Conflict",
            "Applied",
            "Adopted",
            "Conflict",
            "Conflict",
            "Applied",
            "Conflict",
            "Applied",
            "Conflict",
            "Applied",
        ]
    saved = subject.saved()
    assert saved.visits == {"work": 2}
    assert saved.active == p.ActiveVisit("work", 2, 1, 1_000, None)
    assert [(s.visit, s.attempt, s.output, s.finished_at_ms) for s in saved.steps] == [
        (1, 2, {"n": 1}, 2_000)
    ]


def test_a_failed_visit_is_a_step_with_its_error_text(subject: PortUnderTest) -> None:
    subject.create(WORKFLOW)
    with subject.direct() as port:
        port.begin_run(begin())
        port.node_started(started())
        assert kinds(
            port.node_failed(p.NodeFailed(RUN, "work", 1, 1, Outcome.OK, "no", 2_000)),
            port.node_failed(p.NodeFailed(RUN, "work", 1, 2, Outcome.FAILED, "no", 2_000)),
            port.node_failed(p.NodeFailed(RUN, "work", 1, 1, Outcome.TIMED_OUT, "slow", 2_000)),
        ) == ["Conflict", "Conflict", "Applied"]
    saved = subject.saved()
    (step,) = saved.steps
    assert (step.outcome, step.error, step.output, saved.active) == (
        Outcome.TIMED_OUT,
        "slow",
        None,
        None,
    )


def test_updates_adopt_equal_data_and_need_the_active_visit(subject: PortUnderTest) -> None:
    subject.create(WORKFLOW)

    def update(key: str, data: Any, visit: int = 1, update_type: str = "progress") -> Any:
        return p.UpdatePublished(RUN, "work", visit, update_type, key, data)

    with subject.direct() as port:
        port.begin_run(begin())
        port.node_started(started())
        assert kinds(
            port.publish_update(update("build", {"pct": 10})),
            port.publish_update(update("build", {"pct": 50})),
            port.publish_update(update("build", {"pct": 50})),
            port.publish_update(update("test", {"pct": 1})),
            port.publish_update(update("build", {}, visit=2)),
            port.publish_update(update("", {})),
            port.publish_update(update("k", {}, update_type="t" * 257)),
        ) == ["Applied", "Applied", "Adopted", "Applied", "Conflict", "Conflict", "Conflict"]
    assert subject.updates() == {
        ("progress", "build"): {"pct": 50},
        ("progress", "test"): {"pct": 1},
    }


def test_a_notification_is_stored_once_under_its_stable_id(subject: PortUnderTest) -> None:
    subject.create(WORKFLOW)
    note_id = identity.notification_id(RUN, "work", 1)

    def note(text: str, visit: int = 1, notification_id: str = note_id) -> Any:
        return p.NotificationRequested(RUN, "work", visit, notification_id, NotifyKind.FINAL, text)

    with subject.direct() as port:
        port.begin_run(begin())
        port.node_started(started(kind="notify"))
        assert kinds(
            port.notify(note("done")),
            port.notify(note("done")),
            port.notify(note("other text")),
            port.notify(note("late", visit=2, notification_id="n-2")),
        ) == ["Applied", "Adopted", "Conflict", "Conflict"]
    assert [n.message for n in subject.notifications()] == ["done"]


def test_a_request_parks_the_run_and_its_answer_closes_the_visit(
    subject: PortUnderTest,
) -> None:
    subject.create(WORKFLOW)
    request = p.InteractionRequested(
        RUN, "work", 1, REQUEST_ID, p.InteractionKind.CHECKPOINT, {"summary": "s"}
    )
    other = p.InteractionRequested(
        RUN, "work", 1, REQUEST_ID, p.InteractionKind.CHECKPOINT, {"summary": "other"}
    )
    second = p.InteractionRequested(
        RUN, "work", 1, "request-2", p.InteractionKind.CHECKPOINT, {"summary": "s"}
    )
    closing = p.NodeFinished(RUN, "work", 1, 1, {"ok": True}, 2_000, REQUEST_ID)
    with subject.direct() as port:
        port.begin_run(begin())
        port.node_started(started(kind="checkpoint"))
        assert kinds(
            port.park(p.RunParked(RUN, p.ParkReason.WAITING, "work", 1, REQUEST_ID)),
            port.request_interaction(request),
            port.request_interaction(request),
            port.request_interaction(other),
            port.request_interaction(second),
            port.node_started(started(attempt=2, kind="checkpoint")),
            port.node_finished(closing),
            port.node_finished(p.NodeFinished(RUN, "work", 1, 1, {"ok": True}, 2_000)),
            port.park(p.RunParked(RUN, p.ParkReason.WAITING, "work", 1, "request-2")),
            port.park(p.RunParked(RUN, p.ParkReason.WAITING, "work", 1, REQUEST_ID)),
        ) == [
            "Conflict",
            "Applied",
            "Adopted",
            "Conflict",
            "Conflict",
            "Conflict",
            "Conflict",
            "Conflict",
            "Conflict",
            "Applied",
        ]
    assert subject.saved().status is p.RunStatus.WAITING
    subject.answer(REQUEST_ID, {"ok": True})
    with subject.direct() as port:
        assert kinds(
            port.begin_run(begin(p.CommandKind.RESUME, None)),
            port.node_finished(p.NodeFinished(RUN, "work", 1, 1, {"ok": True}, 2_000)),
            port.node_finished(closing),
            port.finish(p.RunFinished(RUN, p.RunStatus.COMPLETED, {"ok": True}, None, "work")),
        ) == ["Adopted", "Conflict", "Applied", "Applied"]
    saved = subject.saved()
    assert (saved.status, saved.output, saved.pending, saved.active) == (
        p.RunStatus.COMPLETED,
        {"ok": True},
        None,
        None,
    )


def test_finish_needs_a_terminal_status_and_closes_what_is_still_open(
    subject: PortUnderTest,
) -> None:
    subject.create(WORKFLOW)
    with subject.direct() as port:
        port.begin_run(begin())
        port.node_started(started())
        assert kinds(
            port.reserve_effect(reservation({"a": 1})),
            port.finish(p.RunFinished(RUN, p.RunStatus.COMPLETED, {"x": 1}, None, "work")),
            port.finish(p.RunFinished(RUN, p.RunStatus.WAITING, None, None, "work")),
            port.finish(p.RunFinished(RUN, p.RunStatus.FAILED, None, "boom", "work")),
        ) == ["Applied", "Conflict", "Conflict", "Applied"]
    saved = subject.saved()
    assert (saved.status, saved.error, saved.active, saved.pending) == (
        p.RunStatus.FAILED,
        "boom",
        None,
        None,
    )
    # The action may have run: the applying effect is ambiguous, never retried by itself.
    assert subject.effect().status == "ambiguous"


def test_a_reservation_checks_its_visit_fingerprint_and_request(subject: PortUnderTest) -> None:
    subject.create(WORKFLOW)
    forged = p.EffectReservation(
        **{**reservation({"a": 1}).__dict__, "request_fingerprint": "0" * 64}
    )
    with subject.direct() as port:
        port.begin_run(begin())
        assert kinds(port.reserve_effect(reservation({"a": 1}))) == ["Conflict"]
        port.node_started(started())
        results = [
            port.reserve_effect(forged),
            port.reserve_effect(reservation({"a": 1})),
            port.reserve_effect(reservation({"a": 1})),  # applying under this very runner
            port.reserve_effect(reservation({"a": 2})),
        ]
        effect = subject.effect()
    assert kinds(*results) == ["Conflict", "Applied", "Conflict", "Conflict"]
    assert isinstance(results[3], p.Conflict) and "another request" in results[3].evidence
    assert (effect.key, effect.status, effect.attempts) == (
        identity.effect_key(RUN, "svc.apply", "work", 1),
        "applying",
        1,
    )


def test_settlements_adopt_repeats_and_an_ambiguous_effect_needs_an_operator(
    subject: PortUnderTest,
) -> None:
    subject.create(WORKFLOW)
    key = identity.effect_key(RUN, "svc.apply", "work", 1)
    other_key = identity.effect_key(RUN, "svc.other", "work", 1)
    manual = reservation({"b": 1}, key_type="svc.other", recovery=Recovery.MANUAL)
    applied = p.EffectSettlement(RUN, key, p.EffectOutcome.APPLIED, {"id": 7})
    uncertain = p.EffectSettlement(RUN, other_key, p.EffectOutcome.AMBIGUOUS, None, "timed out")
    parked = p.RunParked(RUN, p.ParkReason.EFFECT_AMBIGUOUS, "work", 1, None, "timed out")
    with subject.direct() as port:
        port.begin_run(begin())
        port.node_started(started())
        port.reserve_effect(reservation({"a": 1}))
        assert kinds(
            port.park(parked),
            port.settle_effect(applied),
            port.settle_effect(applied),
            port.settle_effect(p.EffectSettlement(RUN, key, p.EffectOutcome.REJECTED, None, "no")),
            port.settle_effect(p.EffectSettlement(RUN, "effect-unknown", p.EffectOutcome.APPLIED)),
        ) == ["Conflict", "Applied", "Adopted", "Conflict", "Conflict"]
        adopted = port.reserve_effect(reservation({"a": 1}))
        assert isinstance(adopted, p.Adopted)
        assert adopted.value.settled == p.SettledEffect(p.EffectOutcome.APPLIED, {"id": 7})
        assert kinds(
            port.reserve_effect(manual),
            port.settle_effect(uncertain),
            port.settle_effect(uncertain),
        ) == ["Applied", "Applied", "Adopted"]
        assert port.reserve_effect(manual) == p.RecoveryRequired("effectAmbiguous")
        assert kinds(port.park(parked)) == ["Applied"]
    saved = subject.saved()
    assert (saved.status, saved.park_reason) == (p.RunStatus.PARKED, p.ParkReason.EFFECT_AMBIGUOUS)
    assert [(e.effect_type, e.status, e.error) for e in subject.effects()] == sorted(
        [("svc.apply", "applied", None), ("svc.other", "ambiguous", "timed out")],
        key=lambda row: {"svc.apply": key, "svc.other": other_key}[row[0]],
    )
