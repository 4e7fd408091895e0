"""Active time of node attempts (``state/execution/active_time.py``) on a real database."""

from __future__ import annotations

import sqlite3

import pytest

from piwf.clock import FakeClock
from piwf.state import StateDatabase
from piwf.state.execution import active_time
from piwf.workflow import agent, define_workflow
from piwf.workflow.engine import execute

from .test_execution_support import StorePort, command_for, compiled, create, launch, violations


def waiting_attempt(db: StateDatabase, run_id: str = "run-1") -> str:
    """Create a run whose agent visit committed its request; return that attempt's id."""
    workflow = compiled(
        define_workflow(
            name="ask",
            start_at="ask",
            nodes={"ask": agent(prompt="go", expected_output="{}")},
            edges=[],
        )
    )
    create(db, workflow, run_id)
    launched = launch(db)
    execute(command_for(launched), workflow, StorePort(db, launched))
    with db.read() as tx:
        attempt_id = tx.scalar("SELECT attempt_id FROM node_attempts WHERE run_id = ?", (run_id,))
    return str(attempt_id)


def test_only_open_intervals_grow_and_the_sum_is_the_active_time(
    db: StateDatabase, clock: FakeClock
) -> None:
    attempt = waiting_attempt(db)
    with db.write() as tx:
        assert active_time.open_interval(tx, attempt) == 1
    clock.advance(400)
    with db.write() as tx:
        assert active_time.close_interval(tx, attempt) is True
    clock.advance(10_000)  # waiting: not active
    with db.read() as tx:
        assert active_time.active_elapsed_ms(tx, attempt, clock.now_ms()) == 400
    with db.write() as tx:
        assert active_time.open_interval(tx, attempt) == 2
    clock.advance(250)
    with db.read() as tx:
        # An open interval counts up to the moment asked about.
        assert active_time.active_elapsed_ms(tx, attempt, clock.now_ms()) == 650
        assert active_time.active_elapsed_ms(tx, attempt, clock.now_ms() + 50) == 700
        [open_one] = active_time.open_intervals(tx)
    assert (open_one.attempt_id, open_one.run_id, open_one.interval_number) == (attempt, "run-1", 2)
    assert open_one.elapsed_before_ms == 400
    assert open_one.due_at(1_000) == open_one.started_at + 600
    assert open_one.due_at(300) == open_one.started_at  # already used up before it opened
    with db.write() as tx:
        active_time.close_interval(tx, attempt)
        assert active_time.close_interval(tx, attempt) is False  # nothing open any more
    with db.read() as tx:
        assert [i.elapsed_ms for i in active_time.intervals(tx, attempt)] == [400, 250]
        assert active_time.open_intervals(tx) == []
    assert violations(db) == []


def test_opening_twice_keeps_the_one_open_interval(db: StateDatabase, clock: FakeClock) -> None:
    attempt = waiting_attempt(db)
    with db.write() as tx:
        first = active_time.open_interval(tx, attempt)
    clock.advance(100)
    with db.write() as tx:
        assert active_time.open_interval(tx, attempt) == first
    with db.read() as tx:
        [interval] = active_time.intervals(tx, attempt)
    assert interval.started_at == clock.now_ms() - 100
    # The schema itself refuses a second open interval of one attempt.
    with pytest.raises(sqlite3.IntegrityError), db.write() as tx:
        tx.execute(
            "INSERT INTO attempt_active_intervals VALUES (?, 9, ?, ?, NULL, 0)",
            (attempt, clock.now_ms(), clock.now_ms()),
        )


def test_recovery_closes_at_the_last_observation_and_charges_no_downtime(
    db: StateDatabase, clock: FakeClock
) -> None:
    attempt = waiting_attempt(db)
    with db.write() as tx:
        active_time.open_interval(tx, attempt)
    clock.advance(300)
    with db.write() as tx:
        assert active_time.observe_run(tx, "run-1") == 1  # a claim renewal saw it working
    observed = clock.now_ms()
    clock.advance(60_000)  # the server is down
    with db.write() as tx:
        assert active_time.close_all_at_observed(tx) == 1
    with db.read() as tx:
        [interval] = active_time.intervals(tx, attempt)
        assert active_time.active_elapsed_ms(tx, attempt, clock.now_ms()) == 300
    assert (interval.ended_at, interval.elapsed_ms) == (observed, 300)


def test_a_clock_that_steps_back_never_shortens_an_interval(
    db: StateDatabase, clock: FakeClock
) -> None:
    attempt = waiting_attempt(db)
    with db.write() as tx:
        active_time.open_interval(tx, attempt)
    clock.advance(500)
    with db.write() as tx:
        active_time.observe_run(tx, "run-1")
    clock.set(clock.now_ms() - 400)
    with db.write() as tx:
        active_time.observe_run(tx, "run-1")
        active_time.close_interval(tx, attempt)
    with db.read() as tx:
        [interval] = active_time.intervals(tx, attempt)
        assert active_time.active_elapsed_ms(tx, attempt, clock.now_ms()) == 500
    assert interval.elapsed_ms == 500


def test_observing_one_run_leaves_other_runs_intervals_alone(
    db: StateDatabase, clock: FakeClock
) -> None:
    attempt = waiting_attempt(db, "run-1")
    with db.write() as tx:
        active_time.open_interval(tx, attempt)
    clock.advance(200)
    with db.write() as tx:
        assert active_time.observe_run(tx, "run-other") == 0
    with db.read() as tx:
        [interval] = active_time.intervals(tx, attempt)
    assert interval.observed_at == interval.started_at
