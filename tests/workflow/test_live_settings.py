"""Live settings in the engine, on the in-memory port.

Each attempt sees the copy its start was given; a change accepted while a run waits reaches the
attempts that start after it, never the one already running; a settings route whose choice
lost to a newer change runs again with the newer copy; grants decide who may change what.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from piwf.errors import WorkflowDefinitionError
from piwf.lifecycle import RunStatus
from piwf.workflow import checkpoint, compute, define_workflow, include
from piwf.workflow.commands import ResumeCommand
from piwf.workflow.compiler import compile_workflow
from piwf.workflow.engine import execute
from piwf.workflow.memory import MemoryPort, run_in_memory
from piwf.workflow.port import NodeStarted
from piwf.workflow.settings import allow_path, settings_route, workflow_settings


class Limits(BaseModel):
    route: str
    limit: int


SETTINGS = workflow_settings(
    initial={"route": "fast", "limit": 3},
    parse=Limits,
    description="how work is routed",
    paths=[allow_path("/route", read=["human", "session"], replace=["human"])],
)


def waiting_workflow() -> object:
    return define_workflow(
        name="live",
        start_at="before",
        nodes={
            "before": compute(lambda ctx: ctx.settings.route),
            "wait": checkpoint(summary="go on?"),
            "after": compute(lambda ctx: {"route": ctx.settings.route, "seen": ctx.settings.limit}),
        },
        edges=[{"from": "before", "to": "wait"}, {"from": "wait", "to": "after"}],
        settings=SETTINGS,
    )


def resume(workflow: object, port: MemoryPort) -> object:
    return execute(ResumeCommand("dry-run"), compile_workflow(workflow), port)  # type: ignore[arg-type]


def test_a_change_while_the_run_waits_reaches_only_later_attempts() -> None:
    workflow = waiting_workflow()
    result, port = run_in_memory(workflow, None)
    assert result.status is RunStatus.WAITING
    assert port.read_run("dry-run").steps[0].output == "fast"  # type: ignore[union-attr]
    replace = [{"op": "replace", "path": "/route", "value": "careful"}]
    changed = port.change_settings(
        "dry-run",
        replace,
        workflow=compile_workflow(workflow),  # type: ignore[arg-type]
    )
    assert changed.change_number == 1
    assert changed.value == {"route": "careful", "limit": 3}
    port.answer(result.request_id, {"approved": True})  # type: ignore[arg-type]
    finished = resume(workflow, port)
    assert finished.status is RunStatus.COMPLETED  # type: ignore[attr-defined]
    assert finished.output == {"route": "careful", "seen": 3}  # type: ignore[attr-defined]
    starts = [m.settings for m in port.messages if isinstance(m, NodeStarted)]
    assert all(scope is not None and scope.mount_path == "" for scope in starts)


def test_a_running_attempt_keeps_its_copy_when_a_change_lands_during_it() -> None:
    box: dict[str, object] = {}

    def during(ctx: object) -> object:
        port = box["port"]
        before = ctx.settings.route  # type: ignore[attr-defined]
        port.change_settings(  # type: ignore[attr-defined]
            "dry-run",
            [{"op": "replace", "path": "/route", "value": "slow"}],
            workflow=box["compiled"],
        )
        return [before, ctx.settings.route]  # type: ignore[attr-defined]

    workflow = define_workflow(
        name="live",
        start_at="one",
        nodes={"one": compute(during), "two": compute(lambda ctx: ctx.settings.route)},
        edges=[{"from": "one", "to": "two"}],
        settings=SETTINGS,
    )
    port = MemoryPort()
    box["port"], box["compiled"] = port, compile_workflow(workflow)
    result, _ = run_in_memory(workflow, None, port=port)
    assert result.status is RunStatus.COMPLETED
    steps = port.read_run("dry-run").steps  # type: ignore[union-attr]
    assert steps[0].output == ["fast", "fast"]
    assert steps[1].output == "slow"


def test_a_settings_route_that_lost_to_a_newer_change_chooses_again() -> None:
    box: dict[str, object] = {"changed": False}

    def choose(ctx: object) -> str:
        chosen = str(ctx.settings.route)  # type: ignore[attr-defined]
        if not box["changed"]:
            box["changed"] = True
            box["port"].change_settings(  # type: ignore[attr-defined]
                "dry-run",
                [{"op": "replace", "path": "/route", "value": "careful"}],
                workflow=box["compiled"],
            )
        return chosen

    workflow = define_workflow(
        name="routed",
        start_at="pick",
        nodes={
            "pick": settings_route(choose, choices=["fast", "careful"]),
            "fast": compute(lambda ctx: "went fast"),
            "careful": compute(lambda ctx: "went carefully"),
        },
        edges=[
            {
                "from": "pick",
                "switch": {"on": "$output.choice", "cases": {"fast": "fast", "careful": "careful"}},
            }
        ],
        settings=SETTINGS,
    )
    port = MemoryPort()
    box["port"], box["compiled"] = port, compile_workflow(workflow)
    result, _ = run_in_memory(workflow, None, port=port)
    assert result.status is RunStatus.COMPLETED
    assert result.output == "went carefully"
    picks = [m for m in port.messages if isinstance(m, NodeStarted) and m.path == "pick"]
    assert [m.attempt for m in picks] == [1, 2]


@pytest.mark.parametrize(
    ("patch", "actor", "says"),
    [
        ([{"op": "replace", "path": "/limit", "value": 9}], "human", "'/limit'"),
        ([{"op": "replace", "path": "/route", "value": "x"}], "session", "session"),
        ([{"op": "replace", "path": "/route", "value": 7}], "human", "parse refused"),
        ([{"op": "remove", "path": "/route"}], "human", "parse refused"),
        ([{"op": "replace", "path": "/nope", "value": 1}], "human", "'/nope'"),
        ([{"op": "jump", "path": "/route"}], "human", "op must be one of"),
        ({"op": "replace"}, "human", "must be a list"),
    ],
)
def test_a_refused_change_says_why_and_changes_nothing(
    patch: object, actor: str, says: str
) -> None:
    workflow = waiting_workflow()
    _, port = run_in_memory(workflow, None)
    compiled = compile_workflow(workflow)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=says):
        port.change_settings("dry-run", patch, workflow=compiled, actor=actor)  # type: ignore[arg-type]
    assert port.settings_scopes[("dry-run", "", 1)].copy.change_number == 0
    assert port.settings_scopes[("dry-run", "", 1)].value == {"route": "fast", "limit": 3}


def test_initial_settings_may_come_from_the_input_and_a_mount_has_its_own_scope() -> None:
    child = define_workflow(
        name="child",
        start_at="read",
        nodes={"read": compute(lambda ctx: ctx.settings)},
        edges=[],
        exits={"done": {"from": "read"}},
        settings=workflow_settings(initial=lambda given: {"depth": given["depth"] + 1}),
    )
    parent = define_workflow(
        name="parent",
        start_at="first",
        nodes={
            "first": compute(lambda ctx: ctx.settings),
            "inner": include(child),
            "last": compute(lambda ctx: ctx.outputs["inner"]["output"]),
        },
        edges=[{"from": "first", "to": "inner"}, {"from": "inner.done", "to": "last"}],
        settings=workflow_settings(initial=lambda given: {"depth": given["depth"]}),
    )
    result, port = run_in_memory(parent, {"depth": 1})
    assert result.status is RunStatus.COMPLETED
    assert port.read_run("dry-run").steps[0].output == {"depth": 1}  # type: ignore[union-attr]
    assert result.output == {"depth": 2}
    assert set(port.settings_scopes) == {("dry-run", "", 1), ("dry-run", "inner", 1)}


def test_refused_initial_settings_fail_the_first_visit() -> None:
    workflow = define_workflow(
        name="bad",
        start_at="one",
        nodes={"one": compute(lambda ctx: 1)},
        edges=[],
        settings=workflow_settings(initial={"route": 1, "limit": "x"}, parse=Limits),
    )
    result, _ = run_in_memory(workflow, None)
    assert result.status is RunStatus.FAILED
    assert "initial settings were refused" in (result.error or "")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: allow_path("route", read=["human"]), "must be empty or start with '/'"),
        (lambda: allow_path("/a", replace=["robot"]), "unknown actor kind"),
        (lambda: allow_path("/a~2", read=["human"]), "'~' must be followed"),
        (lambda: workflow_settings(initial={1, 2}), "initial"),
        (lambda: workflow_settings(initial={}, parse="no"), "parse must be"),
        (lambda: workflow_settings(initial={}, paths=["/a"]), "allow_path"),
        (lambda: settings_route(lambda ctx: "a", choices=[]), "choices"),
    ],
)
def test_malformed_settings_declarations_are_refused_when_defined(make: object, says: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=says):
        make()  # type: ignore[operator]


def test_settings_appear_in_the_snapshot_only_when_declared() -> None:
    plain = compile_workflow(
        define_workflow(name="p", start_at="a", nodes={"a": compute(lambda ctx: 1)}, edges=[])
    )
    live = compile_workflow(waiting_workflow())  # type: ignore[arg-type]
    assert "settings" not in plain.snapshot["workflow"]  # type: ignore[index,call-overload]
    assert live.snapshot["workflow"]["settings"] == {  # type: ignore[index,call-overload]
        "description": "how work is routed",
        "parses": True,
        "paths": [{"path": "/route", "read": ["human", "session"], "replace": ["human"]}],
    }
