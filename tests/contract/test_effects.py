"""Managed effects on both ports: reserve before acting, adopt, conflict, recovery (seed 003)."""

from __future__ import annotations

import sys
from typing import Any

from piwf.workflow import action, compute, idempotent_effect, identity, manual_effect, shell
from piwf.workflow import port as p

from .ports import EffectView, PortUnderTest
from .workflows import CrashOnFirstCall, chain, fixture, single_action, wait_for_signal

KEY = identity.effect_key("run-1", "svc.apply", "apply", 1)


def _view(
    key: str,
    status: str,
    attempts: int,
    result: Any = None,
    error: str | None = None,
    recovery: str = "idempotent",
) -> EffectView:
    return EffectView(key, "svc.apply", recovery, status, attempts, result, error)


def attempts(subject: PortUnderTest, path: str) -> list[tuple[int, int]]:
    return [(m.visit, m.attempt) for m in subject.sent(p.NodeStarted, path)]


def test_an_effect_is_reserved_before_its_action_runs_and_settled_after(
    subject: PortUnderTest,
) -> None:
    seen: list[list[str]] = []

    def apply(ctx: Any) -> Any:
        # What the port had been asked when the action runs: the reservation, never a settlement.
        seen.append([type(call.message).__name__ for call in subject.calls])
        return {"receipt": "r-1"}

    result = subject.start(single_action(apply, request=lambda ctx: {"change": 7}))
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"receipt": "r-1"})
    assert seen == [["RunBegun", "NodeStarted", "EffectReservation"]]
    (reservation,) = subject.sent(p.EffectReservation)
    assert (reservation.effect_key, reservation.request) == (KEY, {"change": 7})
    assert reservation.request_fingerprint == identity.request_fingerprint({"change": 7})
    assert [type(r) for r in subject.results(p.EffectReservation)] == [p.Applied]
    assert subject.effect() == _view(KEY, "applied", 1, {"receipt": "r-1"})


# conformance: X18
def test_two_mounts_of_the_same_action_get_different_effect_keys(subject: PortUnderTest) -> None:
    subject.start(fixture("composition"), {"repo": "/repo"})
    reservations = {m.path: m for m in subject.sent(p.EffectReservation)}
    outer, inner = reservations["workspace/inspect"], reservations["docs/workspace/inspect"]
    assert (outer.visit, inner.visit) == (1, 1)
    assert outer.effect_type == inner.effect_type == "workspace.inspect"
    assert outer.request != inner.request
    assert outer.effect_key == identity.effect_key(
        "run-1", "workspace.inspect", "workspace/inspect", 1
    )
    assert inner.effect_key == identity.effect_key(
        "run-1", "workspace.inspect", "docs/workspace/inspect", 1
    )
    assert sorted(e.key for e in subject.effects()) == sorted([outer.effect_key, inner.effect_key])
    assert {e.status for e in subject.effects()} == {"applied"}


# conformance: X18
def test_a_later_loop_visit_gets_a_new_key(subject: PortUnderTest) -> None:
    workflow = chain(
        ("apply", action(effect=idempotent_effect("svc.apply"), run=lambda ctx: ctx.visit)),
        ("decide", compute(lambda ctx: {"again": ctx.outputs["apply"] < 2})),
        ("end", compute(lambda ctx: ctx.outputs["apply"])),
        edges=[
            {"from": "apply", "to": "decide"},
            {
                "from": "decide",
                "switch": {"on": "$output.again", "cases": {"true": "apply", "false": "end"}},
            },
        ],
    )
    result = subject.start(workflow)
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, 2)
    keys = [m.effect_key for m in subject.sent(p.EffectReservation)]
    assert keys == [KEY, identity.effect_key("run-1", "svc.apply", "apply", 2)]
    assert [(e.key, e.status, e.result) for e in subject.effects()] == sorted(
        [(KEY, "applied", 1), (keys[1], "applied", 2)]
    )


