"""Run commands on both ports: resume from the last durable boundary, restart, refusals (X17)."""

from __future__ import annotations

from typing import Any

from piwf.workflow import (
    action,
    checkpoint,
    compute,
    define_workflow,
    idempotent_effect,
    identity,
)
from piwf.workflow import port as p
from piwf.workflow.commands import (
    ContinueCommand,
    RestartCommand,
    ResumeCommand,
    StartCommand,
)
from piwf.workflow.compiler import CompiledWorkflow, compile_workflow

from .ports import PortUnderTest
from .workflows import CrashOnFirstCall, chain, fixture


def started(subject: PortUnderTest, run_id: str = "run-1") -> list[tuple[str, int, int]]:
    return [(m.path, m.visit, m.attempt) for m in subject.sent(p.NodeStarted) if m.run_id == run_id]


# conformance: X17
# conformance: X18
def test_a_resume_retries_the_unfinished_visit_with_its_number(subject: PortUnderTest) -> None:
    first: list[int] = []
    body = CrashOnFirstCall({"done": True})
    workflow = chain(("first", compute(lambda ctx: first.append(1))), ("work", compute(body)))
    subject.create(workflow)
    subject.crash()
    saved = subject.saved()
    assert saved.active is not None
    assert (saved.active.path, saved.active.visit, saved.active.attempt) == ("work", 1, 1)
    assert [s.path for s in saved.steps] == ["first"]
    result = subject.run()
    assert result is not None and result.status is p.RunStatus.COMPLETED
    assert started(subject) == [("first", 1, 1), ("work", 1, 1), ("work", 1, 2)]
    assert [(s.path, s.visit, s.attempt) for s in subject.saved().steps] == [
        ("first", 1, 1),
        ("work", 1, 2),
    ]
    assert (first, body.calls) == ([1], 2)


def test_a_resume_after_a_crash_between_nodes_takes_the_next_node(
    subject: PortUnderTest,
) -> None:
    seen: list[Any] = []
    workflow = chain(
        ("first", compute(lambda ctx: {"n": 1})),
        ("second", compute(lambda ctx: seen.append(dict(ctx.outputs)))),
    )
    subject.create(workflow)
    subject.crash(after=p.NodeFinished, path="first")
    saved = subject.saved()
    assert (saved.active, [s.path for s in saved.steps]) == (None, ["first"])
    result = subject.run()
    assert result is not None and result.status is p.RunStatus.COMPLETED
    assert started(subject) == [("first", 1, 1), ("second", 1, 1)]
    assert seen == [{"first": {"n": 1}}]


def test_a_runner_that_dies_right_after_it_began_starts_over_cleanly(
    subject: PortUnderTest,
) -> None:
    subject.create(fixture("hello"), {"who": "ada"})
    subject.crash(after=p.RunBegun)
    assert subject.saved().steps == ()
    result = subject.run()
    assert result is not None
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"shouted": "HELLO ADA"})
    assert started(subject) == [("greet", 1, 1), ("shout", 1, 1)]


