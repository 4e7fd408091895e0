"""``state verify`` invariants: each planted violation in a copy of a real database is reported
with its stable code, and nothing else is.

The source database is produced by the real engine driving the real execution store: one run
completed through a compute node and an idempotent action, one run still queued.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from piwf.clock import FakeClock
from piwf.state import StateDatabase
from piwf.state.backup import backup_database
from piwf.state.diagnostics import _LIVE_RUN_COUNTS, find_violations, server_counts
from piwf.workflow import action, compute, define_workflow, idempotent_effect
from piwf.workflow.port import RunStatus
from tests.state.test_execution_support import compiled, create, run_once

WORKFLOW = compiled(
    define_workflow(
        name="plant",
        start_at="plan",
        nodes={
            "plan": compute(lambda ctx: {"target": "preview"}),
            "deploy": action(
                effect=idempotent_effect("preview.deploy"),
                run=lambda ctx: {"deployed": ctx.outputs["plan"]["target"]},
            ),
        },
        edges=[{"from": "plan", "to": "deploy"}],
    )
)

FINISHED_ATTEMPT = "SELECT attempt_id FROM node_attempts WHERE run_id = 'run-1' LIMIT 1"

#: code → the statements that plant exactly that violation.
PLANTS: dict[str, list[str]] = {
    "queueRow": ["DELETE FROM run_queue WHERE run_id = 'run-2'"],
    "queueState": ["UPDATE run_queue SET status = 'running' WHERE run_id = 'run-2'"],
    "activeAttempt": [
        f"UPDATE node_attempts SET status = 'waiting', finished_at = NULL"
        f" WHERE attempt_id = ({FINISHED_ATTEMPT})"
    ],
    "settledRunEffect": ["UPDATE effects SET status = 'pending', settled_at = NULL"],
    "attemptGeneration": [
        f"UPDATE node_attempts SET lease_generation = 99 WHERE attempt_id = ({FINISHED_ATTEMPT})"
    ],
    "effectGeneration": [
        "INSERT INTO effect_attempts (effect_id, attempt_number, owner_id, lease_generation,"
        " started_at, finished_at, outcome) SELECT effect_id, attempt_number + 1, owner_id,"
        " lease_generation, started_at, started_at, 'interrupted' FROM effect_attempts",
        "UPDATE effects SET attempt_count = attempt_count + 1",
    ],
    "waitingRequest": [
        "UPDATE runs SET status = 'waiting' WHERE run_id = 'run-2'",
        "UPDATE run_queue SET status = 'parked' WHERE run_id = 'run-2'",
    ],
}


@pytest.fixture
def produced(db: StateDatabase, tmp_path: Path) -> Path:
    """A sound database with a completed run (with an effect) and a queued one, as a copy."""
    create(db, WORKFLOW, "run-1")
    _, _, result = run_once(db, WORKFLOW)
    assert result.status is RunStatus.COMPLETED
    create(db, WORKFLOW, "run-2")
    copy = tmp_path / "copies" / "state.sqlite"
    copy.parent.mkdir(mode=0o700)
    backup_database(db, copy)
    return copy


def test_the_produced_database_is_sound(produced: Path, clock: FakeClock) -> None:
    with StateDatabase(produced, mode="read-only", clock=clock) as copy, copy.read() as tx:
        assert tx.scalar("SELECT count(*) FROM effects WHERE status = 'applied'") == 1
        assert find_violations(tx) == []


@pytest.mark.parametrize("code", sorted(PLANTS))
def test_a_planted_violation_is_reported_with_its_code(
    produced: Path, clock: FakeClock, code: str
) -> None:
    with StateDatabase(produced, clock=clock) as copy:
        with copy.write() as tx:
            for statement in PLANTS[code]:
                assert tx.execute(statement).rowcount >= 1, statement
        with copy.read() as tx:
            violations = find_violations(tx)
    assert {violation.code for violation in violations} == {code}
    assert all("{" not in violation.detail for violation in violations)  # ids, never payloads


def test_server_counts_are_the_live_counts(produced: Path, clock: FakeClock) -> None:
    with StateDatabase(produced, clock=clock) as copy:
        with copy.write() as tx:
            tx.execute("UPDATE runs SET paused = 1 WHERE run_id = 'run-2'")
        with copy.read() as tx:
            counts = server_counts(tx)
            plan = tx.all("EXPLAIN QUERY PLAN " + _LIVE_RUN_COUNTS)
    assert counts == {
        "queued": 1,
        "running": 0,
        "waiting": 0,
        "paused": 1,
        "expiredLeases": 0,
        "pendingRequests": 0,
        "ambiguousEffects": 0,
    }
    assert "runs_status_idx" in " ".join(str(row[3]) for row in plan), "no scan of history"