def test_the_effects_fixture_reserves_each_effect_with_its_request_and_recovery(
    subject: PortUnderTest,
) -> None:
    result = subject.start(fixture("effects"), {"service": "api", "change": "c-1"})
    assert (result.status, result.output) == (
        p.RunStatus.COMPLETED,
        {"posted": "deployed https://preview.invalid/api"},
    )
    deploy, announce = subject.sent(p.EffectReservation)
    assert (deploy.effect_type, deploy.recovery.value) == ("preview.deploy", "idempotent")
    assert deploy.request == {"service": "api", "key": "c-1"}
    assert (announce.effect_type, announce.recovery.value) == ("chat.post", "manual")
    assert {(e.effect_type, e.recovery, e.status) for e in subject.effects()} == {
        ("preview.deploy", "idempotent", "applied"),
        ("chat.post", "manual", "applied"),
    }


# conformance: X7
# conformance: X18
def test_a_crash_retry_of_an_idempotent_effect_runs_again_under_the_same_key(
    subject: PortUnderTest,
) -> None:
    body = CrashOnFirstCall({"deployed": True})
    subject.create(single_action(body))
    subject.crash()
    saved = subject.saved()
    assert saved.active is not None
    assert (saved.active.path, saved.active.visit, saved.active.attempt) == ("apply", 1, 1)
    result = subject.run()
    assert result is not None
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"deployed": True})
    assert subject.effect() == _view(KEY, "applied", 2, {"deployed": True})
    assert attempts(subject, "apply") == [(1, 1), (1, 2)]
    # The retry's reservation found the unsettled effect: adopted, nothing settled to reuse.
    retried = subject.results(p.EffectReservation)[1]
    assert isinstance(retried, p.Adopted) and retried.value.settled is None
    assert body.calls == 2


def test_a_settled_effect_is_adopted_and_its_action_does_not_run_again(
    subject: PortUnderTest,
) -> None:
    calls: list[int] = []

    def deploy(ctx: Any) -> Any:
        calls.append(ctx.attempt)
        return {"receipt": "r-1"}

    subject.create(single_action(deploy))
    subject.crash(after=p.EffectSettlement)
    result = subject.run()
    assert result is not None
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"receipt": "r-1"})
    assert calls == [1]
    second = subject.results(p.EffectReservation)[1]
    assert isinstance(second, p.Adopted)
    assert second.value.settled == p.SettledEffect(p.EffectOutcome.APPLIED, {"receipt": "r-1"})
    assert subject.effect() == _view(KEY, "applied", 1, {"receipt": "r-1"})
    assert [(m.visit, m.attempt) for m in subject.sent(p.NodeFinished)] == [(1, 2)]


def test_a_rejected_settlement_is_adopted_as_the_same_failure(subject: PortUnderTest) -> None:
    calls: list[int] = []

    def refuse(ctx: Any) -> Any:
        calls.append(ctx.attempt)
        raise PermissionError("denied")

    subject.create(single_action(refuse))
    subject.crash(after=p.EffectSettlement)
    result = subject.run()
    assert result is not None
    assert (result.status, result.error) == (
        p.RunStatus.FAILED,
        'node "apply" (attempt 2) failed: PermissionError: denied',
    )
    assert calls == [1]
    second = subject.results(p.EffectReservation)[1]
    assert isinstance(second, p.Adopted) and second.value.settled is not None
    assert (second.value.settled.outcome, second.value.settled.error) == (
        p.EffectOutcome.REJECTED,
        "PermissionError: denied",
    )


def test_a_changed_request_on_a_crash_retry_conflicts_and_never_runs(
    subject: PortUnderTest,
) -> None:
    requests = iter([{"n": 1}, {"n": 2}])
    body = CrashOnFirstCall()
    subject.create(single_action(body, request=lambda ctx: next(requests)))
    subject.crash()
    result = subject.run()
    assert result is not None
    assert result.status is p.RunStatus.FAILED
    assert result.error is not None
    assert "reused with another request" in result.error
    assert "the action did not run" in result.error
    assert isinstance(subject.results(p.EffectReservation)[1], p.Conflict)
    assert body.calls == 1
    # The reservation the retry could not make leaves the first one as it was: not applied.
    assert subject.effect().status != "applied"