# conformance: X17
def test_a_restart_begins_at_the_first_node_with_nothing_from_its_parent(
    subject: PortUnderTest,
) -> None:
    broken = {"on": True}
    seen: list[Any] = []

    def last(ctx: Any) -> Any:
        if broken["on"]:
            raise RuntimeError("last failed")
        return dict(ctx.outputs)

    workflow = chain(
        ("first", compute(lambda ctx: seen.append(dict(ctx.outputs)) or {"n": 1})),
        ("deploy", action(effect=idempotent_effect("svc.deploy"), run=lambda ctx: ctx.run_id)),
        ("last", compute(last)),
    )
    failed = subject.start(workflow, {"task": "t"})
    assert (failed.status, failed.error) == (
        p.RunStatus.FAILED,
        'node "last" failed: RuntimeError: last failed',
    )
    subject.restart("run-1", "run-2")
    restarted = subject.saved("run-2")
    assert (restarted.lineage, restarted.parent_run_id, restarted.restart_number) == (
        p.Lineage.RESTART,
        "run-1",
        1,
    )
    assert (restarted.input, restarted.steps, restarted.status) == (
        {"task": "t"},
        (),
        p.RunStatus.QUEUED,
    )
    broken["on"] = False
    seen.clear()
    result = subject.run("run-2")
    assert result is not None
    assert (result.status, result.output) == (
        p.RunStatus.COMPLETED,
        {"first": {"n": 1}, "deploy": "run-2"},
    )
    assert seen == [{}]
    assert started(subject, "run-2") == [("first", 1, 1), ("deploy", 1, 1), ("last", 1, 1)]
    (parent_effect,) = subject.effects("run-1")
    (child_effect,) = subject.effects("run-2")
    assert child_effect.key == identity.effect_key("run-2", "svc.deploy", "deploy", 1)
    assert (parent_effect.key != child_effect.key, child_effect.attempts) == (True, 1)
    assert subject.saved("run-1").status is p.RunStatus.FAILED


def recorded(calls: list[str]) -> CompiledWorkflow:
    """A checkpoint workflow whose every callable, title and input parser included, records."""

    def node(name: str, value: Any = None) -> Any:
        def run(ctx: Any) -> Any:
            calls.append(name)
            return value

        return run

    def parse(raw: Any) -> Any:
        calls.append("input")
        return raw

    def title(raw: Any) -> str:
        calls.append("title")
        return "recorded"

    return compile_workflow(
        define_workflow(
            name="recorded",
            start_at="prepare",
            input=parse,
            title=title,
            nodes={
                "prepare": compute(node("prepare", 1)),
                "review": checkpoint(run=node("review")),
                "apply": compute(node("apply")),
            },
            edges=[{"from": "prepare", "to": "review"}, {"from": "review", "to": "apply"}],
        )
    )


# conformance: X17
def test_commands_that_do_not_fit_the_saved_run_are_refused_before_workflow_code_runs(
    subject: PortUnderTest,
) -> None:
    calls: list[str] = []
    workflow = recorded(calls)
    waiting = subject.start(workflow, {"task": "t"})
    assert waiting.request_id is not None
    request_id = waiting.request_id
    ran = list(calls)
    assert ran == ["title", "input", "prepare", "review"]
    assert "already started" in subject.refuse(StartCommand("run-1"))
    assert "waiting for an answer" in subject.refuse(ResumeCommand("run-1"))
    assert "has no answer yet" in subject.refuse(ContinueCommand("run-1", request_id))
    assert "not request-other" in subject.refuse(ContinueCommand("run-1", "request-other"))
    assert "does not exist" in subject.refuse(StartCommand("ghost"), workflow)
    subject.create(workflow, None, run_id="fresh")
    assert "has not started; send start" in subject.refuse(ResumeCommand("fresh"))
    assert "not waiting on a request" in subject.refuse(ContinueCommand("fresh", request_id))
    assert "is not a restart of run-1" in subject.refuse(RestartCommand("fresh", "run-1"))
    assert "was started with definition" in subject.refuse(StartCommand("fresh"), fixture("hello"))
    assert calls == ran


def test_a_terminal_run_is_refused_everything_but_a_restart(subject: PortUnderTest) -> None:
    def broken(ctx: Any) -> Any:
        raise RuntimeError("no")

    workflow = chain(("a", compute(broken)))
    assert subject.start(workflow).status is p.RunStatus.FAILED
    assert "a terminal run can only be restarted" in subject.refuse(ResumeCommand("run-1"))
    assert "not waiting on a request" in subject.refuse(ContinueCommand("run-1", "request-x"))
    assert "already started" in subject.refuse(StartCommand("run-1"))
    subject.restart("run-1", "run-2")
    assert "is a restart; send a restart command" in subject.refuse(StartCommand("run-2"))
    assert "not a restart of run-0" in subject.refuse(RestartCommand("run-2", "run-0"))
    assert "has not started; send start" in subject.refuse(ResumeCommand("run-2"))
