"""Forks of a run from one of its steps (``state/execution/forks.py``): which steps are copied,
what the fork holds, that the real engine resumes it at the node, and that every refusal writes
nothing."""

from __future__ import annotations

from typing import Any

import pytest

from piwf.lifecycle import Applied, CommandKind, Conflict, Lineage
from piwf.state import StateDatabase
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.execution import forks, runs
from piwf.workflow import action, compute, define_workflow, identity, include, manual_effect
from piwf.workflow import port as p
from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.engine import execute

from .test_execution_support import (
    LEASE_MS,
    OPERATOR,
    SERVER_ID,
    Crash,
    StorePort,
    attempts,
    command_for,
    create,
    dump,
    exit_and_recover,
    launch,
    run_once,
    violations,
)

SOURCE = "run-source"
FORK = "run-fork"


def fork(db: StateDatabase, node: str, new_run_id: str = FORK) -> Applied[runs.RunRow] | Conflict:
    with db.write() as tx:
        return forks.fork_run(tx, SOURCE, from_node=node, new_run_id=new_run_id, actor=OPERATOR)


def looping(calls: list[tuple[str, int]]) -> CompiledWorkflow:
    """``count`` -> ``again`` -> back to ``count`` until ``again`` ran twice, then ``end``;
    every real call of a node body is recorded in ``calls``."""

    def body(name: str, value: Any) -> Any:
        def run(ctx: Any) -> Any:
            calls.append((name, ctx.visit))
            return value(ctx)

        return run

    return compile_workflow(
        define_workflow(
            name="looping",
            start_at="count",
            nodes={
                "count": compute(body("count", lambda ctx: {"n": ctx.visit})),
                "again": compute(body("again", lambda ctx: {"again": ctx.visit < 2})),
                "end": compute(body("end", lambda ctx: ctx.outputs["count"])),
            },
            edges=[
                {"from": "count", "to": "again"},
                {
                    "from": "again",
                    "switch": {"on": "$output.again", "cases": {"true": "count", "false": "end"}},
                },
            ],
        )
    )


def test_the_fork_point_is_the_first_visit_or_the_visit_left_open() -> None:
    steps = ["count", "again", "count", "again", "end"]
    assert forks.fork_point(steps, set(), "count") == 0
    assert forks.fork_point(steps, set(), "again") == 1, "a looped node forks from visit 1"
    assert forks.fork_point(steps, set(), "end") == 4
    assert forks.fork_point(steps[:3], {"again"}, "again") == 1, "a step beats an open attempt"
    assert forks.fork_point(steps[:3], {"review"}, "review") == 3, "the open visit: all steps"
    assert forks.fork_point(steps, set(), "review") is None


def test_definition_paths_are_the_compiled_node_paths_through_mounts() -> None:
    inner = define_workflow(
        name="inner",
        start_at="x",
        nodes={"x": compute(lambda ctx: 1)},
        edges=[],
        exits={"out": {"from": "x"}},
    )
    middle = define_workflow(
        name="middle",
        start_at="deep",
        includes={"deep": include(inner)},
        nodes={"y": compute(lambda ctx: 2)},
        edges=[{"from": "deep.out", "to": "y"}],
        exits={"out": {"from": "y"}},
    )
    root = define_workflow(
        name="root",
        start_at="first",
        includes={"child": include(middle)},
        nodes={"first": compute(lambda ctx: 0)},
        edges=[{"from": "first", "to": "child"}],
    )
    compiled = compile_workflow(root)
    assert forks.definition_paths(compiled.snapshot) == sorted(compiled.nodes)
    assert forks.definition_paths(compiled.snapshot) == ["child/deep/x", "child/y", "first"]


