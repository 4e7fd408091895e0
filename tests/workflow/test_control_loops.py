"""``control_loop``: the choices and plain edges of a decision that loops or leaves.

Shapes the loop can judge alone are refused when it is written; graph faults are refused by
``define_workflow``; a loop runs on the real engine and adds nothing to the definition digest.
"""

from __future__ import annotations

from typing import Any

import pytest

from piwf.errors import WorkflowDefinitionError
from piwf.lifecycle import RunStatus
from piwf.workflow import (
    ControlLoop,
    compute,
    control_loop,
    decision,
    decision_edge,
    define_workflow,
    human_decision,
)
from piwf.workflow.commands import ContinueCommand
from piwf.workflow.engine import execute
from piwf.workflow.memory import run_in_memory
from piwf.workflow.validation import Accepted

from .conftest import compiled

ROUTES: dict[str, Any] = {
    "continue": {"to": "experiment", "returns": ["experiment"]},
    "plateau": {"to": "conclude", "terminal": True},
    "dead_end": {"to": "conclude", "terminal": True},
}
SHAPE = "{'to': node, 'returns': [node, ...]} or {'to': node, 'terminal': True}"


def research_loop() -> ControlLoop:
    return control_loop(decide="assess", return_to="assess", routes=ROUTES)


def research_nodes(choices: Any) -> dict[str, Any]:
    return {
        "setup": compute(lambda ctx: {"metric": 0}),
        "experiment": compute(lambda ctx: {"tried": ctx.visit}),
        "assess": decision(question="Did the experiment improve the metric?", choices=choices),
        "conclude": compute(
            lambda ctx: {
                "tried": ctx.outputs["experiment"]["tried"],
                "why": ctx.outputs["assess"]["route"],
            }
        ),
        "finalize": compute(lambda ctx: {"final": ctx.outputs["conclude"]}),
    }


def research(edges: list[dict[str, Any]], *, name: str = "research") -> Any:
    return define_workflow(
        name=name,
        start_at="setup",
        max_steps=40,
        nodes=research_nodes(("continue", "plateau", "dead_end")),
        edges=[
            {"from": "setup", "to": "experiment"},
            *edges,
            {"from": "conclude", "to": "finalize"},
        ],
    )


# -- what a loop is made of -----------------------------------------------------------------


def test_a_loop_is_the_decision_choices_plus_one_switch_and_one_edge_per_return_source() -> None:
    loop = control_loop(
        decide="assess",
        return_to="measure",
        routes={
            "continue": {"to": "experiment", "returns": ["experiment", "notes"]},
            "retry": {"to": "setup", "returns": ("setup",)},
            "stop": {"to": "conclude", "terminal": True},
        },
    )
    assert loop.choices == ("continue", "retry", "stop")
    assert loop.edges == [
        {
            "from": "assess",
            "switch": {
                "on": "$output.route",
                "cases": {"continue": "experiment", "retry": "setup", "stop": "conclude"},
            },
        },
        {"from": "experiment", "to": "measure"},
        {"from": "notes", "to": "measure"},
        {"from": "setup", "to": "measure"},
    ]


def test_the_edges_are_fresh_each_time_so_the_loop_stays_unchanged() -> None:
    loop = research_loop()
    loop.edges[0]["switch"]["cases"]["continue"] = "elsewhere"
    loop.edges.clear()
    assert loop.edges[0]["switch"]["cases"]["continue"] == "experiment"
    assert len(loop.edges) == 2


def test_the_switch_is_the_one_decision_edge_writes() -> None:
    loop = research_loop()
    cases = {"continue": "experiment", "plateau": "conclude", "dead_end": "conclude"}
    node = decision(question="?", choices=loop.choices)
    assert loop.edges[0] == decision_edge(from_="assess", choices=node, cases=cases)


# -- shapes refused when the loop is written ------------------------------------------------

