"""Managed-effect identity: full paths, visit numbers, adoption and conflicts (seed 003)."""

from __future__ import annotations

from typing import Any

import pytest

from piwf.workflow import (
    action,
    compute,
    define_workflow,
    idempotent_effect,
    identity,
    manual_effect,
)
from piwf.workflow.commands import ResumeCommand, StartCommand
from piwf.workflow.engine import execute
from piwf.workflow.memory import EffectStatus, MemoryPort
from piwf.workflow.nodes import Recovery
from piwf.workflow.port import (
    Adopted,
    Applied,
    Conflict,
    EffectOutcome,
    EffectReservation,
    EffectSettlement,
    NodeFinished,
    NodeStarted,
    ParkReason,
    RunBegun,
    RunStatus,
)

from .conftest import Crash, CrashingPort, compiled, load_fixture


class CrashOnFirstCall:
    """An action body that dies like a killed runner the first time it runs."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ctx: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise Crash("killed while applying")
        return {"applied": ctx.visit}


def single_action(run: Any, recovery: str = "idempotent", request: Any = None) -> Any:
    effect = (
        idempotent_effect("svc.apply") if recovery == "idempotent" else manual_effect("svc.apply")
    )
    return define_workflow(
        name="single",
        start_at="apply",
        nodes={"apply": action(effect=effect, run=run, request=request)},
        edges=[],
    )


def start(workflow: Any, port: MemoryPort, run_id: str = "run-1", payload: Any = None) -> Any:
    port.create_run(run_id, payload, definition_digest=workflow.digest)
    return execute(StartCommand(run_id), workflow, port)


# conformance: X18
def test_two_mounts_of_the_same_action_get_different_effect_keys() -> None:
    workflow = load_fixture("composition").compiled
    port = MemoryPort()
    start(workflow, port, "run-c", {"repo": "/repo"})
    outer, inner = port.effects_of("run-c")
    assert (outer.path, inner.path) == ("workspace/inspect", "docs/workspace/inspect")
    assert (outer.visit, inner.visit) == (1, 1)
    assert outer.effect_type == inner.effect_type == "workspace.inspect"
    assert outer.request != inner.request
    assert outer.key == identity.effect_key("run-c", "workspace.inspect", "workspace/inspect", 1)
    assert inner.key == identity.effect_key(
        "run-c", "workspace.inspect", "docs/workspace/inspect", 1
    )
    assert outer.key != inner.key


def test_the_same_key_with_another_request_is_a_conflict_at_the_port() -> None:
    port = MemoryPort()
    workflow = compiled(single_action(lambda ctx: 1))
    port.create_run("run-1", None, definition_digest=workflow.digest)
    port.begin_run(RunBegun("run-1", StartCommand.kind, workflow.digest, None))
    port.node_started(NodeStarted("run-1", "apply", 1, 1, "action", 0, None, None))
    key = identity.effect_key("run-1", "svc.apply", "apply", 1)

    def reserve(request: Any) -> Any:
        return port.reserve_effect(
            EffectReservation(
                "run-1",
                "apply",
                1,
                key,
                "svc.apply",
                Recovery.IDEMPOTENT,
                request,
                identity.request_fingerprint(request),
            )
        )

    assert isinstance(reserve({"a": 1}), Applied)
    port.settle_effect(EffectSettlement("run-1", key, EffectOutcome.APPLIED, {"done": True}))
    adopted = reserve({"a": 1})
    assert isinstance(adopted, Adopted)
    settled = adopted.value.settled
    assert settled is not None and settled.result == {"done": True}
    conflict = reserve({"a": 2})
    assert isinstance(conflict, Conflict)
    assert "reused with another request" in conflict.evidence


# conformance: X18
def test_a_crash_retry_of_the_same_visit_reuses_its_key() -> None:
    body = CrashOnFirstCall()
    workflow = compiled(single_action(body))
    port = MemoryPort()
    with pytest.raises(Crash):
        start(workflow, port)
    saved = port.read_run("run-1")
    assert saved is not None and saved.active is not None
    assert (saved.active.path, saved.active.visit, saved.active.attempt) == ("apply", 1, 1)
    (reserved,) = port.effects_of("run-1")
    assert reserved.status is EffectStatus.APPLYING
    result = execute(ResumeCommand("run-1"), workflow, port)
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"applied": 1})
    (effect,) = port.effects_of("run-1")
    assert effect.key == reserved.key == identity.effect_key("run-1", "svc.apply", "apply", 1)
    assert effect.attempts == 2
    assert effect.status is EffectStatus.APPLIED
    starts = [(m.visit, m.attempt) for m in port.messages if isinstance(m, NodeStarted)]
    assert starts == [(1, 1), (1, 2)]
    assert body.calls == 2


# conformance: X18
def test_a_later_loop_visit_gets_a_new_key() -> None:
    def decide(ctx: Any) -> Any:
        return {"again": ctx.outputs["apply"]["applied"] < 2}

    workflow = compiled(
        define_workflow(
            name="loop",
            start_at="apply",
            nodes={
                "apply": action(
                    effect=idempotent_effect("svc.apply"),
                    run=lambda ctx: {"applied": ctx.visit},
                ),
                "decide": compute(decide),
                "end": compute(lambda ctx: ctx.outputs["apply"]),
            },
            edges=[
                {"from": "apply", "to": "decide"},
                {
                    "from": "decide",
                    "switch": {"on": "$output.again", "cases": {"true": "apply", "false": "end"}},
                },
            ],
        )
    )
    port = MemoryPort()
    result = start(workflow, port)
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"applied": 2})
    first, second = port.effects_of("run-1")
    assert (first.visit, second.visit) == (1, 2)
    assert first.key != second.key
    assert second.key == identity.effect_key("run-1", "svc.apply", "apply", 2)


def test_an_adopted_settled_effect_is_not_applied_again() -> None:
    calls: list[int] = []

    def apply(ctx: Any) -> Any:
        calls.append(ctx.attempt)
        return {"receipt": "r-1"}

    workflow = compiled(single_action(apply))
    port = CrashingPort()
    port.arm(EffectSettlement)
    with pytest.raises(Crash):
        start(workflow, port)
    result = execute(ResumeCommand("run-1"), workflow, port)
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"receipt": "r-1"})
    assert calls == [1]
    finished = [m for m in port.messages if isinstance(m, NodeFinished)]
    assert [(m.visit, m.attempt) for m in finished] == [(1, 2)]


def test_a_changed_request_on_crash_retry_conflicts_and_never_runs() -> None:
    requests = iter([{"n": 1}, {"n": 2}])
    body = CrashOnFirstCall()
    workflow = compiled(single_action(body, request=lambda ctx: next(requests)))
    port = MemoryPort()
    with pytest.raises(Crash):
        start(workflow, port)
    result = execute(ResumeCommand("run-1"), workflow, port)
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert "reused with another request" in result.error
    assert "the action did not run" in result.error
    assert body.calls == 1


def test_an_uncertain_manual_effect_parks_until_an_operator_resolves_it() -> None:
    body = CrashOnFirstCall()
    workflow = compiled(single_action(body, recovery="manual"))
    port = MemoryPort()
    with pytest.raises(Crash):
        start(workflow, port)
    parked = execute(ResumeCommand("run-1"), workflow, port)
    assert parked.status is RunStatus.PARKED
    assert parked.park_reason is ParkReason.EFFECT_AMBIGUOUS
    (effect,) = port.effects_of("run-1")
    assert effect.status is EffectStatus.AMBIGUOUS
    again = execute(ResumeCommand("run-1"), workflow, port)
    assert again.status is RunStatus.PARKED
    assert body.calls == 1
    port.resolve_effect(effect.key, EffectOutcome.APPLIED, {"checked": "by hand"})
    done = execute(ResumeCommand("run-1"), workflow, port)
    assert (done.status, done.output) == (RunStatus.COMPLETED, {"checked": "by hand"})
    assert body.calls == 1


def test_a_rejected_effect_is_adopted_as_a_failure() -> None:
    workflow = compiled(single_action(CrashOnFirstCall(), recovery="manual"))
    port = MemoryPort()
    with pytest.raises(Crash):
        start(workflow, port)
    execute(ResumeCommand("run-1"), workflow, port)
    (effect,) = port.effects_of("run-1")
    port.resolve_effect(effect.key, EffectOutcome.REJECTED, None, "the API refused it")
    done = execute(ResumeCommand("run-1"), workflow, port)
    assert (done.status, done.error) == (RunStatus.FAILED, "the API refused it")


def test_an_action_error_settles_its_effect_rejected() -> None:
    def refuse(ctx: Any) -> Any:
        raise PermissionError("denied")

    port = MemoryPort()
    result = start(compiled(single_action(refuse)), port)
    assert (result.status, result.error) == (RunStatus.FAILED, "PermissionError: denied")
    (effect,) = port.effects_of("run-1")
    assert (effect.status, effect.error) == (EffectStatus.REJECTED, "PermissionError: denied")
