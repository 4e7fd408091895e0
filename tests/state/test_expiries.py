"""Active-time deadlines of agent requests (``state/execution/expiries.py``) on a real database.

The engine drives the real store through :class:`StorePort` (the server's own decode and apply
functions); intervals are opened and closed through ``active_time``, the functions the server's
agent calls use. The clock is a fake, so "time passes" is exact.
"""

from __future__ import annotations

from typing import Any

from piwf.clock import FakeClock
from piwf.lifecycle import Applied, Conflict, RunStatus
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.enums import ActorType, OwnerType, RunnerStatus
from piwf.state.execution import active_time, expiries, requests
from piwf.state.records import Actor, claim_resource
from piwf.workflow import agent, compute, define_workflow
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.engine import execute

from .test_execution_support import (
    LEASE_MS,
    OPERATOR,
    StorePort,
    attempts,
    command_for,
    compiled,
    create,
    dump,
    launch,
    queue_row,
    run_status,
    runner_of,
    violations,
)

POLICY = Actor(ActorType.POLICY, "server-a")
BUDGET_MS = 1_000


def ask_workflow(timeout_ms: Any = BUDGET_MS, *, routed: bool = False) -> CompiledWorkflow:
    """One agent step; ``routed`` adds a ``$result.outcome`` switch with a ``timed_out`` case."""
    nodes: dict[str, Any] = {
        "ask": agent(prompt="go", expected_output="{}", timeout_ms=timeout_ms),
    }
    edges: list[dict[str, Any]] = []
    if routed:
        nodes["late"] = compute(lambda ctx: {"late": True})
        edges = [
            {
                "from": "ask",
                "switch": {"on": "$result.outcome", "cases": {"timed_out": "late"}},
            }
        ]
    return compiled(define_workflow(name="ask", start_at="ask", nodes=nodes, edges=edges))


def waiting_request(db: StateDatabase, workflow: CompiledWorkflow, run_id: str = "run-1") -> str:
    """Run the workflow until its agent visit parks; return the request id."""
    create(db, workflow, run_id)
    run_to_exit(db, workflow)
    with db.read() as tx:
        found = tx.scalar("SELECT request_id FROM interactive_requests WHERE run_id = ?", (run_id,))
    return str(found)


def work(db: StateDatabase, clock: FakeClock, request_id: str, ms: int) -> None:
    """The agent works for ``ms`` (one interval opened, then closed)."""
    attempt = _attempt_of(db, request_id)
    with db.write() as tx:
        active_time.open_interval(tx, attempt)
    clock.advance(ms)
    with db.write() as tx:
        active_time.close_interval(tx, attempt)


def expire(db: StateDatabase, request_id: str) -> Applied[expiries.Expiry] | Conflict:
    with db.write() as tx:
        return expiries.expire_agent_request(
            tx, request_id, actor=POLICY, control_owner_id="server-a", lease_ms=LEASE_MS
        )


def deadline(db: StateDatabase, request_id: str) -> expiries.AgentDeadline | None:
    with db.read() as tx:
        return expiries.agent_deadline(tx, request_id)


def _attempt_of(db: StateDatabase, request_id: str) -> str:
    with db.read() as tx:
        request = requests.get_request(tx, request_id)
    assert request is not None
    return request.attempt_id


def run_to_exit(db: StateDatabase, workflow: CompiledWorkflow) -> None:
    """Launch the next run, execute its command, and record its runner's clean exit."""
    launched = launch(db)
    execute(command_for(launched), workflow, StorePort(db, launched))
    with db.write() as tx:
        ex.record_runner_exit(tx, runner_of(db, launched).runner_epoch, RunnerStatus.EXITED)


# conformance: I4
def test_waiting_never_counts_only_working_does(db: StateDatabase, clock: FakeClock) -> None:
    request_id = waiting_request(db, ask_workflow())
    clock.advance(3_600_000)  # an hour of waiting with no agent working
    found = deadline(db, request_id)
    assert found is not None
    assert (found.active_ms, found.remaining_ms, found.counting, found.due_at) == (
        0,
        BUDGET_MS,
        False,
        None,
    )
    assert isinstance(expire(db, request_id), Conflict)
    work(db, clock, request_id, 400)
    clock.advance(3_600_000)
    found = deadline(db, request_id)
    assert found is not None and (found.active_ms, found.remaining_ms) == (400, 600)
    with db.read() as tx:
        assert expiries.next_agent_deadline(tx) is None  # nothing is counting


def test_an_open_interval_counts_down_and_names_its_due_instant(
    db: StateDatabase, clock: FakeClock
) -> None:
    request_id = waiting_request(db, ask_workflow())
    work(db, clock, request_id, 300)
    with db.write() as tx:
        active_time.open_interval(tx, _attempt_of(db, request_id))
    opened = clock.now_ms()
    clock.advance(200)
    found = deadline(db, request_id)
    assert found is not None and found.counting
    assert (found.active_ms, found.remaining_ms) == (500, 500)
    assert found.due_at == opened + 700
    with db.read() as tx:
        assert expiries.next_agent_deadline(tx) == opened + 700