REFUSED = [
    pytest.param({"routes": {}}, "control_loop('assess'): declare at least one route", id="empty"),
    pytest.param(
        {"routes": [("continue", {"to": "x", "returns": ["x"]})]},
        f"control_loop('assess'): routes must map route names to {SHAPE}",
        id="routes-not-a-mapping",
    ),
    pytest.param(
        {"routes": {"go on": {"to": "x", "returns": ["x"]}}},
        "control_loop('assess'): route name 'go on' must match ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$",
        id="name-not-a-choice",
    ),
    pytest.param(
        {"routes": {7: {"to": "x", "terminal": True}}},
        "control_loop('assess'): route name 7 must match ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$",
        id="name-not-a-string",
    ),
    pytest.param(
        {"routes": {"cancelled": {"to": "x", "returns": ["x"]}}},
        "control_loop('assess'): route 'cancelled' may only leave the loop; mark it "
        "'terminal': True",
        id="cancelled-continues",
    ),
    pytest.param(
        {"routes": {"stop": {"to": "x", "terminal": True, "returns": ["x"]}}},
        "control_loop('assess'): terminal route 'stop' leaves the loop and takes no 'returns'",
        id="terminal-with-returns",
    ),
    pytest.param(
        {"routes": {"stop": {"to": "x", "terminal": True, "returns": []}}},
        "control_loop('assess'): terminal route 'stop' leaves the loop and takes no 'returns'",
        id="terminal-with-empty-returns",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": []}}},
        "control_loop('assess'): route 'go' continues the loop but lists no 'returns'; name the "
        "node(s) that come back to 'assess', or mark it 'terminal': True",
        id="continuation-with-empty-returns",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x"}}},
        "control_loop('assess'): route 'go' continues the loop but lists no 'returns'; name the "
        "node(s) that come back to 'assess', or mark it 'terminal': True",
        id="continuation-without-returns",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": ["x", "y", "x"]}}},
        "control_loop('assess'): return source 'x' is listed twice (route 'go')",
        id="return-source-twice-in-a-route",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": ["x"]}, "again": {"to": "y", "returns": ["x"]}}},
        "control_loop('assess'): return source 'x' is listed twice (routes 'go' and 'again')",
        id="return-source-twice-across-routes",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": ["x", "assess"]}}},
        "control_loop('assess'): route 'go' lists the deciding node 'assess' as a return source",
        id="decide-returns",
    ),
    pytest.param(
        {"return_to": "measure", "routes": {"go": {"to": "x", "returns": ["measure"]}}},
        "control_loop('assess'): route 'go' lists return_to 'measure' as a return source",
        id="return-to-returns",
    ),
    pytest.param(
        {"routes": {"again": {"to": "assess", "returns": ["x"]}}},
        "control_loop('assess'): route 'again' goes straight back to the deciding node "
        "'assess'; route it to the work, which returns",
        id="route-to-decide",
    ),
    pytest.param(
        {"routes": {"stop": {"to": "assess", "terminal": True}}},
        "control_loop('assess'): route 'stop' goes straight back to the deciding node "
        "'assess'; route it to the work, which returns",
        id="terminal-to-decide",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": ["x"]}, "stop": {"to": "x", "terminal": True}}},
        "control_loop('assess'): terminal route 'stop' goes to 'x', which leads back to "
        "'assess'; a terminal route must leave the loop",
        id="terminal-target-returns",
    ),
    pytest.param(
        {
            "return_to": "measure",
            "routes": {
                "go": {"to": "x", "returns": ["x"]},
                "stop": {"to": "measure", "terminal": True},
            },
        },
        "control_loop('assess'): terminal route 'stop' goes to 'measure', which leads back to "
        "'measure'; a terminal route must leave the loop",
        id="terminal-to-return-to",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": ["x"], "label": "Go"}}},
        "control_loop('assess'): route 'go' has unknown key(s) label; a route takes 'to' and "
        "either 'returns' or 'terminal'",
        id="unknown-key",
    ),
    pytest.param(
        {"routes": {"go": ("x", ["x"])}},
        f"control_loop('assess'): route 'go' must be {SHAPE}",
        id="route-not-a-mapping",
    ),
    pytest.param(
        {"routes": {"go": {"to": 3, "returns": ["x"]}}},
        "control_loop('assess'): route 'go' needs a 'to' node id",
        id="to-not-a-string",
    ),
    pytest.param(
        {"routes": {"go": {"returns": ["x"]}}},
        "control_loop('assess'): route 'go' needs a 'to' node id",
        id="to-missing",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": "x"}}},
        "control_loop('assess'): route 'go': 'returns' must be a list of node ids",
        id="returns-a-string",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": ["x", 4]}}},
        "control_loop('assess'): route 'go': 'returns' must be a list of node ids",
        id="returns-not-strings",
    ),
    pytest.param(
        {"routes": {"go": {"to": "x", "returns": ["x", ""]}}},
        "control_loop('assess'): route 'go': 'returns' must be a list of node ids",
        id="returns-an-empty-id",
    ),
    pytest.param(
        {"routes": {"stop": {"to": "x", "terminal": "yes"}}},
        "control_loop('assess'): route 'stop': 'terminal' must be True (leave it out to continue)",
        id="terminal-not-true",
    ),
    pytest.param(
        {"routes": {"stop": {"to": "x", "terminal": False}}},
        "control_loop('assess'): route 'stop': 'terminal' must be True (leave it out to continue)",
        id="terminal-false",
    ),
    pytest.param(
        {"return_to": ""},
        "control_loop('assess'): return_to must be a non-empty node id",
        id="return-to-empty",
    ),
    pytest.param(
        {"return_to": ["assess"]},
        "control_loop('assess'): return_to must be a non-empty node id",
        id="return-to-not-a-string",
    ),
    pytest.param(
        {"field": "reason"},
        "control_loop('assess'): field must match ^[A-Za-z0-9_-]{1,64}$ and not be 'reason'",
        id="field-reason",
    ),
    pytest.param(
        {"decide": 5},
        "control_loop(): decide must be a non-empty node id",
        id="decide-not-a-string",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), REFUSED)
