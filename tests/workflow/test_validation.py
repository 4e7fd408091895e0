"""The one function that runs an agent's ``validate`` (in the validation child, and in-process
for the memory port), and the step contract every agent prompt ends with."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from piwf.workflow import agent, compute, define_workflow
from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.memory import run_in_memory
from piwf.workflow.port import SavedRun
from piwf.workflow.validation import (
    MAX_REJECTION_CHARS,
    Accepted,
    Rejected,
    validate_candidate,
)


def waiting(validate: Any = None) -> tuple[CompiledWorkflow, SavedRun, str]:
    """A run parked on its agent step (after one compute node), as the saved run shows it."""
    workflow = compile_workflow(
        define_workflow(
            name="ask",
            start_at="first",
            nodes={
                "first": compute(lambda ctx: {"seen": ctx.input["x"]}),
                "ask": agent(prompt="Go.", expected_output="anything", validate=validate),
            },
            edges=[{"from": "first", "to": "ask"}],
        )
    )
    result, port = run_in_memory(workflow, {"x": 7})
    assert result.request_id is not None
    saved = port.read_run("dry-run")
    assert saved is not None
    return workflow, saved, result.request_id


def test_validate_sees_the_visits_context_and_may_normalise() -> None:
    seen: list[Any] = []

    def check(output: Any, ctx: Any) -> Any:
        seen.append((ctx.path, ctx.visit, ctx.attempt, dict(ctx.outputs), ctx.input))
        return {"wrapped": output}

    workflow, saved, request_id = waiting(check)
    assert validate_candidate(workflow, saved, request_id, 1) == Accepted({"wrapped": 1})
    assert seen == [("ask", 1, 1, {"first": {"seen": 7}}, {"x": 7})]


def test_no_validate_accepts_the_output_and_none_keeps_it() -> None:
    workflow, saved, request_id = waiting()
    assert validate_candidate(workflow, saved, request_id, [1, 2]) == Accepted([1, 2])
    workflow, saved, request_id = waiting(lambda output, ctx: None)
    assert validate_candidate(workflow, saved, request_id, "as is") == Accepted("as is")


@pytest.mark.parametrize(
    ("validate", "expected"),
    [
        (lambda output, ctx: (_ for _ in ()).throw(ValueError("bad n")), "ValueError: bad n"),
        (lambda output, ctx: {1, 2}, "validate returned a value that is not JSON"),
        (lambda output, ctx: ctx.publish_update("t", "k", 1), "publish_update is not available"),
    ],
)
def test_a_refusal_says_why(validate: Any, expected: str) -> None:
    workflow, saved, request_id = waiting(validate)
    verdict = validate_candidate(workflow, saved, request_id, 1)
    assert isinstance(verdict, Rejected) and expected in verdict.error


def test_a_validate_that_overruns_is_rejected_and_a_long_error_is_cut() -> None:
    release = threading.Event()
    workflow, saved, request_id = waiting(lambda output, ctx: release.wait(10))
    try:
        verdict = validate_candidate(workflow, saved, request_id, 1, timeout_ms=50)
    finally:
        release.set()
    assert verdict == Rejected("validate did not finish within 50 ms; the output was not accepted")

    def long_error(output: Any, ctx: Any) -> None:
        raise ValueError("x" * 10_000)

    workflow, saved, request_id = waiting(long_error)
    verdict = validate_candidate(workflow, saved, request_id, 1)
    assert isinstance(verdict, Rejected)
    assert len(verdict.error) == MAX_REJECTION_CHARS and verdict.error.endswith("…")


def test_another_request_id_or_a_run_that_does_not_wait_is_rejected() -> None:
    workflow, saved, _ = waiting()
    verdict = validate_candidate(workflow, saved, "request-other", 1)
    assert isinstance(verdict, Rejected) and "not on agent request request-other" in verdict.error
    no_wait = SavedRun(run_id="dry-run", status=saved.status, input={"x": 7})
    verdict = validate_candidate(workflow, no_wait, "request-x", 1)
    assert isinstance(verdict, Rejected) and "waits on no request" in verdict.error


def test_the_prompt_ends_with_the_step_contract() -> None:
    _, saved, request_id = waiting()
    assert saved.pending is not None
    content = saved.pending.content
    assert isinstance(content, dict)
    prompt = str(content["prompt"])
    lines = prompt.splitlines()
    assert lines[0] == "Go."
    assert lines[2].startswith(
        "Workflow step contract (workflow: ask, step: ask, attempt: attempt-"
    )
    assert f"  piwf submit {request_id} '<your output as JSON>'" in lines
    assert f'{{"request_id": "{request_id}", "output": <your output>}}' in prompt
    assert lines[-1] == "Expected output: anything"
    assert content["expectedOutput"] == "anything"
