"""Run commands on the memory port only: what the server's store cannot be asked.

Commands refused by the saved run, resume from the last boundary and restart are in the contract
suite (``tests/contract/test_commands.py``) on both ports. Here: a restart of a run that is not
terminal (the store refuses to create one), answers the store refuses when they are submitted
(so only the engine's own check can meet them here), ``ContinueCommand`` (the server sends
``resume``) and the commands' wire form.
"""

from __future__ import annotations

from typing import Any

import pytest

from piwf.errors import RunCommandError
from piwf.workflow import (
    action,
    checkpoint,
    compute,
    define_workflow,
    human_decision,
    idempotent_effect,
)
from piwf.workflow.commands import (
    ContinueCommand,
    RestartCommand,
    ResumeCommand,
    RunCommand,
    StartCommand,
    command_from_json,
    command_to_json,
)
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.engine import execute
from piwf.workflow.memory import MemoryPort
from piwf.workflow.port import AnsweredBy, RunStatus

from .conftest import compiled


class Recorder:
    """Records every workflow callable that runs, so a test can prove none did."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def node(self, name: str, value: Any = None) -> Any:
        def run(ctx: Any) -> Any:
            self.calls.append(name)
            return {name: value if value is not None else ctx.visit}

        return run

    def parse(self, raw: Any) -> Any:
        self.calls.append("input")
        return raw

    def title(self, raw: Any) -> str:
        self.calls.append("title")
        return "recorded"


def build(recorder: Recorder) -> CompiledWorkflow:
    return compiled(
        define_workflow(
            name="recorded",
            start_at="first",
            input=recorder.parse,
            title=recorder.title,
            nodes={
                "first": compute(recorder.node("first")),
                "deploy": action(
                    effect=idempotent_effect("svc.deploy"), run=recorder.node("deploy")
                ),
                "review": checkpoint(run=recorder.node("review")),
                "decide": human_decision(choices=["go", "stop"]),
                "last": compute(recorder.node("last")),
            },
            edges=[
                {"from": "first", "to": "deploy"},
                {"from": "deploy", "to": "review"},
                {"from": "review", "to": "decide"},
                {
                    "from": "decide",
                    "switch": {"on": "$output.choice", "cases": {"go": "last", "stop": "last"}},
                },
            ],
        )
    )


def rejected_before_code(
    recorder: Recorder, workflow: CompiledWorkflow, port: MemoryPort, command: RunCommand
) -> str:
    calls, messages = list(recorder.calls), list(port.messages)
    with pytest.raises(RunCommandError) as info:
        execute(command, workflow, port)
    assert recorder.calls == calls
    assert port.messages == messages
    return str(info.value)


def waiting_run(recorder: Recorder, port: MemoryPort, workflow: CompiledWorkflow) -> str:
    port.create_run("run-1", {"task": "t"}, definition_digest=workflow.digest)
    result = execute(StartCommand("run-1"), workflow, port)
    assert result.status is RunStatus.WAITING
    assert result.request_id is not None
    return result.request_id


def test_a_restart_of_a_run_that_is_not_terminal_is_refused() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    waiting_run(recorder, port, workflow)
    port.create_restart("run-1", "restart-1")
    assert "only a terminal run can be restarted" in rejected_before_code(
        recorder, workflow, port, RestartCommand("restart-1", "run-1")
    )


def test_continue_takes_the_answer_of_exactly_the_request_it_names() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    review = waiting_run(recorder, port, workflow)
    port.answer(review, {"note": "fine"})
    assert "not request-other" in rejected_before_code(
        recorder, workflow, port, ContinueCommand("run-1", "request-other")
    )
    decision = execute(ContinueCommand("run-1", review), workflow, port)
    assert (decision.status, decision.path) == (RunStatus.WAITING, "decide")
    assert recorder.calls == ["title", "input", "first", "deploy", "review", "input"]


def test_a_decision_answer_outside_the_declared_choices_is_refused() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    review = waiting_run(recorder, port, workflow)
    port.answer(review, "ok")
    decision = execute(ContinueCommand("run-1", review), workflow, port)
    assert decision.request_id is not None
    port.answer(decision.request_id, {"choice": "maybe"})
    assert "choice 'maybe' is not one of go, stop" in rejected_before_code(
        recorder, workflow, port, ContinueCommand("run-1", decision.request_id)
    )


def test_a_protected_decision_refuses_a_session_answer() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    review = waiting_run(recorder, port, workflow)
    port.answer(review, "ok")
    decision = execute(ContinueCommand("run-1", review), workflow, port)
    assert decision.request_id is not None
    port.answer(decision.request_id, {"choice": "go"}, answered_by=AnsweredBy.SESSION)
    assert "only a human answer or its timeout policy" in rejected_before_code(
        recorder, workflow, port, ContinueCommand("run-1", decision.request_id)
    )


def test_commands_round_trip_their_wire_form() -> None:
    commands: list[RunCommand] = [
        StartCommand("r"),
        ResumeCommand("r"),
        ContinueCommand("r", "request-1"),
        RestartCommand("r2", "r"),
    ]
    for command in commands:
        assert command_from_json(command_to_json(command)) == command
    for bad in (
        {"command": "start"},
        {"command": "jump", "runId": "r"},
        {"command": "continue", "runId": "r"},
        {"command": "start", "runId": ""},
        ["start"],
    ):
        with pytest.raises(RunCommandError):
            command_from_json(bad)  # type: ignore[arg-type]
