"""The built-in workflows on the in-memory port: discovery by a hyphenated name, refused inputs,
the agent steps' validation, and the paths the end-to-end tests (tests/cli/test_builtins_e2e.py)
do not take: plan-approval out of rounds or rejected, a sanity check that cannot start or
passes its deadline, and a summary agent step that fails.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from piwf.workflow.agent_driver import AgentFailed, AgentTurn
from piwf.workflow.commands import ContinueCommand
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.engine import ExecutionResult, execute
from piwf.workflow.memory import MemoryPort, run_in_memory
from piwf.workflow.nodes import HumanDecisionNode
from piwf.workflow.port import RunStatus
from piwf.workflow.sources import (
    BUILTIN_DIR,
    WorkflowOrigin,
    discover_workflows,
    find_workflow,
    load_workflow,
)
from piwf.workflow.validation import Accepted, Rejected

BUILTINS = ("plain-summary", "plan-approval", "sanity-check")


def builtin(name: str) -> CompiledWorkflow:
    return load_workflow(BUILTIN_DIR / f"{name}.py").compiled


def content(port: MemoryPort, result: ExecutionResult) -> dict[str, Any]:
    assert result.status is RunStatus.WAITING, result
    assert result.request_id is not None
    found = port.requests[result.request_id].content
    assert isinstance(found, dict)
    return found


def submitted(
    workflow: CompiledWorkflow, port: MemoryPort, result: ExecutionResult, output: Any
) -> ExecutionResult:
    """Submit ``output`` to the agent request the run waits on (it must be accepted), go on."""
    assert result.request_id is not None
    assert isinstance(port.submit(workflow, result.request_id, output), Accepted)
    return execute(ContinueCommand("dry-run", result.request_id), workflow, port)


def answered(
    workflow: CompiledWorkflow, port: MemoryPort, result: ExecutionResult, answer: Any
) -> ExecutionResult:
    """A person answers the decision the run waits on; the run goes on."""
    assert result.request_id is not None
    port.answer(result.request_id, answer)
    return execute(ContinueCommand("dry-run", result.request_id), workflow, port)


@pytest.mark.parametrize("name", BUILTINS)
def test_a_builtin_is_found_by_its_hyphenated_name_and_recorded_as_builtin(name: str) -> None:
    found = find_workflow(name)
    assert (found.origin, found.path) == (WorkflowOrigin.BUILTIN, BUILTIN_DIR / f"{name}.py")
    assert name in {item.name for item in discover_workflows()}
    loaded = load_workflow(found.path)
    assert (loaded.definition.name, loaded.sources.root.location) == (name, f"builtin:{name}")


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("plain-summary", None, "Input should be a valid dictionary"),
        ("plain-summary", {}, "text\n  Field required"),
        ("plain-summary", {"text": "  \n"}, "text\n  Value error, must not be empty"),
        ("plain-summary", {"text": "a", "style": "short"}, "style\n  Extra inputs"),
        ("plain-summary", {"text": "a", "instructions": 3}, "instructions\n  Input should be"),
        ("plan-approval", {"goal": ""}, "goal\n  Value error, must not be empty"),
        ("plan-approval", {"goal": "g", "max_rounds": 0}, "greater than or equal to 1"),
        ("plan-approval", {"goal": "g", "max_rounds": 11}, "less than or equal to 10"),
        ("plan-approval", {"goal": "g", "max_rounds": "3"}, "max_rounds\n  Input should be"),
        ("sanity-check", {"checks": []}, "checks\n  List should have at least 1 item"),
        ("sanity-check", {"checks": [{"name": "t", "argv": "make test"}]}, "checks.0.argv"),
        ("sanity-check", {"checks": [{"name": "t", "argv": []}]}, "at least 1 item"),
        ("sanity-check", {"checks": [{"name": "t", "argv": [""]}]}, "name the program"),
        ("sanity-check", {"checks": [{"name": "t", "argv": ["a\x00b"]}]}, "NUL"),
        ("sanity-check", {"checks": [{"name": " ", "argv": ["true"]}]}, "only whitespace"),
        ("sanity-check", {"checks": [{"argv": ["true"]}]}, "checks.0.name\n  Field required"),
        ("sanity-check", {"checks": [{"name": "t", "argv": ["x"], "timeout_ms": 0}]}, "timeout"),
        (
            "sanity-check",
            {"checks": [{"name": "t", "argv": ["x"]}, {"name": "t", "argv": ["y"]}]},
            "checks 1 and 2 have the same name",
        ),
        (
            "sanity-check",
            {"checks": [{"name": f"c{n}", "argv": ["true"]} for n in range(101)]},
            "at most 100 items",
        ),
    ],
)
def test_a_bad_input_fails_the_run_before_any_step_and_names_the_rule(
    name: str, value: Any, expected: str
) -> None:
    result, port = run_in_memory(builtin(name), value)
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error.startswith(f"input rejected by workflow {name!r}: ValidationError: ")
    assert expected in result.error
    assert "input_value" not in result.error  # the value sent is never echoed
    assert "errors.pydantic.dev" not in result.error  # nor pydantic's own links
    saved = port.read_run("dry-run")
    assert saved is not None and saved.steps == ()
    assert port.requests == {} and port.effects == {}


def test_plain_summary_refuses_a_submission_that_is_not_a_summary() -> None:
    workflow = builtin("plain-summary")
    result, port = run_in_memory(workflow, {"text": "The sea rises twice a day."})
    assert "Instructions:" not in content(port, result)["prompt"]
    assert result.request_id is not None
    for output, error in (
        ({"summary": "  "}, '"summary" must be a non-empty string'),
        ({"text": "x"}, 'submit exactly {"summary"'),
        ({"summary": "x", "more": 1}, 'submit exactly {"summary"'),
        ({"summary": "x" * 20_001}, "at most 20000 characters"),
        ("just text", 'submit exactly {"summary"'),
    ):
        verdict = port.submit(workflow, result.request_id, output)
        assert isinstance(verdict, Rejected) and error in verdict.error, (output, verdict)
    done = submitted(workflow, port, result, {"summary": " Tides. "})
    assert (done.status, done.output) == (RunStatus.COMPLETED, {"summary": "Tides."})


def test_plan_approval_rejected_after_a_replan_completes_not_approved() -> None:
    workflow = builtin("plan-approval")
    result, port = run_in_memory(workflow, {"goal": "Move the office"})
    result = submitted(workflow, port, result, {"plan": "pack, move"})
    assert content(port, result)["request"]["summary"] == "Approve the plan (round 1 of 3)?"
    result = answered(workflow, port, result, {"choice": "replan", "instructions": "label boxes"})
    assert "label boxes" in content(port, result)["prompt"]
    result = submitted(workflow, port, result, {"plan": "label, pack, move"})
    result = answered(workflow, port, result, {"choice": "reject"})
    assert (result.status, result.output) == (
        RunStatus.COMPLETED,
        {"approved": False, "plan": "label, pack, move", "rounds": 2},
    )


def test_plan_approval_offers_no_replan_in_its_last_round() -> None:
    workflow = builtin("plan-approval")
    result, port = run_in_memory(workflow, {"goal": "Move the office", "max_rounds": 2})
    result = submitted(workflow, port, result, {"plan": "pack, move"})
    assert set(content(port, result)["choices"]) == {"approve", "replan", "reject"}
    result = answered(workflow, port, result, {"choice": "replan", "instructions": "cheaper"})
    result = submitted(workflow, port, result, {"plan": "pack, move by bike"})
    last = content(port, result)
    assert last["choices"] == {
        "approve": "Approve the plan",
        "reject": "Reject the plan (no rounds left)",
    }
    assert last["request"]["round"] == 2
    final_review = workflow.definition.nodes["final_review"]
    assert isinstance(final_review, HumanDecisionNode)
    replan = {"choice": "replan", "instructions": "even cheaper"}
    assert final_review.check_answer(replan) is not None  # the server refuses such an answer
    result = answered(workflow, port, result, {"choice": "approve"})
    assert result.output == {"approved": True, "plan": "pack, move by bike", "rounds": 2}


def test_plan_approval_with_one_round_goes_straight_to_the_last_review() -> None:
    workflow = builtin("plan-approval")
    result, port = run_in_memory(workflow, {"goal": "Move the office", "max_rounds": 1})
    assert "(round 1 of 1;" in content(port, result)["prompt"]
    assert result.request_id is not None
    rejected = port.submit(workflow, result.request_id, {"plan": " "})
    assert isinstance(rejected, Rejected) and '"plan" must be a non-empty string' in rejected.error
    result = submitted(workflow, port, result, {"plan": "pack, move"})
    assert set(content(port, result)["choices"]) == {"approve", "reject"}
    result = answered(workflow, port, result, {"choice": "reject"})
    assert result.output == {"approved": False, "plan": "pack, move", "rounds": 1}


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_sanity_check_records_checks_that_cannot_start_or_pass_their_deadline() -> None:
    workflow = builtin("sanity-check")
    checks = [
        {"name": "fine", "argv": python("pass")},
        {"name": "missing", "argv": ["piwf-test-no-such-program"]},
        {"name": "slow", "argv": python("import time; time.sleep(30)"), "timeout_ms": 100},
        {
            "name": "loud",
            "argv": python("print('early' + 'x' * 5000 + 'late'); raise SystemExit(2)"),
        },
    ]
    result, port = run_in_memory(workflow, {"checks": checks})
    prompt = content(port, result)["prompt"]
    assert prompt.startswith("3 of 4 sanity checks failed.")
    assert "== check 'missing': cannot start 'piwf-test-no-such-program'" in prompt
    assert "== check 'slow': timed out after 100 ms" in prompt
    assert result.request_id is not None
    unknown = port.submit(workflow, result.request_id, {"summary": "s", "checks": {"fine": "?"}})
    assert isinstance(unknown, Rejected)
    assert "names no failed check ['fine']" in unknown.error
    done = submitted(
        workflow, port, result, {"summary": "Three fail.", "checks": {"slow": "hangs"}}
    )
    assert done.status is RunStatus.COMPLETED
    output: Any = done.output
    assert output["passed"] == ["fine"]
    by_name = {failure["name"]: failure for failure in output["failed"]}
    assert list(by_name) == ["missing", "slow", "loud"]
    assert by_name["slow"]["summary"] == "hangs"
    assert by_name["missing"]["summary"] is None
    assert by_name["loud"]["exit_code"] == 2
    assert by_name["loud"]["stdout_tail"] == "x" * 2995 + "late\n"  # the stream's end only
    assert output["summary"] == "Three fail."
    # Each check ran as one managed effect of its own visit.
    assert [effect.effect_type for effect in port.effects_of("dry-run")] == [
        "sanity-check.check"
    ] * 4


class FailingAgents:
    """An agent driver whose every turn ends without a submission."""

    def drive(self, turn: AgentTurn) -> AgentFailed:
        return AgentFailed(f"missingSubmission: nothing was submitted for {turn.request_id}")


def test_sanity_check_keeps_its_results_when_the_summary_step_fails() -> None:
    checks = [{"name": "broken", "argv": python("raise SystemExit(1)")}]
    result, _ = run_in_memory(builtin("sanity-check"), {"checks": checks}, agents=FailingAgents())
    assert result.status is RunStatus.COMPLETED
    output: Any = result.output
    assert [failure["name"] for failure in output["failed"]] == ["broken"]
    assert output["summary"] is None
    assert output["summary_error"].startswith("missingSubmission: ")
