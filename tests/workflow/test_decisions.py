"""Authoring sugar for choices: ``decision`` (an agent step) and choices that carry an input.

``decision``: the prompt lists the choices, ``validate`` accepts only one of them (with an
optional reason), and a switch leaving it must name every choice when the workflow is defined.
``human_decision`` choices with ``text_input``: the definition checks, the request content the
engine commits, and the engine's own check of a consumed answer (the memory port stores any
answer, so only that check can meet a bad one here; the server refuses it earlier, see
tests/server/test_decision_inputs.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from piwf.errors import RunCommandError, WorkflowDefinitionError
from piwf.workflow import (
    DecisionNode,
    NodeKind,
    choice,
    compute,
    decision,
    decision_edge,
    define_workflow,
    human_decision,
    text_input,
)
from piwf.workflow.commands import ContinueCommand, StartCommand
from piwf.workflow.engine import execute
from piwf.workflow.memory import MemoryPort
from piwf.workflow.nodes import AgentNode
from piwf.workflow.port import RunStatus

from .conftest import compiled

CHOICES = {
    "continue": "it improved; try the next idea",
    "plateau": "no real change for a while",
    "dead_end": "this direction cannot work",
}


def noop(ctx: Any) -> None:
    return None


def assess() -> DecisionNode:
    return decision(question="Did the last experiment improve the metric?", choices=CHOICES)


def loop(cases: dict[str, str], *, on: str = "$output.route") -> Any:
    return define_workflow(
        name="research",
        start_at="assess",
        nodes={"assess": assess(), "experiment": compute(noop), "conclude": compute(noop)},
        edges=[
            {"from": "assess", "switch": {"on": on, "cases": cases}},
            {"from": "experiment", "to": "conclude"},
        ],
    )


# -- decision ------------------------------------------------------------------------------


def test_a_decision_is_an_agent_step_whose_prompt_asks_the_question_and_lists_the_choices() -> None:
    node = assess()
    assert isinstance(node, AgentNode) and node.kind is NodeKind.AGENT
    assert isinstance(node.prompt, str)
    assert node.prompt.startswith("Did the last experiment improve the metric?")
    for name, description in CHOICES.items():
        assert f"- {name}: {description}" in node.prompt
    assert '{"route": "<choice>"}' in node.prompt
    assert '"continue", "plateau", "dead_end"' in node.expected_output
    structure = node.structure()
    assert structure["kind"] == "agent" and structure["validates"] is True
    assert structure["decision"] == {"field": "route", "choices": CHOICES}


def test_a_computed_question_gets_the_same_choice_list() -> None:
    node = decision(question=lambda ctx: f"Is {ctx} done?", choices=["yes", "no"], field="done")
    assert callable(node.prompt)
    text = node.prompt("step 3")  # type: ignore[arg-type]
    assert text.startswith("Is step 3 done?")
    assert "- yes\n- no" in text and '{"done": "<choice>"}' in text


@pytest.mark.parametrize(
    ("output", "accepted"),
    [
        ({"route": "plateau"}, {"route": "plateau"}),
        (
            {"route": "dead_end", "reason": "three flat runs"},
            {"route": "dead_end", "reason": "three flat runs"},
        ),
    ],
)
def test_validate_accepts_exactly_one_choice_with_an_optional_reason(
    output: Any, accepted: Any
) -> None:
    node = assess()
    assert node.validate is not None
    assert node.validate(output, None) == accepted  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("plateau", "submit a JSON object"),
        ({}, "has no 'route'"),
        ({"route": "sideways"}, "must be exactly one of"),
        ({"route": ["plateau"]}, "must be exactly one of"),
        ({"route": "plateau", "score": 3}, "unexpected key(s) score"),
        ({"route": "plateau", "reason": 3}, "'reason' must be a string"),
        ({"route": "plateau", "reason": "x" * 2_001}, "at most 2000"),
    ],
)
def test_validate_refuses_anything_else_saying_what_to_send(output: Any, message: str) -> None:
    node = assess()
    assert node.validate is not None
    with pytest.raises(ValueError) as info:
        node.validate(output, None)  # type: ignore[arg-type]
    assert message in str(info.value)
    assert "sideways" not in str(info.value), "a rejection never echoes the submitted value"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"choices": []}, "at least one choice"),
        ({"choices": ["a", "a"]}, "declared twice"),
        ({"choices": ["a", ""]}, "non-empty string"),
        ({"choices": ["a", " b"]}, "without surrounding spaces"),
        ({"choices": [1, 2]}, "non-empty string"),
        ({"choices": {"a": 1}}, "description of choice 'a'"),
        ({"choices": "ab"}, "list of strings or a mapping"),
        ({"choices": ["a"], "field": "reason"}, "field must match"),
        ({"choices": ["a"], "field": "a.b"}, "field must match"),
        ({"choices": ["a"], "question": "  "}, "question must not be empty"),
        ({"choices": ["a"], "timeout_ms": 0}, "timeout_ms"),
    ],
)
def test_decision_definition_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        decision(**{"question": "Which?", **kwargs})
    assert message in str(info.value)


def test_a_switch_on_the_decision_field_must_name_every_choice() -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        loop({"continue": "experiment", "plateau": "conclude"})
    assert "no case for declared choice(s) dead_end" in str(info.value)
    assert "'assess'" in str(info.value)
    with pytest.raises(WorkflowDefinitionError, match="case\\(s\\) maybe that are not declared"):
        loop(
            {
                "continue": "experiment",
                "plateau": "conclude",
                "dead_end": "conclude",
                "maybe": "conclude",
            }
        )


def test_a_complete_switch_compiles_and_other_routes_are_not_checked() -> None:
    complete = {"continue": "experiment", "plateau": "conclude", "dead_end": "conclude"}
    workflow = compiled(loop(complete))
    snapshot = workflow.snapshot["workflow"]["nodes"]["assess"]  # type: ignore[index]
    assert snapshot["decision"]["field"] == "route"
    # A failure route on the outcome is not a choice switch.
    compiled(loop({"ok": "experiment", "timed_out": "conclude"}, on="$result.outcome"))


def test_decision_edge_builds_the_switch_and_checks_it_when_written() -> None:
    node = assess()
    cases = {"continue": "experiment", "plateau": "conclude", "dead_end": "conclude"}
    edge = decision_edge(from_="assess", choices=node, cases=cases)
    assert edge == {"from": "assess", "switch": {"on": "$output.route", "cases": cases}}
    by_choices = decision_edge(from_="pick", choices=["a", "b"], cases={"a": "x", "b": "y"})
    assert by_choices["switch"]["on"] == "$output.route"
    named = decision(question="?", choices=["a"], field="verdict")
    assert decision_edge(from_="v", choices=named, cases={"a": "x"})["switch"]["on"] == (
        "$output.verdict"
    )
    with pytest.raises(
        WorkflowDefinitionError, match="no case for declared choice\\(s\\) dead_end"
    ):
        decision_edge(from_="assess", choices=node, cases={"continue": "a", "plateau": "b"})
    with pytest.raises(WorkflowDefinitionError, match="field is 'route'"):
        decision_edge(from_="assess", choices=node, cases=cases, field="other")


def test_a_decision_routes_on_its_answer_through_the_engine() -> None:
    cases = {"continue": "experiment", "plateau": "conclude", "dead_end": "conclude"}
    workflow = compiled(loop(cases))
    port = MemoryPort()
    port.create_run("run-1", {}, definition_digest=workflow.digest)
    waiting = execute(StartCommand("run-1"), workflow, port)
    assert waiting.status is RunStatus.WAITING and waiting.request_id is not None
    content = port.requests[waiting.request_id].content
    assert isinstance(content, dict) and "- plateau: no real change" in content["prompt"]
    port.answer(waiting.request_id, {"route": "continue"})
    done = execute(ContinueCommand("run-1", waiting.request_id), workflow, port)
    assert done.status is RunStatus.COMPLETED
    saved = port.read_run("run-1")
    assert saved is not None
    assert [step.path for step in saved.steps] == ["assess", "experiment", "conclude"]


# -- choices that carry an input -----------------------------------------------------------


def replan_decision(**extra: Any) -> Any:
    return human_decision(
        choices={
            "continue": "Continue",
            "replan": choice(
                "Replan",
                input=text_input("instructions", prompt="What should change?", max_chars=20),
            ),
        },
        **extra,
    )


def test_a_choice_input_is_part_of_the_definition() -> None:
    node = replan_decision()
    assert node.choices == (("continue", "Continue"), ("replan", "Replan"))
    assert node.structure()["inputs"] == {
        "replan": {
            "kind": "text",
            "name": "instructions",
            "prompt": "What should change?",
            "maxChars": 20,
        }
    }
    # Decisions without inputs keep their snapshot (and digest) exactly as before.
    assert "inputs" not in human_decision(choices=["a", "b"]).structure()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: text_input("choice", prompt="?"), "taken by the chosen choice"),
        (lambda: text_input("two words", prompt="?"), "must match"),
        (lambda: text_input("notes", prompt=" "), "non-empty prompt"),
        (lambda: text_input("notes", prompt="?", max_chars=0), "max_chars must be in 1..64000"),
        (lambda: text_input("notes", prompt="?", max_chars=64_001), "max_chars must be in"),
        (lambda: text_input("notes", prompt="?", max_chars=True), "max_chars must be an integer"),
        (lambda: choice("", input=None), "label must be a non-empty string"),
        (lambda: choice("Go", input="notes"), "input must come from text_input"),
        (
            lambda: replan_decision(
                on_timeout={"after_ms": 1000, "response": {"choice": "replan"}}
            ),
            "on_timeout response: choice 'replan' needs its input 'instructions'",
        ),
    ],
)
def test_choice_input_definition_errors(make: Any, message: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        make()
    assert message in str(info.value)


def many(count: int, label: str = "Pick me") -> dict[str, str]:
    return {f"c{number:03d}": label for number in range(count)}


def test_a_decision_may_declare_up_to_the_limits() -> None:
    """100 choices of 500-character labels are the most one decision declares; both kinds
    accept them."""
    assert len(human_decision(choices=many(100, "x" * 500)).choices) == 100
    assert len(decision(question="Which?", choices=many(100, "x" * 500)).choices) == 100
    assert choice("x" * 500).label == "x" * 500


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: human_decision(choices=many(101)),
            "human_decision(): 101 choices declared; at most 100 are allowed",
        ),
        (
            lambda: human_decision(choices=list(many(300))),
            "human_decision(): 300 choices declared; at most 100 are allowed",
        ),
        (
            lambda: human_decision(choices={"ship": "x" * 501}),
            "human_decision(): the label of choice 'ship' has 501 characters; at most 500",
        ),
        (lambda: choice("x" * 501), "choice(): label has 501 characters; at most 500"),
        (
            # Each label within bounds, but escaped on the wire they pass the total.
            lambda: human_decision(choices=many(100, "\x01" * 300)),
            "human_decision(): the choices and their inputs take 181,025 bytes as a request "
            "carries them; at most 131,072 are allowed",
        ),
        (
            lambda: human_decision(
                choices={
                    f"c{number:03d}": choice("x" * 500, input=text_input("why", prompt="?" * 1000))
                    for number in range(100)
                }
            ),
            "at most 131,072 are allowed (shorten labels and input prompts)",
        ),
        (
            lambda: decision(question="Which?", choices=list(many(101))),
            "decision(): 101 choices declared; at most 100 are allowed",
        ),
        (
            lambda: decision(question="Which?", choices={"go": "x" * 501}),
            "decision(): the description of choice 'go' has 501 characters; at most 500",
        ),
        (
            lambda: decision_edge(from_="a", choices=many(101), cases={}),
            "decision_edge(): 101 choices declared; at most 100 are allowed",
        ),
    ],
)
def test_a_decision_is_bounded_when_it_is_defined(make: Any, message: str) -> None:
    """Every pending request and every shown decision carries all of a decision's choices, so
    a definition declaring more (or longer) than a request can carry is refused."""
    with pytest.raises(WorkflowDefinitionError) as info:
        make()
    assert message in str(info.value)


def test_a_default_response_may_fill_the_input() -> None:
    response = {"choice": "replan", "instructions": "ask again"}
    node = replan_decision(on_timeout={"after_ms": 1000, "response": response})
    assert node.on_timeout is not None and node.on_timeout.response == response


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"choice": "continue"}, None),
        ({"choice": "replan", "instructions": "split step 2"}, None),
        (
            {"choice": "replan"},
            "choice 'replan' needs its input 'instructions' (What should change?)",
        ),
        ({"choice": "replan", "instructions": "   "}, "must not be empty"),
        ({"choice": "replan", "instructions": 7}, "must be a string"),
        ({"choice": "replan", "instructions": "x" * 21}, "is 21 characters; at most 20"),
        ({"choice": "replan", "instructions": "ok", "extra": 1}, "unknown input(s) 'extra'"),
        ({"choice": "continue", "instructions": "hm"}, "which takes no input"),
        ({"choice": "later"}, "choice 'later' is not one of continue, replan"),
        ({"choice": None}, "choice null is not one of continue, replan"),
        ({"choice": True}, "choice true is not one of continue, replan"),
        ({"choice": {"plan": "split"}}, "choice (an object) is not one of continue, replan"),
        ({"choice": "x" * 500_000}, "choice (a string of 500,000 characters) is not one of"),
        ({"choice": "later\x1b[2J"}, "choice (a string of 9 characters) is not one of"),
        ({"choice": "continue", "x" * 100: 1}, "unknown input(s) (a string of 100 characters)"),
        (
            {"choice": "continue", **{f"k{n}": n for n in range(9)}},
            "unknown input(s) 'k0', 'k1', 'k2', 'k3', 'k4' and 4 more for choice 'continue'",
        ),
        (
            {},
            "the answer has no 'choice': send one of continue, replan, "
            'such as {"choice": "continue"}',
        ),
        (
            "continue",
            'a decision answer must be an object with a \'choice\', such as {"choice": "continue"}',
        ),
    ],
)
def test_the_answer_rule_of_a_choice_input(answer: Any, problem: str | None) -> None:
    found = replan_decision().check_answer(answer)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "split" not in found and "xxxx" not in found, "the sent text is never echoed"
        assert len(found) < 300 and found.isprintable(), "a refusal is short and plain"


def test_a_decision_without_inputs_still_accepts_extra_keys() -> None:
    assert (
        human_decision(choices=["ship", "hold"]).check_answer({"choice": "ship", "note": "x"})
        is None
    )


def workflow_with_inputs() -> Any:
    return compiled(
        define_workflow(
            name="replanning",
            start_at="approve",
            nodes={"approve": replan_decision(), "go": compute(noop), "plan": compute(noop)},
            edges=[
                {
                    "from": "approve",
                    "switch": {
                        "on": "$output.choice",
                        "cases": {"continue": "go", "replan": "plan"},
                    },
                }
            ],
        )
    )


def test_the_request_carries_the_inputs_and_the_engine_refuses_an_answer_without_one() -> None:
    workflow = workflow_with_inputs()
    port = MemoryPort()
    port.create_run("run-1", {}, definition_digest=workflow.digest)
    waiting = execute(StartCommand("run-1"), workflow, port)
    assert waiting.request_id is not None
    content = port.requests[waiting.request_id].content
    assert isinstance(content, dict)
    assert content["choices"] == {"continue": "Continue", "replan": "Replan"}
    assert content["inputs"]["replan"]["name"] == "instructions"
    port.answer(waiting.request_id, {"choice": "replan"})
    with pytest.raises(RunCommandError, match="needs its input 'instructions'"):
        execute(ContinueCommand("run-1", waiting.request_id), workflow, port)


def test_an_answer_with_its_input_becomes_the_node_output() -> None:
    workflow = workflow_with_inputs()
    port = MemoryPort()
    port.create_run("run-1", {}, definition_digest=workflow.digest)
    waiting = execute(StartCommand("run-1"), workflow, port)
    assert waiting.request_id is not None
    answer = {"choice": "replan", "instructions": "split step 2"}
    port.answer(waiting.request_id, answer)
    done = execute(ContinueCommand("run-1", waiting.request_id), workflow, port)
    assert done.status is RunStatus.COMPLETED
    saved = port.read_run("run-1")
    assert saved is not None
    outputs = {step.path: step.output for step in saved.steps}
    assert outputs["approve"] == answer
    assert "go" not in outputs and "plan" in outputs