def test_a_fork_from_a_looped_node_copies_the_steps_before_its_first_visit(
    db: StateDatabase,
) -> None:
    calls: list[tuple[str, int]] = []
    workflow = looping(calls)
    create(db, workflow, SOURCE, {"task": "t"})
    *_, source_result = run_once(db, workflow)
    assert source_result.status is p.RunStatus.COMPLETED
    assert calls == [("count", 1), ("again", 1), ("count", 2), ("again", 2), ("end", 1)]
    before = dump(db)

    created = fork(db, "again")

    assert isinstance(created, Applied), created
    forked = created.value
    assert (forked.run_id, forked.lineage, forked.parent_run_id) == (FORK, Lineage.FORK, SOURCE)
    assert (forked.root_run_id, forked.restart_number, forked.status.value) == (SOURCE, 1, "queued")
    assert forked.to_json()["lineage"] == "fork"
    assert attempts(db, FORK) == [("count", 1, 1, "completed")], "only the step before visit 1"
    with db.read() as tx:
        source, copy = runs.require_run(tx, SOURCE), runs.require_run(tx, FORK)
        assert (copy.definition_digest, copy.input_hash) == (
            source.definition_digest,
            source.input_hash,
        )
        assert (copy.title, copy.workflow_ref) == (source.title, source.workflow_ref)
        assert runs.list_run_sources(tx, FORK) == runs.list_run_sources(tx, SOURCE)
        saved = ex.read_saved_run(tx, FORK)
        events = tx.all("SELECT event_type FROM events WHERE resource_id = ?", (f"run:{FORK}",))
    assert saved is not None and not saved.fresh
    assert [(step.path, step.visit, step.output) for step in saved.steps] == [
        ("count", 1, {"n": 1})
    ]
    assert [row[0] for row in events] == ["run.forked"]
    after = dump(db)
    for table in ("effects", "interactive_requests", "run_runners", "workflow_updates"):
        assert after[table] == before[table], f"a fork copies no {table}"
    assert [row for row in after["runs"] if row[0] == SOURCE] == [
        row for row in before["runs"] if row[0] == SOURCE
    ], "the source is not changed"

    calls.clear()
    launched = launch(db)
    assert (launched.run_id, launched.command) == (FORK, CommandKind.RESUME)
    result = execute(command_for(launched), workflow, StorePort(db, launched))
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"n": 2})
    assert calls == [("again", 1), ("count", 2), ("again", 2), ("end", 1)], "count 1 never reran"
    assert violations(db) == []


def test_a_fork_into_a_mount_resumes_inside_it(db: StateDatabase) -> None:
    calls: list[str] = []

    def node(name: str) -> Any:
        return compute(lambda ctx: calls.append(name) or name)

    child = define_workflow(
        name="child",
        start_at="x",
        nodes={"x": node("child/x"), "y": node("child/y")},
        edges=[{"from": "x", "to": "y"}],
        exits={"out": {"from": "y"}},
    )
    workflow = compile_workflow(
        define_workflow(
            name="mounting",
            start_at="first",
            includes={"child": include(child)},
            nodes={"first": node("first"), "end": node("end")},
            edges=[{"from": "first", "to": "child"}, {"from": "child.out", "to": "end"}],
        )
    )
    create(db, workflow, SOURCE)
    run_once(db, workflow)
    assert calls == ["first", "child/x", "child/y", "end"]
    calls.clear()

    assert isinstance(fork(db, "child/y"), Applied)
    launched = launch(db)
    result = execute(command_for(launched), workflow, StorePort(db, launched))
    assert result.status is p.RunStatus.COMPLETED
    assert calls == ["child/y", "end"]
    assert violations(db) == []


def test_refusals_name_the_cause_and_write_nothing(db: StateDatabase) -> None:
    calls: list[tuple[str, int]] = []
    workflow = looping(calls)
    create(db, workflow, SOURCE)
    launched = launch(db)
    before = dump(db)
    executing = fork(db, "again")
    assert isinstance(executing, Conflict) and "piwf run pause" in executing.evidence
    assert dump(db) == before
    execute(command_for(launched), workflow, StorePort(db, launched))
    before = dump(db)

    cases = {
        "nowhere": "has no node of that path; its nodes: again, count, end; give a full",
        "Cuont": "its nodes: again, count, end (did you mean count?); give a full node path",
        "count": "nothing ran in run run-source before that node",
    }
    for node, message in cases.items():
        refused = fork(db, node)
        assert isinstance(refused, Conflict) and message in refused.evidence, refused
        assert node == "count" or node not in refused.evidence, "the request is never echoed"
    with pytest.raises(LookupError):
        with db.write() as tx:
            forks.fork_run(tx, "run-missing", from_node="count", new_run_id=FORK, actor=OPERATOR)
    assert isinstance(fork(db, "again", new_run_id=SOURCE), Conflict), "an id in use"
    assert dump(db) == before


def test_a_node_that_never_ran_is_refused_with_the_nodes_that_did(db: StateDatabase) -> None:
    workflow = compile_workflow(
        define_workflow(
            name="branching",
            start_at="a",
            nodes={
                "a": compute(lambda ctx: {"go": "b"}),
                "b": compute(lambda ctx: "b"),
                "c": compute(lambda ctx: "c"),
            },
            edges=[{"from": "a", "switch": {"on": "$output.go", "cases": {"b": "b", "c": "c"}}}],
        )
    )
    create(db, workflow, SOURCE)
    run_once(db, workflow)
    before = dump(db)
    refused = fork(db, "c")
    assert isinstance(refused, Conflict)
    assert refused.evidence == (
        "that node never ran in run run-source; fork from a node that ran: a, b"
    )
    assert dump(db) == before


