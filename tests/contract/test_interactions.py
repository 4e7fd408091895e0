"""Checkpoints and decisions on both ports: park ``waiting``, take an answer, consume it."""

from __future__ import annotations

from typing import Any

from piwf.workflow import (
    action,
    checkpoint,
    compute,
    define_workflow,
    human_decision,
    idempotent_effect,
)
from piwf.workflow import port as p
from piwf.workflow.compiler import compile_workflow
from piwf.workflow.context import Outcome

from .ports import PortUnderTest, RequestView
from .workflows import chain, fixture


def test_a_checkpoint_parks_the_run_waiting_then_its_answer_becomes_the_output(
    subject: PortUnderTest,
) -> None:
    result = subject.start(fixture("checkpoint_review"), {"steps": ["a", "b"]})
    assert (result.status, result.park_reason) == (p.RunStatus.WAITING, p.ParkReason.WAITING)
    assert result.request_id is not None
    content = {"summary": "Review the plan", "content": {"plan": {"steps": ["a", "b"]}}}
    assert subject.requests() == [
        RequestView(result.request_id, "review", 1, "checkpoint", content, None)
    ]
    saved = subject.saved()
    assert (saved.status, saved.park_reason) == (p.RunStatus.WAITING, p.ParkReason.WAITING)
    assert saved.pending is not None and saved.active is not None
    assert (saved.pending.request_id, saved.pending.kind, saved.pending.answered) == (
        result.request_id,
        p.InteractionKind.CHECKPOINT,
        False,
    )
    assert (saved.active.path, saved.active.visit) == ("review", 1)
    subject.answer(result.request_id, {"approved": True})
    answered = subject.saved().pending
    assert answered is not None
    assert (answered.answered, answered.answer) == (True, {"approved": True})
    done = subject.run()
    assert done is not None
    assert (done.status, done.output) == (
        p.RunStatus.COMPLETED,
        {"applied": ["a", "b"], "note": {"approved": True}},
    )
    # The answer closed the visit it belonged to; it ran its node code once.
    finished = subject.sent(p.NodeFinished, "review")
    assert [(m.visit, m.attempt, m.request_id, m.output) for m in finished] == [
        (1, 1, result.request_id, {"approved": True})
    ]
    assert subject.saved().pending is None


def test_a_decision_answered_by_a_person_routes_on_the_choice(subject: PortUnderTest) -> None:
    result = subject.start(fixture("decision_timeout"), {"release": "1.2"})
    assert result.status is p.RunStatus.WAITING and result.request_id is not None
    (request,) = subject.requests()
    assert (request.kind, request.on_timeout) == (
        "human_decision",
        {"afterMs": 600_000, "response": {"choice": "hold"}},
    )
    assert request.content == {
        "audience": "operator",
        "choices": {"ship": "Ship it", "hold": "Hold back"},
        "request": {"title": "Ship?", "subject": {"release": "1.2"}},
    }
    subject.answer(result.request_id, {"choice": "ship"})
    done = subject.run()
    assert done is not None
    assert (done.status, done.output) == (p.RunStatus.COMPLETED, {"shipped": "1.2"})


def test_a_decision_nobody_answers_takes_its_timeout_default(subject: PortUnderTest) -> None:
    result = subject.start(fixture("decision_timeout"), {"release": "1.2"})
    assert result.request_id is not None
    subject.expire(result.request_id)
    pending = subject.saved().pending
    assert pending is not None
    assert (pending.answered, pending.answer, pending.answered_by) == (
        True,
        {"choice": "hold"},
        p.AnsweredBy.TIMEOUT_POLICY,
    )
    done = subject.run()
    assert done is not None
    assert (done.status, done.output) == (p.RunStatus.COMPLETED, {"held": "1.2"})


def test_a_decision_without_a_default_times_its_visit_out(subject: PortUnderTest) -> None:
    workflow = chain(
        ("approve", human_decision(choices=["go"], on_timeout={"after_ms": 1_000})),
        ("late", compute(lambda ctx: {"saw": ctx.results["approve"].outcome.value})),
        edges=[
            {
                "from": "approve",
                "switch": {"on": "$result.outcome", "cases": {"timed_out": "late"}},
            }
        ],
    )
    result = subject.start(workflow)
    assert result.request_id is not None
    subject.expire(result.request_id)
    pending = subject.saved().pending
    assert pending is not None and pending.answered_by is p.AnsweredBy.EXPIRED
    done = subject.run()
    assert done is not None
    assert (done.status, done.output) == (p.RunStatus.COMPLETED, {"saw": "timed_out"})
    (step, _) = subject.saved().steps
    assert (step.path, step.outcome) == ("approve", Outcome.TIMED_OUT)
    assert step.error == f"decision {result.request_id} expired with no default response"


def test_a_crash_between_request_and_park_waits_on_the_same_request(
    subject: PortUnderTest,
) -> None:
    contents: list[int] = []

    def content(ctx: Any) -> Any:
        contents.append(ctx.attempt)
        return {"plan": 1}

    workflow = chain(
        ("gate", checkpoint(summary="ready?", run=content)),
        ("done", compute(lambda ctx: ctx.outputs["gate"])),
    )
    subject.create(workflow)
    subject.crash(after=p.InteractionRequested)
    subject.run()  # memory: the resume parks on the open request; store: recovery already did
    saved = subject.saved()
    assert (saved.status, saved.park_reason) == (p.RunStatus.WAITING, p.ParkReason.WAITING)
    (request,) = subject.requests()
    assert saved.pending is not None and saved.pending.request_id == request.request_id
    assert contents == [1]
    subject.answer(request.request_id, {"ok": True})
    done = subject.run()
    assert done is not None
    assert (done.status, done.output) == (p.RunStatus.COMPLETED, {"ok": True})
    assert len(subject.requests()) == 1
    assert contents == [1]


def recorded(calls: list[str]) -> Any:
    def node(name: str) -> Any:
        def run(ctx: Any) -> Any:
            calls.append(name)
            return {name: ctx.visit, "saw": sorted(ctx.outputs)}

        return run

    return compile_workflow(
        define_workflow(
            name="recorded",
            start_at="first",
            nodes={
                "first": compute(node("first")),
                "deploy": action(effect=idempotent_effect("svc.deploy"), run=node("deploy")),
                "review": checkpoint(run=node("review")),
                "decide": human_decision(choices=["go", "stop"]),
                "last": compute(lambda ctx: dict(ctx.outputs)),
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


# conformance: X17
def test_each_answer_continues_from_exactly_the_saved_state(subject: PortUnderTest) -> None:
    calls: list[str] = []
    review = subject.start(recorded(calls), {"task": "t"})
    assert review.request_id is not None
    subject.answer(review.request_id, {"note": "fine"})
    decision = subject.run()
    assert decision is not None and decision.status is p.RunStatus.WAITING
    assert decision.request_id is not None and decision.request_id != review.request_id
    subject.answer(decision.request_id, {"choice": "go"})
    done = subject.run()
    assert done is not None
    assert done.status is p.RunStatus.COMPLETED
    assert done.output == {
        "first": {"first": 1, "saw": []},
        "deploy": {"deploy": 1, "saw": ["first"]},
        "review": {"note": "fine"},
        "decide": {"choice": "go"},
    }
    assert calls == ["first", "deploy", "review"]
    assert [e.status for e in subject.effects()] == ["applied"]
    assert [m.kind for m in subject.sent(p.InteractionRequested)] == [
        p.InteractionKind.CHECKPOINT,
        p.InteractionKind.HUMAN_DECISION,
    ]