def test_a_due_request_expires_under_a_control_claim_and_the_run_times_out(
    db: StateDatabase, clock: FakeClock
) -> None:
    workflow = ask_workflow()
    request_id = waiting_request(db, workflow)
    work(db, clock, request_id, 999)
    assert isinstance(expire(db, request_id), Conflict)  # 1 ms left
    work(db, clock, request_id, 1)
    with db.read() as tx:
        generation = int(tx.scalar("SELECT generation FROM leases WHERE resource_id = 'run:run-1'"))
    result = expire(db, request_id)
    assert isinstance(result, Applied)
    assert (result.value.timeout_ms, result.value.active_ms) == (BUDGET_MS, BUDGET_MS)
    with db.read() as tx:
        request = requests.get_request(tx, request_id)
        lease = tx.one("SELECT owner_id, generation FROM leases WHERE resource_id = 'run:run-1'")
        event = tx.one("SELECT event_type, lease_generation FROM events ORDER BY rowid DESC")
    assert request is not None and request.answered_by is not None
    assert (request.status.value, request.answered_by.value) == ("answered", "expired")
    assert lease is not None and (lease[0], lease[1]) == (None, generation + 1)  # released
    assert event is not None and (event[0], event[1]) == ("interaction.expired", generation + 1)
    assert run_status(db, "run-1") == "running" and queue_row(db, "run-1") == ("parked", None)
    assert isinstance(expire(db, request_id), Conflict)  # no longer pending
    [(path, visit, attempt, status)] = attempts(db, "run-1")
    assert status == "waiting"
    attempt_id = _attempt_of(db, request_id)
    run_to_exit(db, workflow)
    # The same attempt (no new visit, no new attempt) records timed_out; no route: the run ends.
    assert attempts(db, "run-1") == [(path, visit, attempt, "timed_out")]
    with db.read() as tx:
        assert [row[0] for row in tx.all("SELECT attempt_id FROM node_attempts")] == [attempt_id]
    assert run_status(db, "run-1") == RunStatus.TIMED_OUT.value
    assert violations(db) == []


def test_a_timed_out_case_of_the_outcome_switch_is_followed(
    db: StateDatabase, clock: FakeClock
) -> None:
    workflow = ask_workflow(routed=True)
    request_id = waiting_request(db, workflow)
    work(db, clock, request_id, BUDGET_MS + 50)
    with db.write() as tx:
        expired = expiries.expire_due_agent_requests(
            tx, actor=POLICY, control_owner_id="server-a", lease_ms=LEASE_MS
        )
    assert [item.request_id for item in expired] == [request_id]
    run_to_exit(db, workflow)
    assert [row[0::3] for row in attempts(db, "run-1")] == [
        ("ask", "timed_out"),
        ("late", "completed"),
    ]
    assert run_status(db, "run-1") == "completed"


def test_a_paused_run_keeps_its_due_request_until_it_is_resumed(
    db: StateDatabase, clock: FakeClock
) -> None:
    request_id = waiting_request(db, ask_workflow())
    work(db, clock, request_id, BUDGET_MS)
    with db.write() as tx:
        paused = ex.pause_run(
            tx, "run-1", actor=OPERATOR, control_owner_id="ctl", lease_ms=LEASE_MS
        )
    assert isinstance(paused, Applied)
    before = dump(db)
    with db.write() as tx:
        assert (
            expiries.expire_due_agent_requests(
                tx, actor=POLICY, control_owner_id="server-a", lease_ms=LEASE_MS
            )
            == []
        )
    assert dump(db) == before  # a refused expiry writes nothing
    with db.write() as tx:
        assert isinstance(ex.resume_run(tx, "run-1", actor=OPERATOR), Applied)
    assert isinstance(expire(db, request_id), Applied)


def test_a_live_claim_is_never_taken_by_an_expiry(db: StateDatabase, clock: FakeClock) -> None:
    request_id = waiting_request(db, ask_workflow())
    work(db, clock, request_id, BUDGET_MS)
    with db.write() as tx:
        held = claim_resource(tx, "run:run-1", OwnerType.SERVER, "server-a", LEASE_MS)
    assert isinstance(held, Applied)
    before = dump(db)
    assert isinstance(expire(db, request_id), Conflict)
    assert dump(db) == before
    clock.advance(LEASE_MS)  # the holder is gone: its lease expired
    assert isinstance(expire(db, request_id), Applied)


def test_an_interval_left_open_by_a_vanished_agent_is_closed_by_the_expiry(
    db: StateDatabase, clock: FakeClock
) -> None:
    request_id = waiting_request(db, ask_workflow())
    attempt = _attempt_of(db, request_id)
    with db.write() as tx:
        active_time.open_interval(tx, attempt)
    clock.advance(BUDGET_MS)
    assert isinstance(expire(db, request_id), Applied)
    with db.read() as tx:
        [interval] = active_time.intervals(tx, attempt)
    assert (interval.ended_at, interval.elapsed_ms) == (clock.now_ms(), BUDGET_MS)


def test_no_deadline_and_computed_deadlines(db: StateDatabase, clock: FakeClock) -> None:
    none = waiting_request(db, ask_workflow(None), "run-none")
    work(db, clock, none, 10 * BUDGET_MS)
    assert deadline(db, none) is None
    assert isinstance(expire(db, none), Conflict)
    # A computed budget is resolved by the runner and committed with the request.
    computed = waiting_request(db, ask_workflow(lambda ctx: 2 * BUDGET_MS), "run-computed")
    with db.read() as tx:
        assert requests.get_request(tx, computed) is not None
        found = expiries.pending_agent_deadlines(tx)
    assert [(item.request_id, item.timeout_ms) for item in found] == [(computed, 2 * BUDGET_MS)]