def test_an_ambiguous_effect_blocks_a_fork_until_it_is_resolved(db: StateDatabase) -> None:
    def die(ctx: Any) -> Any:
        raise Crash("killed while applying")

    workflow = compile_workflow(
        define_workflow(
            name="posting",
            start_at="prepare",
            nodes={
                "prepare": compute(lambda ctx: {"text": "hi"}),
                "post": action(effect=manual_effect("chat.post"), run=die),
                "after": compute(lambda ctx: "after"),
            },
            edges=[{"from": "prepare", "to": "post"}, {"from": "post", "to": "after"}],
        )
    )
    create(db, workflow, SOURCE)
    launched = launch(db)
    with pytest.raises(Crash):
        execute(command_for(launched), workflow, StorePort(db, launched))
    assert exit_and_recover(db, launched).decision is ex.RecoveryDecision.EFFECT_AMBIGUOUS
    with db.read() as tx:
        (effect,) = fx.list_effects(tx, f"run:{SOURCE}")
    before = dump(db)

    refused = fork(db, "post")

    assert isinstance(refused, Conflict)
    assert f"{effect.effect_id} (ambiguous)" in refused.evidence
    assert "piwf effect resolve EFFECT_ID" in refused.evidence
    assert dump(db) == before
    with db.write() as tx:
        fx.resolve_ambiguous(tx, effect.effect_id, resolution="applied", actor=OPERATOR)
    created = fork(db, "post")
    assert isinstance(created, Applied), created
    assert attempts(db, FORK) == [("prepare", 1, 1, "completed")]
    assert violations(db) == []


def test_every_attempt_of_a_copied_visit_is_copied_under_the_forks_ids(db: StateDatabase) -> None:
    tries: list[str] = []

    def flaky(ctx: Any) -> Any:
        tries.append("b")
        if len(tries) == 1:
            raise Crash("killed while running b")
        return {"b": len(tries)}

    workflow = compile_workflow(
        define_workflow(
            name="flaky",
            start_at="a",
            nodes={
                "a": compute(lambda ctx: {"a": 1}),
                "b": compute(flaky),
                "c": compute(lambda ctx: ctx.outputs["b"]),
            },
            edges=[{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
        )
    )
    create(db, workflow, SOURCE)
    launched = launch(db)
    with pytest.raises(Crash):
        execute(command_for(launched), workflow, StorePort(db, launched))
    exit_and_recover(db, launched)
    *_, finished = run_once(db, workflow)
    assert finished.status is p.RunStatus.COMPLETED
    assert attempts(db, SOURCE)[1:3] == [("b", 1, 1, "interrupted"), ("b", 1, 2, "completed")]

    assert isinstance(fork(db, "c"), Applied)

    assert attempts(db, FORK) == [
        ("a", 1, 1, "completed"),
        ("b", 1, 1, "interrupted"),
        ("b", 1, 2, "completed"),
    ]
    with db.read() as tx:
        ids = [
            row[0]
            for row in tx.all("SELECT attempt_id FROM node_attempts WHERE run_id = ?", (FORK,))
        ]
        steps = tx.all(
            "SELECT attempt_id FROM run_steps WHERE run_id = ? ORDER BY step_index", (FORK,)
        )
    assert sorted(ids) == sorted(
        identity.attempt_id(FORK, path, 1, number)
        for path, number in (("a", 1), ("b", 1), ("b", 2))
    )
    assert [row[0] for row in steps] == [
        identity.attempt_id(FORK, "a", 1, 1),
        identity.attempt_id(FORK, "b", 1, 2),
    ]
    launched = launch(db)
    result = execute(command_for(launched), workflow, StorePort(db, launched))
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"b": 2})
    assert tries == ["b", "b"], "b never ran in the fork"
    assert violations(db) == []


def test_a_run_where_no_node_ran_is_refused_saying_so(db: StateDatabase) -> None:
    workflow = looping([])
    create(db, workflow, SOURCE)
    with db.write() as tx:
        ex.cancel_run(tx, SOURCE, actor=OPERATOR, control_owner_id=SERVER_ID, lease_ms=LEASE_MS)
    before = dump(db)
    refused = fork(db, "again")
    assert isinstance(refused, Conflict)
    assert refused.evidence.startswith(
        "no node has run in run run-source yet, so there is nothing to fork from"
    ), refused.evidence
    assert "none" not in refused.evidence
    assert dump(db) == before