# conformance: X7
def test_an_uncertain_manual_effect_parks_the_run_until_an_operator_resolves_it(
    subject: PortUnderTest,
) -> None:
    body = CrashOnFirstCall({"deployed": True})
    subject.create(single_action(body, recovery="manual"))
    subject.crash()
    for _ in range(2):  # the next command, and any later one, finds it parked
        subject.run()
        saved = subject.saved()
        assert (saved.status, saved.park_reason) == (
            p.RunStatus.PARKED,
            p.ParkReason.EFFECT_AMBIGUOUS,
        )
        assert subject.effect() == _view(KEY, "ambiguous", 1, recovery="manual")
    assert body.calls == 1
    subject.resolve_applied("run-1", KEY)
    result = subject.run()
    assert result is not None
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, None)
    assert subject.effect().status == "applied"
    assert body.calls == 1


def test_an_action_error_settles_its_effect_rejected(subject: PortUnderTest) -> None:
    def refuse(ctx: Any) -> Any:
        raise PermissionError("denied")

    result = subject.start(single_action(refuse))
    assert (result.status, result.error) == (
        p.RunStatus.FAILED,
        'node "apply" failed: PermissionError: denied',
    )
    assert subject.effect() == _view(KEY, "rejected", 1, error="PermissionError: denied")


def test_a_timed_out_idempotent_action_settles_rejected(subject: PortUnderTest) -> None:
    node = action(effect=idempotent_effect("svc.apply"), run=wait_for_signal, timeout_ms=40)
    result = subject.start(chain(("apply", node)))
    assert result.status is p.RunStatus.TIMED_OUT
    assert subject.effect() == _view(KEY, "rejected", 1, error="timed out after 40 ms")


def test_a_timed_out_manual_action_becomes_ambiguous_and_parks(subject: PortUnderTest) -> None:
    node = action(effect=manual_effect("svc.apply"), run=wait_for_signal, timeout_ms=40)
    result = subject.start(chain(("apply", node)))
    assert (result.status, result.park_reason, result.detail) == (
        p.RunStatus.PARKED,
        p.ParkReason.EFFECT_AMBIGUOUS,
        "effect 'svc.apply' may or may not have been applied: timed out after 40 ms",
    )
    saved = subject.saved()
    assert (saved.status, saved.park_reason) == (p.RunStatus.PARKED, p.ParkReason.EFFECT_AMBIGUOUS)
    assert subject.effect() == _view(
        KEY, "ambiguous", 1, error="timed out after 40 ms", recovery="manual"
    )


PRINT = "import sys; sys.stdout.write('x' * 100); sys.stderr.write('e'); sys.exit(3)"


def test_a_failed_shell_command_settles_rejected_with_its_receipt(subject: PortUnderTest) -> None:
    node = shell(effect=idempotent_effect("svc.apply"), command=[sys.executable, "-c", PRINT])
    result = subject.start(chain(("apply", node)))
    assert result.status is p.RunStatus.FAILED
    (failed,) = subject.sent(p.NodeFailed)
    assert failed.error == f"{sys.executable!r} exited with code 3; stderr:\ne"
    assert result.error == f'node "apply" failed: {failed.error}'
    effect = subject.effect()
    assert (effect.status, effect.error) == ("rejected", failed.error)
    assert isinstance(effect.result, dict)
    assert (effect.result["exit_code"], effect.result["stdout"]) == (3, "x" * 100)


def test_a_shell_result_is_parsed_into_the_output(subject: PortUnderTest) -> None:
    result = subject.start(fixture("shell_status"))
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"major": 3})
    effect = subject.effect()
    assert isinstance(effect.result, dict)
    assert (effect.status, effect.result["exit_code"], effect.result["stdout"]) == (
        "applied",
        0,
        "3\n",
    )
