"""Workflow builders shared by the contract tests (this module holds no tests)."""

from __future__ import annotations

import itertools
from typing import Any

from piwf.workflow import (
    action,
    compute,
    define_workflow,
    idempotent_effect,
    manual_effect,
)
from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.sources import load_workflow
from tests.workflow.conftest import FIXTURES

from .ports import Crash


def fixture(name: str) -> CompiledWorkflow:
    """A workflow of ``fixtures/workflows`` (the ones the server tests also run)."""
    return load_workflow(FIXTURES / f"{name}.py").compiled


def chain(
    *nodes: tuple[str, Any], max_steps: int = 100, edges: Any = None, **options: Any
) -> CompiledWorkflow:
    """Nodes run in the order given, unless ``edges`` says otherwise."""
    names = [name for name, _ in nodes]
    return compile_workflow(
        define_workflow(
            name="chain",
            start_at=names[0],
            max_steps=max_steps,
            nodes=dict(nodes),
            edges=edges
            if edges is not None
            else [{"from": a, "to": b} for a, b in itertools.pairwise(names)],
            **options,
        )
    )


def single_action(body: Any, recovery: str = "idempotent", request: Any = None) -> CompiledWorkflow:
    """One action node ``apply`` of effect type ``svc.apply``."""
    effect = (
        idempotent_effect("svc.apply") if recovery == "idempotent" else manual_effect("svc.apply")
    )
    return chain(("apply", action(effect=effect, run=body, request=request)))


def loop(body: Any, rounds: int = 3) -> CompiledWorkflow:
    """``count`` (``body``) then ``again``, back to ``count`` until it ran ``rounds`` times."""
    return chain(
        ("count", body),
        ("again", compute(lambda ctx: {"again": ctx.visit < rounds})),
        ("end", compute(lambda ctx: ctx.outputs["count"])),
        edges=[
            {"from": "count", "to": "again"},
            {
                "from": "again",
                "switch": {"on": "$output.again", "cases": {"true": "count", "false": "end"}},
            },
        ],
    )


def wait_for_signal(ctx: Any) -> Any:
    """A node body that blocks until its signal is set (a timeout or a cancellation)."""
    assert ctx.signal.wait(30)
    ctx.signal.raise_if_cancelled()
    return "unreachable"


class CrashOnFirstCall:
    """A node body that dies like a killed runner the first time it runs."""

    def __init__(self, output: Any = None) -> None:
        self.calls = 0
        self.output = output

    def __call__(self, ctx: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise Crash("killed while running")
        return self.output if self.output is not None else {"visit": ctx.visit}
