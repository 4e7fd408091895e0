"""Run commands: one exhaustive switch; invalid combinations fail before workflow code runs."""

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
from piwf.workflow.port import AnsweredBy, InteractionRequested, NodeStarted, RunStatus

from .conftest import Crash, CrashingPort, compiled


class Recorder:
    """Records every workflow callable that runs, so a test can prove none did."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.seen_outputs: list[dict[str, Any]] = []
        self.fail_first: set[str] = set()
        self.crash_next: set[str] = set()

    def node(self, name: str, value: Any = None) -> Any:
        def run(ctx: Any) -> Any:
            self.calls.append(name)
            self.seen_outputs.append({name: dict(ctx.outputs)})
            if name in self.crash_next:
                self.crash_next.discard(name)
                raise Crash(name)
            if name in self.fail_first:
                self.fail_first.discard(name)
                raise RuntimeError(f"{name} failed")
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


def node_starts(port: MemoryPort, run_id: str) -> list[tuple[str, int, int]]:
    return [
        (m.path, m.visit, m.attempt)
        for m in port.messages
        if isinstance(m, NodeStarted) and m.run_id == run_id
    ]


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


def test_start_runs_from_the_first_node() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    waiting_run(recorder, port, workflow)
    assert recorder.calls == ["title", "input", "first", "deploy", "review"]
    assert node_starts(port, "run-1") == [("first", 1, 1), ("deploy", 1, 1), ("review", 1, 1)]


# conformance: X17
def test_invalid_combinations_fail_before_workflow_code_runs() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    assert "does not exist" in rejected_before_code(recorder, workflow, port, StartCommand("ghost"))
    request_id = waiting_run(recorder, port, workflow)
    assert "already started" in rejected_before_code(
        recorder, workflow, port, StartCommand("run-1")
    )
    assert "waiting for an answer" in rejected_before_code(
        recorder, workflow, port, ResumeCommand("run-1")
    )
    assert "has no answer yet" in rejected_before_code(
        recorder, workflow, port, ContinueCommand("run-1", request_id)
    )
    assert "not request-other" in rejected_before_code(
        recorder, workflow, port, ContinueCommand("run-1", "request-other")
    )
    port.create_restart("run-1", "restart-1")
    assert "only a terminal run can be restarted" in rejected_before_code(
        recorder, workflow, port, RestartCommand("restart-1", "run-1")
    )
    assert "is a restart; send a restart command" in rejected_before_code(
        recorder, workflow, port, StartCommand("restart-1")
    )
    assert "not a restart of run-0" in rejected_before_code(
        recorder, workflow, port, RestartCommand("restart-1", "run-0")
    )
    assert "has not started; send start" in rejected_before_code(
        recorder, workflow, port, ResumeCommand("restart-1")
    )
    port.create_run("fresh", None, definition_digest=workflow.digest)
    assert "not waiting on a request" in rejected_before_code(
        recorder, workflow, port, ContinueCommand("fresh", request_id)
    )


def test_terminal_runs_cannot_resume_or_continue() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    recorder.fail_first.add("first")
    port.create_run("run-1", None, definition_digest=workflow.digest)
    assert execute(StartCommand("run-1"), workflow, port).status is RunStatus.FAILED
    assert "a terminal run can only be restarted" in rejected_before_code(
        recorder, workflow, port, ResumeCommand("run-1")
    )
    assert "not waiting on a request" in rejected_before_code(
        recorder, workflow, port, ContinueCommand("run-1", "request-x")
    )


def test_a_changed_definition_is_refused() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    port.create_run("run-1", None, definition_digest="0" * 64)
    assert "was started with definition" in rejected_before_code(
        recorder, workflow, port, StartCommand("run-1")
    )


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


# conformance: X17
def test_continue_carries_exactly_the_saved_state() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    review = waiting_run(recorder, port, workflow)
    port.answer(review, {"note": "fine"})
    decision = execute(ContinueCommand("run-1", review), workflow, port)
    assert decision.status is RunStatus.WAITING
    assert recorder.calls == ["title", "input", "first", "deploy", "review", "input"]
    assert decision.request_id is not None
    port.answer(decision.request_id, {"choice": "go"})
    done = execute(ContinueCommand("run-1", decision.request_id), workflow, port)
    assert done.status is RunStatus.COMPLETED
    assert recorder.seen_outputs[-1] == {
        "last": {
            "first": {"first": 1},
            "deploy": {"deploy": 1},
            "review": {"note": "fine"},
            "decide": {"choice": "go"},
        }
    }
    assert recorder.calls.count("first") == 1
    assert recorder.calls.count("deploy") == 1
    assert len(port.effects_of("run-1")) == 1


# conformance: X17
def test_resume_retries_the_unfinished_visit_with_its_number() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    recorder.crash_next.add("deploy")
    port.create_run("run-1", None, definition_digest=workflow.digest)
    with pytest.raises(Crash):
        execute(StartCommand("run-1"), workflow, port)
    result = execute(ResumeCommand("run-1"), workflow, port)
    assert result.status is RunStatus.WAITING
    assert node_starts(port, "run-1") == [
        ("first", 1, 1),
        ("deploy", 1, 1),
        ("deploy", 1, 2),
        ("review", 1, 1),
    ]
    assert recorder.calls.count("first") == 1
    assert recorder.seen_outputs[-1] == {"review": {"first": {"first": 1}, "deploy": {"deploy": 1}}}


def test_resume_after_a_crash_between_nodes_takes_the_next_node() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    recorder.crash_next.add("review")
    port.create_run("run-1", None, definition_digest=workflow.digest)
    with pytest.raises(Crash):
        execute(StartCommand("run-1"), workflow, port)
    result = execute(ResumeCommand("run-1"), workflow, port)
    assert result.status is RunStatus.WAITING
    assert node_starts(port, "run-1")[-2:] == [("review", 1, 1), ("review", 1, 2)]


# conformance: X17
def test_restart_begins_at_the_first_node_with_nothing_from_the_parent() -> None:
    recorder, port = Recorder(), MemoryPort()
    workflow = build(recorder)
    recorder.crash_next.add("review")
    port.create_run("run-1", {"task": "t"}, definition_digest=workflow.digest)
    with pytest.raises(Crash):
        execute(StartCommand("run-1"), workflow, port)
    recorder.fail_first.add("review")
    failed = execute(ResumeCommand("run-1"), workflow, port)
    assert failed.status is RunStatus.FAILED
    port.create_restart("run-1", "run-2")
    recorder.seen_outputs.clear()
    result = execute(RestartCommand("run-2", "run-1"), workflow, port)
    assert result.status is RunStatus.WAITING
    assert node_starts(port, "run-2") == [("first", 1, 1), ("deploy", 1, 1), ("review", 1, 1)]
    assert recorder.seen_outputs[0] == {"first": {}}
    restarted = port.read_run("run-2")
    assert restarted is not None
    assert [step.path for step in restarted.steps] == ["first", "deploy"]
    assert restarted.input == {"task": "t"}
    assert restarted.restart_number == 1
    (parent_effect,) = port.effects_of("run-1")
    (child_effect,) = port.effects_of("run-2")
    assert parent_effect.key != child_effect.key
    assert child_effect.attempts == 1


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


def test_resume_after_a_crash_between_request_and_park_parks_on_the_same_request() -> None:
    recorder = Recorder()
    workflow = build(recorder)
    port = CrashingPort()
    port.arm(InteractionRequested)
    port.create_run("run-1", None, definition_digest=workflow.digest)
    with pytest.raises(Crash):
        execute(StartCommand("run-1"), workflow, port)
    saved = port.read_run("run-1")
    assert saved is not None and saved.status is RunStatus.RUNNING
    assert saved.pending is not None
    result = execute(ResumeCommand("run-1"), workflow, port)
    assert (result.status, result.request_id) == (RunStatus.WAITING, saved.pending.request_id)
    assert len(port.requests) == 1
    assert recorder.calls.count("review") == 1
