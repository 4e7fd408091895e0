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
from piwf.state.diagnostics import _LIVE_QUEUE_ROWS, find_violations, server_counts
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
            plan = tx.all("EXPLAIN QUERY PLAN " + _LIVE_QUEUE_ROWS, {"crash_limit": 5})
    assert counts == {
        "queued": 1,
        "running": 0,
        "waiting": 0,
        "parked": 0,
        "paused": 1,
        "expiredLeases": 0,
        "pendingRequests": 0,
        "ambiguousEffects": 0,
    }
    assert "run_queue_claim_idx" in " ".join(str(row[3]) for row in plan), "no scan of history"


#: A parked queue row (run-2, run status ``running``) → where server.status counts it.
PARKED_CASES = {
    "resumable": ("NULL", 0, 0, "queued"),
    "backing off after a crash": ("'runnerCrashed'", 2, 0, "queued"),
    "crash loop": ("'runnerCrashed'", 5, 0, "parked:runnerCrashed"),
    "no progress": ("'runnerNoProgress'", 0, 0, "parked:runnerNoProgress"),
    "source changed": ("'sourceChanged'", 0, 0, "parked:sourceChanged"),
    "effect ambiguous": ("'effectAmbiguous'", 0, 0, "parked:effectAmbiguous"),
    "protocol rejected": ("'protocolRejected'", 0, 0, "parked:protocolRejected"),
    "paused": ("NULL", 0, 1, "parked:paused"),
}


@pytest.mark.parametrize("case", sorted(PARKED_CASES))
def test_server_counts_put_a_parked_run_where_it_belongs(
    produced: Path, clock: FakeClock, case: str
) -> None:
    error_code, crashes, paused, expected = PARKED_CASES[case]
    with StateDatabase(produced, clock=clock) as copy:
        with copy.write() as tx:
            tx.execute(
                f"UPDATE runs SET status = 'running', paused = {paused} WHERE run_id = 'run-2'"
            )
            tx.execute(
                f"UPDATE run_queue SET status = 'parked', error_code = {error_code},"
                f" consecutive_errors = {crashes} WHERE run_id = 'run-2'"
            )
        with copy.read() as tx:
            counts = server_counts(tx)
    assert counts[expected] == 1
    assert counts["running"] == 0, "a parked run is not running"
    assert counts["parked"] == (1 if expected.startswith("parked:") else 0)
    assert counts["paused"] == paused