def test_each_invalid_shape_is_refused_naming_the_loop_and_the_rule(
    overrides: dict[str, Any], message: str
) -> None:
    arguments: dict[str, Any] = {"decide": "assess", "return_to": "assess", "routes": ROUTES}
    with pytest.raises(WorkflowDefinitionError) as info:
        control_loop(**{**arguments, **overrides})
    assert str(info.value) == message


def test_cancelled_may_leave_the_loop() -> None:
    loop = control_loop(
        decide="assess",
        return_to="assess",
        routes={
            "continue": {"to": "experiment", "returns": ["experiment"]},
            "cancelled": {"to": "conclude", "terminal": True},
        },
    )
    assert loop.choices == ("continue", "cancelled")


# -- graph faults are define_workflow's -----------------------------------------------------


def test_an_unknown_node_in_a_loop_is_refused_by_define_workflow() -> None:
    loop = control_loop(
        decide="assess",
        return_to="assess",
        routes={**ROUTES, "continue": {"to": "experimnt", "returns": ["experiment"]}},
    )
    with pytest.raises(WorkflowDefinitionError) as info:
        research(loop.edges)
    assert (
        str(info.value)
        == "workflow 'research': edge from 'assess' targets unknown node 'experimnt'"
    )


def test_a_return_source_that_already_has_an_edge_is_refused_by_define_workflow() -> None:
    loop = research_loop()
    with pytest.raises(WorkflowDefinitionError) as info:
        research([{"from": "experiment", "to": "assess"}, *loop.edges])
    assert str(info.value) == (
        "workflow 'research': node 'experiment' has more than one outgoing edge; use one switch "
        "edge to branch"
    )


def test_a_decision_whose_choices_differ_from_the_routes_is_refused_by_define_workflow() -> None:
    loop = research_loop()
    with pytest.raises(WorkflowDefinitionError) as info:
        define_workflow(
            name="research",
            start_at="setup",
            nodes=research_nodes(("continue", "plateau")),
            edges=[{"from": "setup", "to": "experiment"}, *loop.edges],
        )
    assert str(info.value) == (
        "workflow 'research': switch from decision 'assess' has case(s) dead_end that are not "
        "declared choices"
    )


# -- running a loop -------------------------------------------------------------------------


def test_a_loop_goes_round_twice_and_leaves_by_a_terminal_route() -> None:
    workflow = compiled(research(research_loop().edges))
    result, port = run_in_memory(workflow, {})
    for answer in ("continue", "continue", "plateau"):
        assert result.status is RunStatus.WAITING and result.request_id is not None
        verdict = port.submit(workflow, result.request_id, {"route": answer})
        assert isinstance(verdict, Accepted)
        result = execute(ContinueCommand("dry-run", result.request_id), workflow, port)
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"final": {"tried": 3, "why": "plateau"}}
    saved = port.read_run("dry-run")
    assert saved is not None
    assert [(step.path, step.visit) for step in saved.steps] == [
        ("setup", 1),
        ("experiment", 1),
        ("assess", 1),
        ("experiment", 2),
        ("assess", 2),
        ("experiment", 3),
        ("assess", 3),
        ("conclude", 1),
        ("finalize", 1),
    ]
    assert [step.output for step in saved.steps if step.path == "assess"] == [
        {"route": "continue"},
        {"route": "continue"},
        {"route": "plateau"},
    ]


def test_a_human_decision_drives_a_loop_on_its_choice_field() -> None:
    loop = control_loop(
        decide="review",
        return_to="review",
        field="choice",
        routes={
            "revise": {"to": "draft", "returns": ["draft"]},
            "ship": {"to": "publish", "terminal": True},
        },
    )
    workflow = compiled(
        define_workflow(
            name="drafting",
            start_at="draft",
            nodes={
                "draft": compute(lambda ctx: {"version": ctx.visit}),
                "review": human_decision(choices=loop.choices),
                "publish": compute(lambda ctx: ctx.outputs["draft"]),
            },
            edges=loop.edges,
        )
    )
    result, port = run_in_memory(workflow)
    for answer in ("revise", "ship"):
        assert result.status is RunStatus.WAITING and result.request_id is not None
        port.answer(result.request_id, {"choice": answer})
        result = execute(ContinueCommand("dry-run", result.request_id), workflow, port)
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"version": 2}


def test_a_loop_adds_nothing_to_the_definition() -> None:
    by_loop = compiled(research(research_loop().edges))
    by_hand = compiled(
        research(
            [
                decision_edge(
                    from_="assess",
                    choices=("continue", "plateau", "dead_end"),
                    cases={"continue": "experiment", "plateau": "conclude", "dead_end": "conclude"},
                ),
                {"from": "experiment", "to": "assess"},
            ]
        )
    )
    assert by_loop.digest == by_hand.digest
    assert by_loop.snapshot == by_hand.snapshot
    changed = control_loop(
        decide="assess",
        return_to="assess",
        routes={**ROUTES, "dead_end": {"to": "finalize", "terminal": True}},
    )
    assert compiled(research(changed.edges)).digest != by_hand.digest
