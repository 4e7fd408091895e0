"""Eager validation: every broken authoring rule fails at define time with a precise error."""

from __future__ import annotations

from typing import Any

import pytest

from piwf.errors import WorkflowDefinitionError
from piwf.workflow import (
    action,
    agent,
    checkpoint,
    compute,
    define_workflow,
    human_decision,
    idempotent_effect,
    include,
    manual_effect,
    notify,
    shell,
)


def noop(ctx: Any) -> None:
    return None


def define(**overrides: Any) -> Any:
    spec: dict[str, Any] = {
        "name": "sample",
        "start_at": "a",
        "nodes": {"a": compute(noop), "b": compute(noop)},
        "edges": [{"from": "a", "to": "b"}],
    }
    spec.update(overrides)
    return define_workflow(**spec)


def child_with_exit() -> Any:
    return define_workflow(
        name="child",
        start_at="work",
        nodes={"work": compute(noop)},
        edges=[],
        exits={"done": {"from": "work"}},
    )


def test_valid_definition_records_its_file_and_shape() -> None:
    workflow = define()
    assert workflow.name == "sample"
    assert workflow.source_file == __file__
    assert set(workflow.nodes) == {"a", "b"}
    assert workflow.max_steps == 100


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "bad name"}, "name must match"),
        ({"name": "status"}, "'status' is reserved"),
        ({"name": "answer"}, "'answer' is reserved"),
        ({"nodes": {}}, "nodes must be a non-empty mapping"),
        (
            {"nodes": {"a": compute(noop), "b-2/x": compute(noop)}, "edges": []},
            "node id 'b-2/x' must match",
        ),
        ({"nodes": {"a": compute(noop), "b": noop}}, "node 'b' must be created with"),
        ({"start_at": "zzz"}, "start_at 'zzz' is not a node"),
        ({"edges": [{"from": "a", "to": "missing"}]}, "targets unknown node 'missing'"),
        ({"edges": [{"from": "ghost", "to": "b"}]}, "edge from unknown node 'ghost'"),
        (
            {"edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "a"}]},
            "node 'a' has more than one outgoing edge",
        ),
        ({"edges": []}, "node(s) b cannot be reached from 'a'"),
        ({"edges": [{"from": "a"}]}, "must have exactly the keys from+to or from+switch"),
        (
            {"edges": [{"form": "a", "to": "b"}]},
            "edge #1 needs a 'from' node id (it has 'form', which no edge takes)",
        ),
        (
            {"edges": [{"from": "a", "switch": {"on": "output.x", "cases": {"x": "b"}}}]},
            "switch 'on' must be",
        ),
        (
            {"edges": [{"from": "a", "switch": {"on": "$result.outcome", "cases": {"oops": "b"}}}]},
            "cases must be among ok, failed, timed_out, cancelled",
        ),
        (
            {"edges": [{"from": "a", "switch": {"on": "$output.x", "cases": {}}}]},
            "switch cases must be a non-empty mapping",
        ),
        ({"max_steps": 0}, "max_steps must lie in 1.."),
        ({"max_steps": True}, "max_steps must be an integer"),
        ({"title": 3}, "title must be a string or a callable"),
        ({"input": "not callable"}, "input must be a parser callable"),
    ],
)
def test_broken_rules_name_the_workflow_and_the_rule(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        define(**overrides)
    assert message in str(info.value)
    assert str(info.value).startswith("workflow ")


def test_a_node_that_is_no_node_names_every_factory_and_how_to_wrap_a_function() -> None:
    """Timer nodes are nodes too; a bare function, the usual slip, is told to use compute()."""
    with pytest.raises(WorkflowDefinitionError) as bare:
        define(nodes={"a": compute(noop), "b": noop})
    message = str(bare.value)
    assert "sleep(), wait_until() or include(); got function" in message
    assert message.endswith(
        "wrap a plain function in compute(...), or action(...) if it has side effects"
    )
    assert "0x" not in message  # names no object by its repr
    with pytest.raises(WorkflowDefinitionError) as number:
        define(nodes={"a": compute(noop), "b": 3})
    assert str(number.value).endswith("; got int")


def test_decision_switch_must_cover_every_declared_choice() -> None:
    decision = human_decision(choices={"ship": "Ship", "hold": "Hold"})
    nodes = {"ask": decision, "ship": compute(noop)}
    with pytest.raises(WorkflowDefinitionError, match="no case for declared choice.*hold"):
        define(
            start_at="ask",
            nodes=nodes,
            edges=[{"from": "ask", "switch": {"on": "$output.choice", "cases": {"ship": "ship"}}}],
        )
    with pytest.raises(WorkflowDefinitionError, match="case\\(s\\) maybe that are not declared"):
        define(
            start_at="ask",
            nodes=nodes,
            edges=[
                {
                    "from": "ask",
                    "switch": {
                        "on": "$output.choice",
                        "cases": {"ship": "ship", "hold": "ship", "maybe": "ship"},
                    },
                }
            ],
        )


@pytest.mark.parametrize("effect_type", ["", "   ", "x" * 257])
def test_effect_type_length_is_checked_after_trimming(effect_type: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match="1..256 characters after trimming"):
        idempotent_effect(effect_type)
    with pytest.raises(WorkflowDefinitionError, match="1..256 characters after trimming"):
        manual_effect(effect_type)


def test_effect_type_is_trimmed_and_256_characters_pass() -> None:
    assert idempotent_effect("  deploy  ").type == "deploy"
    assert manual_effect("y" * 256).type == "y" * 256


def test_actions_and_shells_must_declare_an_effect() -> None:
    with pytest.raises(WorkflowDefinitionError, match="idempotent_effect\\(type\\) or manual"):
        action(effect="deploy", run=noop)  # type: ignore[arg-type]
    with pytest.raises(WorkflowDefinitionError, match="effect must be"):
        shell(effect=None, command=["true"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: compute(noop, timeout_ms=0), "timeout_ms must be a positive integer"),
        (lambda: compute("nope"), "run must be callable"),  # type: ignore[arg-type]
        (lambda: shell(effect=idempotent_effect("x"), command="git status"), "argv list"),
        (lambda: shell(effect=idempotent_effect("x"), command=[]), "non-empty list"),
        (lambda: notify(message="m", kind="loud"), "'progress' or 'final'"),
        (lambda: checkpoint(summary=3), "summary must be a string"),  # type: ignore[arg-type]
        (lambda: human_decision(choices={}), "at least one choice"),
        (lambda: human_decision(choices=["a", "a"]), "declared twice"),
        (
            lambda: human_decision(
                choices=["a"], on_timeout={"after_ms": 10, "response": {"choice": "b"}}
            ),
            "choice 'b' is not one of a",
        ),
        (
            lambda: human_decision(choices=["a"], on_timeout={"after_ms": 0, "response": {}}),
            "after_ms must be a positive integer",
        ),
        (lambda: agent(prompt="p", expected_output=""), "expected_output must be"),
        (lambda: include(3), "workflow must be a definition"),  # type: ignore[arg-type]
    ],
)
def test_node_factories_check_their_own_arguments(factory: Any, message: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=message):
        factory()


