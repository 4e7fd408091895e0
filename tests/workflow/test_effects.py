"""The memory port's operator helpers for ambiguous effects (not part of the server's API).

Managed-effect behaviour itself (keys, adoption, conflicts, recovery after a crash) is in the
contract suite, ``tests/contract/test_effects.py``, on both ports. The server's operator can
only say ``applied`` (no result) or ``retry``; a dry run can also give the result the operator
saw, or reject the effect.
"""

from __future__ import annotations

from typing import Any

import pytest

from piwf.workflow import action, define_workflow, manual_effect
from piwf.workflow.commands import ResumeCommand, StartCommand
from piwf.workflow.engine import execute
from piwf.workflow.memory import EffectStatus, MemoryPort
from piwf.workflow.port import EffectOutcome, RunStatus

from .conftest import Crash, compiled


def crash_once() -> Any:
    calls: list[int] = []

    def run(ctx: Any) -> Any:
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise Crash("killed while applying")
        return "unreachable"

    return run, calls


def ambiguous_run(port: MemoryPort) -> tuple[Any, list[int], str]:
    body, calls = crash_once()
    workflow = compiled(
        define_workflow(
            name="single",
            start_at="apply",
            nodes={"apply": action(effect=manual_effect("svc.apply"), run=body)},
            edges=[],
        )
    )
    port.create_run("run-1", None, definition_digest=workflow.digest)
    with pytest.raises(Crash):
        execute(StartCommand("run-1"), workflow, port)
    assert execute(ResumeCommand("run-1"), workflow, port).status is RunStatus.PARKED
    (effect,) = port.effects_of("run-1")
    assert effect.status is EffectStatus.AMBIGUOUS
    return workflow, calls, effect.key


def test_an_operator_may_give_the_result_an_ambiguous_effect_had() -> None:
    port = MemoryPort()
    workflow, calls, key = ambiguous_run(port)
    port.resolve_effect(key, EffectOutcome.APPLIED, {"checked": "by hand"})
    done = execute(ResumeCommand("run-1"), workflow, port)
    assert (done.status, done.output) == (RunStatus.COMPLETED, {"checked": "by hand"})
    assert calls == [1]


def test_an_operator_may_reject_an_ambiguous_effect() -> None:
    port = MemoryPort()
    workflow, calls, key = ambiguous_run(port)
    port.resolve_effect(key, EffectOutcome.REJECTED, None, "the API refused it")
    done = execute(ResumeCommand("run-1"), workflow, port)
    assert (done.status, done.error) == (
        RunStatus.FAILED,
        'node "apply" (attempt 3) failed: the API refused it',
    )
    assert calls == [1]
    with pytest.raises(ValueError, match="not ambiguous"):
        port.resolve_effect(key, EffectOutcome.APPLIED)
