"""Engine behaviour: routing, limits, deadlines, cancellation, updates, notifications, mounts."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from piwf.errors import ClaimLostError
from piwf.workflow import (
    CancellationSignal,
    action,
    compute,
    define_workflow,
    idempotent_effect,
    include,
    manual_effect,
    notify,
    shell,
)
from piwf.workflow.commands import ResumeCommand, StartCommand
from piwf.workflow.engine import execute
from piwf.workflow.memory import EffectStatus, MemoryPort, run_in_memory
from piwf.workflow.port import (
    NodeFailed,
    NodeFinished,
    NotificationRequested,
    ParkReason,
    PortResult,
    RunStatus,
    UpdatePublished,
)

from .conftest import Crash, CrashingPort, compiled


def chain(*nodes: tuple[str, Any], max_steps: int = 100, edges: Any = None) -> Any:
    names = [name for name, _ in nodes]
    return define_workflow(
        name="chain",
        start_at=names[0],
        max_steps=max_steps,
        nodes=dict(nodes),
        edges=edges
        if edges is not None
        else [{"from": a, "to": b} for a, b in itertools.pairwise(names)],
    )


def wait_for_signal(ctx: Any) -> Any:
    assert ctx.signal.wait(30)
    ctx.signal.raise_if_cancelled()
    return "unreachable"


def test_a_failing_node_without_outcome_route_fails_the_run() -> None:
    def broken(ctx: Any) -> Any:
        raise ValueError("bad value")

    after: list[str] = []
    result, port = run_in_memory(
        chain(("a", compute(broken)), ("b", compute(lambda ctx: after.append("b"))))
    )
    assert (result.status, result.error, result.path) == (
        RunStatus.FAILED,
        "ValueError: bad value",
        "a",
    )
    assert after == []
    (failed,) = [m for m in port.messages if isinstance(m, NodeFailed)]
    assert failed.error == "ValueError: bad value"


def test_missing_switch_case_is_a_routing_error() -> None:
    workflow = chain(
        ("a", compute(lambda ctx: {"route": "sideways"})),
        ("b", compute(lambda ctx: None)),
        edges=[{"from": "a", "switch": {"on": "$.route", "cases": {"up": "b"}}}],
    )
    result, _ = run_in_memory(workflow)
    assert result.status is RunStatus.FAILED
    assert result.error == "routing error after 'a': no case for $.route = 'sideways' (cases: up)"


def test_missing_switch_path_is_a_routing_error() -> None:
    workflow = chain(
        ("a", compute(lambda ctx: {"other": 1})),
        ("b", compute(lambda ctx: None)),
        edges=[{"from": "a", "switch": {"on": "$output.route.deep", "cases": {"x": "b"}}}],
    )
    result, _ = run_in_memory(workflow)
    assert result.error == "routing error after 'a': $output.route.deep is missing from the output"


def test_switch_matches_non_string_values_by_canonical_text() -> None:
    workflow = chain(
        ("a", compute(lambda ctx: {"items": [{"n": 3}]})),
        ("three", compute(lambda ctx: "three")),
        edges=[{"from": "a", "switch": {"on": "$output.items.0.n", "cases": {"3": "three"}}}],
    )
    assert run_in_memory(workflow)[0].output == "three"


def test_outcome_switch_without_a_failure_case_ends_the_run_with_the_outcome() -> None:
    def broken(ctx: Any) -> Any:
        raise RuntimeError("no")

    workflow = chain(
        ("a", compute(broken)),
        ("b", compute(lambda ctx: None)),
        edges=[{"from": "a", "switch": {"on": "$result.outcome", "cases": {"ok": "b"}}}],
    )
    result, _ = run_in_memory(workflow)
    assert (result.status, result.error) == (RunStatus.FAILED, "RuntimeError: no")


def test_node_timeout_sets_the_signal_and_routes_on_timed_out() -> None:
    workflow = chain(
        ("slow", compute(wait_for_signal, timeout_ms=50)),
        ("recover", compute(lambda ctx: {"saw": ctx.results["slow"].outcome.value})),
        edges=[
            {"from": "slow", "switch": {"on": "$result.outcome", "cases": {"timed_out": "recover"}}}
        ],
    )
    result, port = run_in_memory(workflow)
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"saw": "timed_out"})
    (failed,) = [m for m in port.messages if isinstance(m, NodeFailed)]
    assert failed.error == "timed out after 50 ms"


def test_node_timeout_without_route_times_the_run_out() -> None:
    result, port = run_in_memory(chain(("slow", compute(wait_for_signal, timeout_ms=50))))
    assert result.status is RunStatus.TIMED_OUT
    started = port.messages[1]
    assert started.timeout_ms == 50  # type: ignore[attr-defined]
    assert started.deadline_ms == started.started_at_ms + 50  # type: ignore[attr-defined]


def test_computed_timeouts_are_resolved_per_visit() -> None:
    result, port = run_in_memory(
        chain(("slow", compute(wait_for_signal, timeout_ms=lambda ctx: ctx.input["ms"]))),
        {"ms": 40},
    )
    assert result.status is RunStatus.TIMED_OUT
    assert port.messages[1].timeout_ms == 40  # type: ignore[attr-defined]


def test_a_timed_out_idempotent_action_settles_rejected() -> None:
    node = action(effect=idempotent_effect("slow.call"), run=wait_for_signal, timeout_ms=40)
    result, port = run_in_memory(chain(("call", node)))
    assert result.status is RunStatus.TIMED_OUT
    (effect,) = port.effects_of("dry-run")
    assert effect.status is EffectStatus.REJECTED


def test_a_timed_out_manual_action_becomes_ambiguous_and_parks() -> None:
    node = action(effect=manual_effect("slow.call"), run=wait_for_signal, timeout_ms=40)
    result, port = run_in_memory(chain(("call", node)))
    assert (result.status, result.park_reason) == (
        RunStatus.PARKED,
        ParkReason.EFFECT_AMBIGUOUS,
    )
    (effect,) = port.effects_of("dry-run")
    assert effect.status is EffectStatus.AMBIGUOUS


def test_cancellation_stops_before_the_next_node() -> None:
    cancel = CancellationSignal()
    seen: list[bool] = []

    def first(ctx: Any) -> Any:
        cancel.cancel()
        seen.append(ctx.signal.cancelled)
        return 1

    workflow = chain(("a", compute(first)), ("b", compute(lambda ctx: seen.append(False))))
    result, _ = run_in_memory(workflow, cancel=cancel)
    assert (result.status, result.error) == (RunStatus.CANCELLED, "run cancelled")
    assert seen == [True]


def test_publish_update_keeps_the_latest_per_type_and_key() -> None:
    errors: list[str] = []
    leaked: list[Any] = []

    def work(ctx: Any) -> Any:
        ctx.publish_update("progress", "files", {"done": 1, "total": 2})
        ctx.publish_update("progress", "files", {"done": 2, "total": 2})
        ctx.publish_update("log", "last", "started")
        for bad in ((1, "k", {}), ("t", "", {}), ("t", "k", {1, 2})):
            try:
                ctx.publish_update(*bad)
            except ValueError as error:
                errors.append(str(error))
        leaked.append(ctx)
        return "ok"

    result, port = run_in_memory(chain(("work", compute(work))))
    assert result.status is RunStatus.COMPLETED
    assert port.updates[("dry-run", "progress", "files")].data == {"done": 2, "total": 2}
    assert port.updates[("dry-run", "log", "last")].data == "started"
    assert len(errors) == 3
    with pytest.raises(RuntimeError, match="has ended"):
        leaked[0].publish_update("progress", "files", {})


class ClaimLosingPort(MemoryPort):
    def publish_update(self, message: UpdatePublished) -> PortResult:
        raise ClaimLostError("generationChanged", message.run_id, 2)


def test_port_errors_stop_the_run_even_when_workflow_code_swallows_them() -> None:
    def careless(ctx: Any) -> Any:
        try:
            ctx.publish_update("progress", "k", 1)
        except Exception:
            return "swallowed"
        return "unreachable"

    port = ClaimLosingPort()
    with pytest.raises(ClaimLostError):
        run_in_memory(chain(("a", compute(careless))), port=port)
    assert not [m for m in port.messages if isinstance(m, (NodeFinished, NodeFailed))]


def test_notify_is_not_duplicated_by_a_crash_retry() -> None:
    workflow = compiled(
        chain(
            ("tell", notify(message=lambda ctx: f"hello {ctx.input}", kind="final")),
            ("end", compute(lambda ctx: ctx.outputs["tell"])),
        )
    )
    port = CrashingPort()
    port.arm(NotificationRequested)
    port.create_run("run-1", "ada", definition_digest=workflow.digest)
    with pytest.raises(Crash):
        execute(StartCommand("run-1"), workflow, port)
    # The notification committed before the runner died; the retry of the visit adopts it.
    assert len(port.notifications) == 1
    result = execute(ResumeCommand("run-1"), workflow, port)
    assert result.output == {"kind": "final", "message": "hello ada"}
    assert len(port.notifications) == 1
    finished = [m for m in port.messages if isinstance(m, NodeFinished) and m.path == "tell"]
    assert [(m.visit, m.attempt) for m in finished] == [(1, 2)]


def test_each_loop_visit_of_notify_gets_its_own_notification() -> None:
    workflow = chain(
        ("tell", notify(message=lambda ctx: f"round {ctx.visit}")),
        ("loop", compute(lambda ctx: {"again": ctx.visit < 3})),
        ("end", compute(lambda ctx: None)),
        edges=[
            {"from": "tell", "to": "loop"},
            {
                "from": "loop",
                "switch": {"on": "$output.again", "cases": {"true": "tell", "false": "end"}},
            },
        ],
    )
    result, port = run_in_memory(workflow)
    assert result.status is RunStatus.COMPLETED
    assert sorted(n.message for n in port.notifications.values()) == [
        "round 1",
        "round 2",
        "round 3",
    ]


def test_a_non_json_output_fails_the_node() -> None:
    result, _ = run_in_memory(chain(("a", compute(lambda ctx: {"when": object()}))))
    assert result.status is RunStatus.FAILED
    assert result.error is not None and result.error.startswith("output is not JSON")


def test_pydantic_input_models_parse_the_input() -> None:
    class Release(BaseModel):
        version: str
        targets: list[str]

    workflow = define_workflow(
        name="typed",
        start_at="plan",
        input=Release,
        nodes={"plan": compute(lambda ctx: {"first": ctx.input.targets[0]})},
        edges=[],
    )
    ok, _ = run_in_memory(workflow, {"version": "1", "targets": ["eu"]})
    assert ok.output == {"first": "eu"}
    bad, _ = run_in_memory(workflow, {"version": "1"})
    assert bad.status is RunStatus.FAILED
    assert bad.error is not None and "input rejected by workflow 'typed'" in bad.error


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


def test_mounts_see_child_local_state_and_reentry_starts_empty() -> None:
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
    result, port = run_in_memory(workflow, {"top": 1})
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"exit": "done", "output": {"checked": {"count": 2}}}
    assert seen == [
        {"input": {"count": 1}, "outputs": {}, "path": "inner/work"},
        {"input": {"count": 2}, "outputs": {}, "path": "inner/work"},
    ]
    finished_paths = [m.path for m in port.messages if isinstance(m, NodeFinished)]
    assert finished_paths == ["setup", "inner/work", "check", "inner/work", "check", "end"]


def test_mount_input_defaults_to_the_parent_input() -> None:
    seen: list[Any] = []
    workflow = define_workflow(
        name="parent",
        start_at="inner",
        includes={"inner": include(child_workflow(seen))},
        nodes={"end": compute(lambda ctx: ctx.results["inner"].output)},
        edges=[{"from": "inner.done", "to": "end"}],
    )
    result, _ = run_in_memory(workflow, {"count": 7})
    assert seen[0]["input"] == {"count": 7}
    assert result.output == {"exit": "done", "output": {"checked": {"count": 7}}}


def test_a_refused_exit_fails_the_run() -> None:
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
    result, _ = run_in_memory(workflow)
    assert result.status is RunStatus.FAILED
    assert result.error == (
        "exit 'done' of mount 'inner' refused the output: ValueError: not acceptable"
    )


def test_child_max_steps_also_applies() -> None:
    child = define_workflow(
        name="child",
        start_at="spin",
        max_steps=3,
        nodes={"spin": compute(lambda ctx: ctx.visit)},
        edges=[{"from": "spin", "to": "spin"}],
    )
    parent = define_workflow(
        name="parent",
        start_at="first",
        includes={"inner": include(child)},
        nodes={"first": compute(lambda ctx: None)},
        edges=[{"from": "first", "to": "inner"}],
    )
    result, _ = run_in_memory(parent)
    assert result.status is RunStatus.FAILED
    assert result.error == (
        "workflow 'child' in mount 'inner' exceeded max_steps=3 before visiting 'inner/spin'"
    )


PRINT_MANY = "import sys; sys.stdout.write('x' * 100); sys.stderr.write('e'); sys.exit(CODE)"


def shell_node(code: int, **options: Any) -> Any:
    return shell(
        effect=idempotent_effect("shell.test"),
        command=[sys.executable, "-c", PRINT_MANY.replace("CODE", str(code))],
        **options,
    )


def test_shell_nonzero_exit_fails_unless_allowed() -> None:
    failed, port = run_in_memory(chain(("run", shell_node(3))))
    assert failed.status is RunStatus.FAILED
    assert failed.error is not None and "exited with 3" in failed.error
    (effect,) = port.effects_of("dry-run")
    assert effect.status is EffectStatus.REJECTED
    assert isinstance(effect.result, dict) and effect.result["exit_code"] == 3
    allowed, _ = run_in_memory(chain(("run", shell_node(3, allow_nonzero_exit=True))))
    assert allowed.status is RunStatus.COMPLETED
    assert isinstance(allowed.output, dict) and allowed.output["exit_code"] == 3


def test_shell_output_is_capped() -> None:
    result, _ = run_in_memory(chain(("run", shell_node(0, max_output_chars=10))))
    assert isinstance(result.output, dict)
    assert result.output["stdout"] == "x" * 10
    assert result.output["stdout_truncated"] is True
    assert (result.output["stderr"], result.output["stderr_truncated"]) == ("e", False)


def test_shell_deadline_kills_the_process_group() -> None:
    node = shell(
        effect=idempotent_effect("shell.sleep"),
        command=[sys.executable, "-c", "import threading; threading.Event().wait(30)"],
        timeout_ms=200,
    )
    result, port = run_in_memory(chain(("run", node)))
    assert result.status is RunStatus.TIMED_OUT
    (effect,) = port.effects_of("dry-run")
    assert effect.status is EffectStatus.REJECTED


def test_shell_command_that_cannot_start_fails_the_node() -> None:
    node = shell(effect=idempotent_effect("shell.none"), command=["/nonexistent/piwf-binary"])
    result, _ = run_in_memory(chain(("run", node)))
    assert result.status is RunStatus.FAILED
    assert result.error is not None and "cannot start '/nonexistent/piwf-binary'" in result.error