def test_mounts_are_left_through_declared_exits_only() -> None:
    child = child_with_exit()
    base: dict[str, Any] = {
        "start_at": "child",
        "includes": {"child": include(child)},
        "nodes": {"after": compute(noop)},
    }
    define(**base, edges=[{"from": "child.done", "to": "after"}])
    with pytest.raises(WorkflowDefinitionError, match="leave a mount through one of its exits"):
        define(**base, edges=[{"from": "child", "to": "after"}])
    with pytest.raises(WorkflowDefinitionError, match="has no exit 'gone' \\(exits: done\\)"):
        define(**base, edges=[{"from": "child.gone", "to": "after"}])


def test_exits_must_leave_from_nodes_without_outgoing_edges() -> None:
    with pytest.raises(WorkflowDefinitionError, match="exit 'out' leaves from 'a', which also"):
        define(exits={"out": {"from": "a"}})
    with pytest.raises(WorkflowDefinitionError, match="both leave from 'b'"):
        define(exits={"one": {"from": "b"}, "two": {"from": "b"}})
    with pytest.raises(WorkflowDefinitionError, match="edge from unknown node 'zz'"):
        define(exits={"one": {"from": "zz"}})


def test_mount_and_node_names_share_one_namespace() -> None:
    child = child_with_exit()
    with pytest.raises(WorkflowDefinitionError, match="mount 'a' is declared twice"):
        define(includes={"a": include(child)})


def test_include_in_nodes_is_a_mount() -> None:
    child = child_with_exit()
    workflow = define(
        start_at="child",
        nodes={"child": include(child), "after": compute(noop)},
        edges=[{"from": "child.done", "to": "after"}],
    )
    assert set(workflow.includes) == {"child"}
    assert set(workflow.nodes) == {"after"}


def loop_of(*edges: dict[str, Any], nodes: str = "abc") -> Any:
    return define(nodes={name: compute(noop) for name in nodes}, edges=list(edges))


def test_a_loop_without_a_way_out_is_refused_naming_its_nodes() -> None:
    with pytest.raises(WorkflowDefinitionError) as closed:
        loop_of({"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "b"})
    assert str(closed.value) == (
        "workflow 'sample': node(s) b, c loop with no way out (a only lead(s) into it): no path"
        " from them reaches a node without an outgoing edge, so a run there could only fail at"
        " max_steps; give the loop an exit (a switch case to a node that ends the run)"
    )
    # Every node loops: a self-loop at the start, and a switch whose every case goes round.
    with pytest.raises(WorkflowDefinitionError, match=r"node\(s\) a loop with no way out"):
        loop_of({"from": "a", "to": "a"}, nodes="a")
    round_only = {"on": "$output.route", "cases": {"again": "b", "back": "a"}}
    with pytest.raises(WorkflowDefinitionError, match=r"node\(s\) a, b loop with no way out"):
        loop_of({"from": "a", "to": "b"}, {"from": "b", "switch": round_only}, nodes="ab")


def test_a_loop_with_any_way_out_or_through_a_mount_is_accepted() -> None:
    way_out = {"on": "$output.route", "cases": {"again": "a", "done": "c"}}
    assert loop_of({"from": "a", "to": "b"}, {"from": "b", "switch": way_out}).name == "sample"
    # A mount may end the run through an exit with no edge here: it counts as a way out.
    through_mount = define(
        nodes={"a": compute(noop)},
        includes={"inner": include(child_with_exit())},
        edges=[{"from": "a", "to": "inner"}, {"from": "inner.done", "to": "a"}],
    )
    assert set(through_mount.includes) == {"inner"}
