"""Runs from start to a terminal status on both ports: steps, visits, routing, limits, mounts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from piwf.workflow import CancellationSignal, compute, define_workflow, include, invoke
from piwf.workflow import port as p
from piwf.workflow.compiler import compile_workflow
from piwf.workflow.context import Outcome

from .ports import PortUnderTest
from .workflows import chain, fixture, loop, wait_for_signal


def started(subject: PortUnderTest) -> list[tuple[str, int, int]]:
    return [(m.path, m.visit, m.attempt) for m in subject.sent(p.NodeStarted)]


# conformance: X1
def test_a_run_completes_with_every_step_saved(subject: PortUnderTest) -> None:
    result = subject.start(fixture("hello"), {"who": "ada"})
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"shouted": "HELLO ADA"})
    saved = subject.saved()
    assert (saved.status, saved.output, saved.error) == (
        p.RunStatus.COMPLETED,
        {"shouted": "HELLO ADA"},
        None,
    )
    assert [(s.path, s.visit, s.attempt, s.outcome) for s in saved.steps] == [
        ("greet", 1, 1, Outcome.OK),
        ("shout", 1, 1, Outcome.OK),
    ]
    assert saved.steps[0].output == {"greeting": "hello ada"}
    assert (saved.active, saved.pending, saved.visits) == (None, None, {"greet": 1, "shout": 1})
    assert started(subject) == [("greet", 1, 1), ("shout", 1, 1)]
    # Every proposal of a run that goes well is new: the port applied each one.
    assert {type(call.result) for call in subject.calls} == {p.Applied}
    assert [type(call.message) for call in subject.calls] == [
        p.RunBegun,
        p.NodeStarted,
        p.NodeFinished,
        p.NodeStarted,
        p.NodeFinished,
        p.RunFinished,
    ]


# conformance: X18
def test_re_entering_a_node_gets_the_next_visit(subject: PortUnderTest) -> None:
    result = subject.start(loop(compute(lambda ctx: {"n": ctx.visit})))
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"n": 3})
    assert [visit for path, visit, _ in started(subject) if path == "count"] == [1, 2, 3]
    saved = subject.saved()
    assert saved.visits == {"count": 3, "again": 3, "end": 1}
    assert [(s.path, s.visit) for s in saved.steps if s.path == "count"] == [
        ("count", 1),
        ("count", 2),
        ("count", 3),
    ]


def test_a_loop_switching_on_its_output_visits_each_node_per_round(
    subject: PortUnderTest,
) -> None:
    result = subject.start(fixture("loop_decision"), {"rounds": 3})
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"published": 3})
    assert [(path, visit) for path, visit, _ in started(subject)] == [
        ("draft", 1),
        ("review", 1),
        ("draft", 2),
        ("review", 2),
        ("draft", 3),
        ("review", 3),
        ("publish", 1),
    ]


def test_max_steps_fails_the_run_before_the_next_visit(subject: PortUnderTest) -> None:
    result = subject.start(fixture("loop_decision"), {"rounds": 50})
    assert result.status is p.RunStatus.FAILED
    assert result.error is not None and "exceeded max_steps=20" in result.error
    assert len(subject.sent(p.NodeStarted)) == 20
    saved = subject.saved()
    assert (saved.status, saved.error, saved.active) == (p.RunStatus.FAILED, result.error, None)


def test_a_failing_node_without_an_outcome_route_fails_the_run(subject: PortUnderTest) -> None:
    def broken(ctx: Any) -> Any:
        raise ValueError("bad value")

    after: list[str] = []
    result = subject.start(
        chain(("a", compute(broken)), ("b", compute(lambda ctx: after.append("b"))))
    )
    assert (result.status, result.error, result.path) == (
        p.RunStatus.FAILED,
        'node "a" failed: ValueError: bad value',
        "a",
    )
    assert after == []
    (failed,) = subject.sent(p.NodeFailed)
    assert (failed.outcome, failed.error) == (Outcome.FAILED, "ValueError: bad value")
    saved = subject.saved()
    (step,) = saved.steps
    assert (step.outcome, step.output, step.error) == (
        Outcome.FAILED,
        None,
        "ValueError: bad value",
    )
    assert (saved.status, saved.error) == (p.RunStatus.FAILED, result.error)


def test_a_failure_routes_on_result_outcome(subject: PortUnderTest) -> None:
    workflow = fixture("failure_route")
    broken = subject.start(workflow, {"break": True}, run_id="broken")
    assert (broken.status, broken.output) == (
        p.RunStatus.COMPLETED,
        {"recovered_from": "RuntimeError: the fragile step broke"},
    )
    fine = subject.start(workflow, {}, run_id="fine")
    assert (fine.status, fine.output) == (p.RunStatus.COMPLETED, {"result": {"fine": True}})
    assert [s.path for s in subject.saved("broken").steps] == ["fragile", "recover"]


def test_an_outcome_switch_without_a_failure_case_ends_the_run_with_the_outcome(
    subject: PortUnderTest,
) -> None:
    def broken(ctx: Any) -> Any:
        raise RuntimeError("no")

    workflow = chain(
        ("a", compute(broken)),
        ("b", compute(lambda ctx: None)),
        edges=[{"from": "a", "switch": {"on": "$result.outcome", "cases": {"ok": "b"}}}],
    )
    result = subject.start(workflow)
    assert (result.status, result.error) == (
        p.RunStatus.FAILED,
        'node "a" failed: RuntimeError: no',
    )


def test_a_missing_switch_case_is_a_routing_error(subject: PortUnderTest) -> None:
    workflow = chain(
        ("a", compute(lambda ctx: {"route": "sideways"})),
        ("b", compute(lambda ctx: None)),
        edges=[{"from": "a", "switch": {"on": "$.route", "cases": {"up": "b"}}}],
    )
    result = subject.start(workflow)
    assert result.status is p.RunStatus.FAILED
    assert result.error == "routing error after 'a': no case for $.route = 'sideways' (cases: up)"
    # The node itself succeeded; only the route failed, and the run says so.
    assert [s.outcome for s in subject.saved().steps] == [Outcome.OK]
    assert subject.saved().error == result.error


def test_a_missing_switch_path_is_a_routing_error(subject: PortUnderTest) -> None:
    workflow = chain(
        ("a", compute(lambda ctx: {"other": 1})),
        ("b", compute(lambda ctx: None)),
        edges=[{"from": "a", "switch": {"on": "$output.route.deep", "cases": {"x": "b"}}}],
    )
    result = subject.start(workflow)
    assert result.error == "routing error after 'a': $output.route.deep is missing from the output"


def test_a_switch_matches_non_string_values_by_canonical_text(subject: PortUnderTest) -> None:
    workflow = chain(
        ("a", compute(lambda ctx: {"items": [{"n": 3}]})),
        ("three", compute(lambda ctx: "three")),
        edges=[{"from": "a", "switch": {"on": "$output.items.0.n", "cases": {"3": "three"}}}],
    )
    assert subject.start(workflow).output == "three"


def test_a_node_timeout_sets_the_signal_and_routes_on_timed_out(subject: PortUnderTest) -> None:
    workflow = chain(
        ("slow", compute(wait_for_signal, timeout_ms=50)),
        ("recover", compute(lambda ctx: {"saw": ctx.results["slow"].outcome.value})),
        edges=[
            {"from": "slow", "switch": {"on": "$result.outcome", "cases": {"timed_out": "recover"}}}
        ],
    )
    result = subject.start(workflow)
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"saw": "timed_out"})
    (failed,) = subject.sent(p.NodeFailed)
    assert (failed.outcome, failed.error) == (Outcome.TIMED_OUT, "timed out after 50 ms")
    assert subject.saved().steps[0].outcome is Outcome.TIMED_OUT


def test_a_node_timeout_without_a_route_times_the_run_out(subject: PortUnderTest) -> None:
    result = subject.start(chain(("slow", compute(wait_for_signal, timeout_ms=50))))
    assert result.status is p.RunStatus.TIMED_OUT
    (begun,) = subject.sent(p.NodeStarted)
    assert begun.timeout_ms == 50
    assert begun.deadline_ms == begun.started_at_ms + 50
    assert subject.saved().status is p.RunStatus.TIMED_OUT


def test_computed_timeouts_are_resolved_per_visit(subject: PortUnderTest) -> None:
    workflow = chain(("slow", compute(wait_for_signal, timeout_ms=lambda ctx: ctx.input["ms"])))
    result = subject.start(workflow, {"ms": 40})
    assert result.status is p.RunStatus.TIMED_OUT
    assert [m.timeout_ms for m in subject.sent(p.NodeStarted)] == [40]


def test_an_output_that_is_not_json_fails_the_node(subject: PortUnderTest) -> None:
    result = subject.start(chain(("a", compute(lambda ctx: {"when": object()}))))
    assert result.status is p.RunStatus.FAILED
    assert result.error is not None
    assert result.error.startswith('node "a" failed: output is not JSON')


def test_an_output_over_the_value_limit_fails_the_node_saying_so(
    subject: PortUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(invoke, "MAX_VALUE_BYTES", 1000)  # the real bound is 255 MiB
    result = subject.start(chain(("a", compute(lambda ctx: "x" * 1000))))
    assert result.status is p.RunStatus.FAILED
    assert result.error == (
        'node "a" failed: output is too large: it is 1,002 bytes of JSON, over the 1,000 bytes '
        "one stored value may hold; keep large data outside the run (a file, a URL) and pass "
        "where it is"
    )


def child_workflow(seen: list[Any]) -> Any:
    def work(ctx: Any) -> Any:
        seen.append({"input": ctx.input, "outputs": dict(ctx.outputs), "path": ctx.path})
        return {"count": ctx.input["count"]}

    return define_workflow(
        name="child",
        start_at="work",
        nodes={"work": compute(work)},
        edges=[],
        exits={"done": {"from": "work", "validate": lambda output: {"checked": output}}},
    )


def test_a_mount_sees_child_local_state_and_a_re_entry_starts_empty(
    subject: PortUnderTest,
) -> None:
    seen: list[Any] = []

    def again(ctx: Any) -> Any:
        return {"again": ctx.outputs["inner"]["output"]["checked"]["count"] < 2}

    workflow = define_workflow(
        name="parent",
        start_at="setup",
        includes={
            "inner": include(
                child_workflow(seen),
                input=lambda ctx: {
                    "count": ctx.results["check"].visit + 1 if "check" in ctx.results else 1
                },
            )
        },
        nodes={
            "setup": compute(lambda ctx: {"setup": True}),
            "check": compute(again),
            "end": compute(lambda ctx: ctx.outputs["inner"]),
        },
        edges=[
            {"from": "setup", "to": "inner"},
            {"from": "inner.done", "to": "check"},
            {
                "from": "check",
                "switch": {"on": "$output.again", "cases": {"true": "inner", "false": "end"}},
            },
        ],
    )
    result = subject.start(compile_workflow(workflow), {"top": 1})
    assert result.status is p.RunStatus.COMPLETED
    assert result.output == {"exit": "done", "output": {"checked": {"count": 2}}}
    assert seen == [
        {"input": {"count": 1}, "outputs": {}, "path": "inner/work"},
        {"input": {"count": 2}, "outputs": {}, "path": "inner/work"},
    ]
    assert [(s.path, s.visit) for s in subject.saved().steps] == [
        ("setup", 1),
        ("inner/work", 1),
        ("check", 1),
        ("inner/work", 2),
        ("check", 2),
        ("end", 1),
    ]


def test_a_mount_input_defaults_to_the_parent_input(subject: PortUnderTest) -> None:
    seen: list[Any] = []
    workflow = define_workflow(
        name="parent",
        start_at="inner",
        includes={"inner": include(child_workflow(seen))},
        nodes={"end": compute(lambda ctx: ctx.results["inner"].output)},
        edges=[{"from": "inner.done", "to": "end"}],
    )
    result = subject.start(compile_workflow(workflow), {"count": 7})
    assert seen[0]["input"] == {"count": 7}
    assert result.output == {"exit": "done", "output": {"checked": {"count": 7}}}


def test_a_refused_exit_fails_the_run(subject: PortUnderTest) -> None:
    def refuse(output: Any) -> Any:
        raise ValueError("not acceptable")

    child = define_workflow(
        name="child",
        start_at="work",
        nodes={"work": compute(lambda ctx: 1)},
        edges=[],
        exits={"done": {"from": "work", "validate": refuse}},
    )
    workflow = define_workflow(
        name="parent",
        start_at="inner",
        includes={"inner": include(child)},
        nodes={"end": compute(lambda ctx: None)},
        edges=[{"from": "inner.done", "to": "end"}],
    )
    result = subject.start(compile_workflow(workflow))
    assert result.status is p.RunStatus.FAILED
    assert result.error == (
        "exit 'done' of mount 'inner' refused the output: ValueError: not acceptable"
    )
    assert subject.saved().error == result.error


def test_a_child_max_steps_also_applies(subject: PortUnderTest) -> None:
    child = define_workflow(
        name="child",
        start_at="spin",
        max_steps=3,
        # A loop needs a way out (define_workflow checks); this one never takes it.
        nodes={"spin": compute(lambda ctx: "again"), "stop": compute(lambda ctx: None)},
        edges=[
            {"from": "spin", "switch": {"on": "$output", "cases": {"again": "spin", "x": "stop"}}}
        ],
    )
    parent = define_workflow(
        name="parent",
        start_at="first",
        includes={"inner": include(child)},
        nodes={"first": compute(lambda ctx: None)},
        edges=[{"from": "first", "to": "inner"}],
    )
    result = subject.start(compile_workflow(parent))
    assert result.status is p.RunStatus.FAILED
    assert result.error == (
        "workflow 'child' in mount 'inner' exceeded max_steps=3 before visiting 'inner/spin'"
    )
    assert [visit for path, visit, _ in started(subject) if path == "inner/spin"] == [1, 2, 3]


def test_two_mounts_of_one_child_run_with_their_own_paths(subject: PortUnderTest) -> None:
    result = subject.start(fixture("composition"), {"repo": "/repo"})
    assert (result.status, result.output) == (
        p.RunStatus.COMPLETED,
        {"workspace": "/repo", "docs": "/repo/docs"},
    )
    assert {path for path, _, _ in started(subject)} >= {
        "workspace/inspect",
        "docs/workspace/inspect",
    }


def test_cancellation_stops_the_run_before_the_next_node(subject: PortUnderTest) -> None:
    cancel = CancellationSignal()
    seen: list[bool] = []

    def first(ctx: Any) -> Any:
        cancel.cancel()
        seen.append(ctx.signal.cancelled)
        return 1

    subject.create(chain(("a", compute(first)), ("b", compute(lambda ctx: seen.append(False)))))
    result = subject.run(cancel=cancel)
    assert result is not None
    assert (result.status, result.error) == (p.RunStatus.CANCELLED, "run cancelled")
    assert seen == [True]
    saved = subject.saved()
    assert (saved.status, saved.error, [s.path for s in saved.steps]) == (
        p.RunStatus.CANCELLED,
        "run cancelled",
        ["a"],
    )


def test_an_input_model_parses_the_input_and_a_rejected_input_fails_the_run(
    subject: PortUnderTest,
) -> None:
    class Release(BaseModel):
        version: str
        targets: list[str]

    workflow = compile_workflow(
        define_workflow(
            name="typed",
            start_at="plan",
            input=Release,
            nodes={"plan": compute(lambda ctx: {"first": ctx.input.targets[0]})},
            edges=[],
        )
    )
    ok = subject.start(workflow, {"version": "1", "targets": ["eu"]}, run_id="ok")
    assert ok.output == {"first": "eu"}
    bad = subject.start(workflow, {"version": "1"}, run_id="bad")
    assert bad.status is p.RunStatus.FAILED
    assert bad.error is not None and bad.error == (
        "input rejected by workflow 'typed': ValidationError: 1 validation error for Release\n"
        "targets\n  Field required [type=missing]"
    )
    assert (subject.saved("bad").steps, subject.saved("bad").status) == ((), p.RunStatus.FAILED)
