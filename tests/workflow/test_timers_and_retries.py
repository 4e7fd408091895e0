"""Durable timers and retry policies in the engine, on the in-memory port.

A timer visit commits its wake time with its start and parks ``timer``; a resume before the
wake time parks again, after it finishes the visit with the committed time (never a new one).
A retry policy keeps each failed try as a failed attempt, opens the next try pending until its
back-off ends, and after ``max_attempts`` lets the failure route.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import pytest

from piwf.clock import FakeClock
from piwf.errors import WorkflowDefinitionError
from piwf.lifecycle import RunStatus
from piwf.workflow import (
    action,
    compute,
    define_workflow,
    idempotent_effect,
    manual_effect,
    retry_policy,
    shell,
    sleep,
    wait_until,
)
from piwf.workflow.commands import ResumeCommand
from piwf.workflow.compiler import compile_workflow
from piwf.workflow.engine import execute
from piwf.workflow.memory import MemoryPort, run_in_memory
from piwf.workflow.port import NodeFailed, NodeStarted, ParkReason, RunParked


def chain(**nodes: object) -> object:
    names = list(nodes)
    edges = [{"from": a, "to": b} for a, b in itertools.pairwise(names)]
    return define_workflow(name="t", start_at=names[0], nodes=nodes, edges=edges)  # type: ignore[arg-type]


def resume(workflow: object, port: MemoryPort, clock: FakeClock) -> object:
    return execute(ResumeCommand("dry-run"), compile_workflow(workflow), port, clock=clock)  # type: ignore[arg-type]


def test_a_timer_parks_on_its_committed_wake_time_and_finishes_with_it() -> None:
    clock = FakeClock(1_000_000)
    workflow = chain(nap=sleep(timedelta(seconds=3)), after=compute(lambda ctx: ctx.outputs["nap"]))
    result, port = run_in_memory(workflow, None, clock=clock)
    assert (result.status, result.park_reason, result.wake_at_ms) == (
        RunStatus.PARKED,
        ParkReason.TIMER,
        1_003_000,
    )
    started = [m for m in port.messages if isinstance(m, NodeStarted)]
    assert started[-1].wake_at_ms == 1_003_000
    clock.advance(2_999)
    early = resume(workflow, port, clock)
    assert (early.status, early.wake_at_ms) == (RunStatus.PARKED, 1_003_000)  # type: ignore[attr-defined]
    clock.advance(500)
    done = resume(workflow, port, clock)
    assert done.status is RunStatus.COMPLETED  # type: ignore[attr-defined]
    assert done.output == {"wake_at_ms": 1_003_000, "woke_at_ms": 1_003_499}  # type: ignore[attr-defined]
    parks = [m for m in port.messages if isinstance(m, RunParked)]
    assert [p.wake_at_ms for p in parks] == [1_003_000, 1_003_000]


def test_a_timer_already_due_finishes_at_once_and_a_bad_computed_time_fails_the_visit() -> None:
    clock = FakeClock(5_000)
    past = datetime(1970, 1, 1, 0, 0, 1, tzinfo=timezone.utc)  # 1 000 ms, before the clock
    result, _ = run_in_memory(chain(now=wait_until(past)), None, clock=clock)
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"wake_at_ms": 1_000, "woke_at_ms": 5_000}
    failed, _ = run_in_memory(chain(nap=sleep(lambda ctx: "soon")), None, clock=clock)
    assert failed.status is RunStatus.FAILED
    assert (
        failed.error
        == 'node "nap" failed: sleep(): a duration must be 0..31622400000 ms or a timedelta, '
        "got 'soon'"
    )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: sleep(-1), "sleep(): a duration must be 0..31622400000 ms or a timedelta, got -1"),
        (
            lambda: sleep(True),
            "sleep(): a duration must be 0..31622400000 ms or a timedelta, got True",
        ),
        (
            lambda: wait_until(datetime(2030, 1, 1)),
            "wait_until(): a datetime must be timezone-aware (datetime.now(timezone.utc))",
        ),
        (
            lambda: retry_policy(max_attempts=0),
            "retry_policy(): max_attempts must be an integer in 1..100",
        ),
        (
            lambda: retry_policy(backoff_ms=10, max_backoff_ms=5),
            "retry_policy(): max_backoff_ms must be at least backoff_ms",
        ),
        (
            lambda: retry_policy(multiplier=0.5),
            "retry_policy(): multiplier must be a number in 1..100",
        ),
        (
            lambda: retry_policy(retry_on="ValueError"),  # type: ignore[arg-type]
            "retry_policy(): retry_on must be an exception class or a non-empty list of them, "
            "such as (TimeoutError, ConnectionError)",
        ),
        (
            lambda: action(effect=manual_effect("pay"), run=lambda ctx: 1, retry=retry_policy()),
            "action(): a manual_effect cannot be retried automatically (its uncertain outcomes "
            "need a person); declare an idempotent_effect or drop retry",
        ),
        (
            lambda: shell(effect=manual_effect("x"), command=["true"], retry=retry_policy()),
            "shell(): a manual_effect cannot be retried automatically (its uncertain outcomes "
            "need a person); declare an idempotent_effect or drop retry",
        ),
        (
            lambda: compute(lambda ctx: 1, retry=3),
            "compute(): retry must be retry_policy(...) or None",
        ),  # type: ignore[arg-type]
    ],
)
def test_bad_timer_and_retry_arguments_are_refused_at_definition(build, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WorkflowDefinitionError) as error:
        build()
    assert str(error.value) == message


def test_a_node_without_a_policy_keeps_its_digest_and_a_policy_is_structure() -> None:
    plain = compile_workflow(chain(a=compute(lambda ctx: 1)))
    again = compile_workflow(chain(a=compute(lambda ctx: 2)))
    retried = compile_workflow(chain(a=compute(lambda ctx: 1, retry=retry_policy(max_attempts=2))))
    assert plain.digest == again.digest != retried.digest
    assert retried.nodes["a"].node.structure()["retry"] == {
        "maxAttempts": 2,
        "backoffMs": 1000,
        "maxBackoffMs": 60000,
        "multiplier": 2.0,
        "retryOn": None,
    }


def test_each_try_of_a_retried_action_is_its_own_effect_then_the_failure_routes() -> None:
    clock = FakeClock(0)
    tries: list[int] = []

    def call(ctx: object) -> None:
        tries.append(clock.now_ms())
        raise ConnectionError("down")

    workflow = define_workflow(
        name="t",
        start_at="call",
        nodes={
            "call": action(
                effect=idempotent_effect("svc"),
                run=call,
                retry=retry_policy(max_attempts=3, backoff_ms=100, max_backoff_ms=150),
            ),
            "recover": compute(lambda ctx: ctx.results["call"].attempt),
        },
        edges=[
            {"from": "call", "switch": {"on": "$result.outcome", "cases": {"failed": "recover"}}}
        ],
    )
    result, port = run_in_memory(workflow, None, clock=clock)
    assert (result.status, result.wake_at_ms) == (RunStatus.PARKED, 100)
    clock.set(100)
    assert resume(workflow, port, clock).wake_at_ms == 250  # type: ignore[attr-defined]  # 100 x 2, capped
    clock.set(250)
    done = resume(workflow, port, clock)
    assert (done.status, done.output) == (RunStatus.COMPLETED, 3)  # type: ignore[attr-defined]
    assert tries == [0, 100, 250]
    keys = {record.key for record in port.effects_of("dry-run")}
    assert len(keys) == 3, "every try reserved its own effect"
    failed = [m for m in port.messages if isinstance(m, NodeFailed)]
    assert [(m.attempt, m.retry_at_ms) for m in failed] == [(1, 100), (2, 250), (3, None)]
    assert [f.attempt for f in port.failures_of("dry-run")] == [1, 2, 3]


def test_retry_on_limits_what_is_retried_and_a_timeout_counts_as_timeout_error() -> None:
    clock = FakeClock(0)
    only_timeouts = retry_policy(max_attempts=5, backoff_ms=0, retry_on=TimeoutError)

    def wrong(ctx: object) -> None:
        raise KeyError("x")

    result, port = run_in_memory(chain(a=compute(wrong, retry=only_timeouts)), None, clock=clock)
    assert result.status is RunStatus.FAILED
    assert [m.retry_at_ms for m in port.messages if isinstance(m, NodeFailed)] == [None]

    def slow(ctx: object) -> None:
        ctx.signal.wait(5)  # type: ignore[attr-defined]

    timed = compute(
        slow, timeout_ms=20, retry=retry_policy(max_attempts=2, backoff_ms=0, retry_on=TimeoutError)
    )
    result, port = run_in_memory(chain(a=timed), None, clock=clock)
    assert result.status is RunStatus.TIMED_OUT
    failed = [m for m in port.messages if isinstance(m, NodeFailed)]
    assert [(m.attempt, m.retry_at_ms is not None) for m in failed] == [(1, True), (2, False)]


def test_a_crash_during_a_try_keeps_the_try_count_and_a_crash_retry_is_not_a_try() -> None:
    """A runner that dies mid-try: the next attempt is a crash retry of the same try, so the
    policy still allows exactly ``max_attempts`` tries."""
    clock = FakeClock(0)
    calls: list[int] = []

    class Crash(BaseException):
        pass

    def flaky(ctx: object) -> int:
        calls.append(ctx.attempt)  # type: ignore[attr-defined]
        if len(calls) == 2:
            raise Crash  # the runner dies during try 2
        raise ValueError("no")

    workflow = chain(a=compute(flaky, retry=retry_policy(max_attempts=3, backoff_ms=0)))
    port = MemoryPort()
    with pytest.raises(Crash):
        run_in_memory(workflow, None, clock=clock, port=port)
    saved = port.read_run("dry-run")
    assert saved is not None and saved.active is not None
    assert (saved.active.attempt, saved.active.failed_tries, saved.active.wake_at_ms) == (
        2,
        1,
        None,
    )
    result = resume(workflow, port, clock)
    assert result.status is RunStatus.FAILED  # type: ignore[attr-defined]
    assert calls == [1, 2, 3, 4]  # tries 1, 2 (crashed), 2 again (attempt 3), 3 (attempt 4)
    failed = [m for m in port.messages if isinstance(m, NodeFailed)]
    assert [(m.attempt, m.retry_at_ms is not None) for m in failed] == [
        (1, True),
        (3, True),
        (4, False),
    ]
