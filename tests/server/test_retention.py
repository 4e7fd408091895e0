"""The automatic retention sweep in real server processes (piwf/server/maintenance.py).

Old trees are planted the honest way, once per module: real runs under a first server, which
is then stopped, and their ``finished_at`` moved 40 days back in the database while no server
runs (the sweep bookkeeping is reset too: that first server already completed its own sweep).
Each test starts from a copy of that state made with SQLite's backup API. Waits poll
conditions; the only timing knobs are fault-point delays that widen a window on purpose.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from piwf.state import StateDatabase
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import (
    FAST,
    HELLO,
    hold_until_gate,
    query,
    start,
    wait_run,
    write_workflow,
)

DAY_MS = 86_400_000
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "workflows"
CHECKPOINT = str(FIXTURES / "checkpoint_review.py")
#: Old runs carry a large input, so that deleting them frees a large share of the file.
PADDING = "x" * 100_000


@dataclass(frozen=True)
class OldState:
    """A stopped server's state file: five 40-day-old finished trees and one waiting run."""

    path: Path
    old: tuple[str, ...]
    waiting: str


@pytest.fixture(scope="module")
def old_state() -> Iterator[OldState]:
    root = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    planter = ServerFactory(root / "h")
    try:
        first = planter.start(env=FAST)
        assert first.ready["ok"] is True, first.ready
        with raw_client(first, "planter") as client:
            old = [start(client, HELLO, {"who": f"old{n}{PADDING}"}, f"old-{n}") for n in range(5)]
            for run_id in old:
                assert wait_run(client, run_id)["status"] == "completed"
            waiting = start(client, CHECKPOINT, {"steps": ["a"]}, "waiting")
            wait_for(lambda: run_status(client, waiting) == "waiting", timeout_s=30)
        assert first.terminate() == 0
        path = root / "h" / "state.sqlite"
        with StateDatabase(path) as db, db.write() as tx:
            tx.execute(
                "UPDATE runs SET finished_at = finished_at - ? WHERE finished_at IS NOT NULL",
                (40 * DAY_MS,),
            )
            tx.execute("UPDATE retention_state SET last_completed_at = NULL")
        yield OldState(path, tuple(old), waiting)
    finally:
        planter.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def restore(state: OldState, home: Path) -> None:
    """Put a copy of the old state into ``home`` (SQLite backup API, never a file copy)."""
    home.mkdir(mode=0o700)
    target = home / "state.sqlite"
    source = sqlite3.connect(f"file:{state.path}?mode=ro", uri=True)
    destination = sqlite3.connect(target)
    try:
        source.backup(destination)
    finally:
        destination.close()
        source.close()
    target.chmod(0o600)


def start_on_old_state(
    servers: ServerFactory, state: OldState, env: dict[str, str] | None = None
) -> ServerProcess:
    restore(state, servers.home)
    server = servers.start(env={**FAST, **(env or {})})
    assert server.ready["ok"] is True, server.ready
    return server


def run_ids(client: RawClient) -> set[str]:
    receipt = client.request("run.list", {"limit": 500}).receipt
    assert receipt is not None
    return {run["runId"] for run in receipt["runs"]}


def run_status(client: RawClient, run_id: str) -> str:
    receipt = client.request("run.get", run_id=run_id).receipt
    assert receipt is not None
    return str(receipt["run"]["status"])


def retention_status(client: RawClient) -> dict[str, Any]:
    receipt = client.request("state.status").receipt
    assert receipt is not None
    status: dict[str, Any] = receipt["retention"]
    return status


def verify(client: RawClient) -> dict[str, Any]:
    receipt = client.request("state.verify").receipt
    assert receipt is not None
    return receipt


def hits(log: Path, point: str) -> int:
    return log.read_text().count(f" {point} ") if log.exists() else 0


def test_expired_trees_go_after_startup_recovery_and_a_waiting_tree_stays(
    servers: ServerFactory, old_state: OldState
) -> None:
    server = start_on_old_state(servers, old_state)
    with raw_client(server) as client:
        wait_for(
            lambda: run_ids(client) == {old_state.waiting},
            timeout_s=30,
            what="the expired trees to go",
        )
        status = retention_status(client)
        assert status["lastCompletedAt"] > 0
        assert (status["lastTreesDeleted"], status["lastRunsDeleted"]) == (5, 5)
        assert status["totalTreesDeleted"] == 5
        assert status.get("lastFailure") is None
        assert verify(client) == {"valid": True, "violations": []}
        assert run_status(client, old_state.waiting) == "waiting"
    assert query(server, "SELECT count(*) FROM runs") == [(1,)]
    assert query(server, "SELECT count(*) FROM blobs WHERE length(content) > 100000") == [(0,)]


def test_a_restart_within_the_interval_does_not_sweep_again(
    servers: ServerFactory, old_state: OldState
) -> None:
    server = start_on_old_state(servers, old_state)
    with raw_client(server) as client:
        wait_for(lambda: run_ids(client) == {old_state.waiting}, timeout_s=30)
        completed_at = retention_status(client)["lastCompletedAt"]
    assert server.terminate() == 0
    again = servers.start(env=FAST)
    with raw_client(again) as client:
        fresh = start(client, HELLO, {"who": "new"}, "fresh")
        assert wait_run(client, fresh)["status"] == "completed"  # a runner exit: a request
        assert retention_status(client)["lastCompletedAt"] == completed_at


def test_a_sweep_stops_when_work_appears_and_the_runner_exit_resumes_it(
    servers: ServerFactory, old_state: OldState, tmp_path: Path
) -> None:
    old = set(old_state.old)
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    gated = write_workflow(
        tmp_path,
        "gated",
        f"""
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        workflow = define_workflow(
            name="gated", start_at="hold", edges=[],
            nodes={{"hold": compute(lambda ctx: wait_for_gate({str(entered)!r}, {str(gate)!r}))}},
        )
        """,
    )
    log = tmp_path / "faults.log"
    # Every tree deletion takes 0.3 s more, so the run start below lands mid-sweep.
    slow = {"PIWF_FAULTS": "retention.after_tree_delete@1+=delay:300", "PIWF_FAULTS_LOG": str(log)}
    server = start_on_old_state(servers, old_state, slow)
    with raw_client(server) as client:
        held = start(client, gated, {}, "gated")
        wait_for(entered.exists, timeout_s=30, what="the gated run to hold")
        during = run_ids(client) & old
        assert during, "the sweep stopped between trees once work appeared"
        assert hits(log, "retention.after_tree_delete") + len(during) == len(old)
        assert run_status(client, held) == "running"
        assert run_ids(client) & old == during, "nothing is deleted while the run works"
        gate.touch()
        assert wait_run(client, held)["status"] == "completed"
        wait_for(lambda: not run_ids(client) & old, timeout_s=30, what="the sweep to resume")
        assert run_ids(client) == {held, old_state.waiting}, "recent and waiting runs stay"
        done = wait_for(lambda: (s := retention_status(client)).get("lastCompletedAt") and s)
        assert done["lastTreesDeleted"] == 5
        assert verify(client) == {"valid": True, "violations": []}
    assert hits(log, "retention.after_tree_delete") == 5


def test_a_failing_sweep_is_recorded_retried_later_and_harms_nothing(
    servers: ServerFactory, old_state: OldState, tmp_path: Path
) -> None:
    log = tmp_path / "faults.log"
    failing = {
        "PIWF_FAULTS": "retention.after_tree_delete@1=raise",
        "PIWF_FAULTS_LOG": str(log),
        "PIWF_RETENTION_RETRY_S": "2",
    }
    server = start_on_old_state(servers, old_state, failing)
    with raw_client(server) as client:
        failed = wait_for(lambda: (s := retention_status(client)).get("lastFailure") and s)
        assert failed["lastFailure"].startswith("FaultInjectedError")
        assert hits(log, "retention.after_tree_delete") == 1
        assert len(run_ids(client) & set(old_state.old)) == 4, "the failure came after a commit"
        # The server serves and runs workflows while the sweep waits for its retry.
        fresh = start(client, HELLO, {"who": "new"}, "fresh")
        assert wait_run(client, fresh)["status"] == "completed"
        wait_for(lambda: run_ids(client) == {fresh, old_state.waiting}, timeout_s=30)
        done = wait_for(lambda: (s := retention_status(client)).get("lastCompletedAt") and s)
        retried_after_ms = done["lastStartedAt"] - failed["lastFailureAt"]
        assert retried_after_ms >= 2000, "the retry waited (no tight loop), runner exits too"
        assert done["totalTreesDeleted"] == 5
        assert done.get("lastFailure") is None, "a completed sweep clears the failure"
        assert verify(client) == {"valid": True, "violations": []}
    assert server.terminate() == 0
    log_text = (server.home / "server" / "server.log").read_text()
    assert log_text.count("retention: sweep failed") == 1
    assert PADDING[:100] not in log_text, "diagnostics carry no payloads"


def test_state_prune_backs_up_first_and_its_receipt_is_adopted_on_retry(
    servers: ServerFactory, old_state: OldState, tmp_path: Path
) -> None:
    # This server keeps 60 days, so its own sweep leaves the 40-day-old trees to the operator.
    server = start_on_old_state(servers, old_state, {"PIWF_RETENTION_DAYS": "60"})
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        before = int(tx.scalar("SELECT max(finished_at) FROM runs")) + 1
    with raw_client(server, "operator") as client:
        preview = client.request("state.prunePreview", {"before": before}).receipt
        assert preview is not None
        assert (preview["applied"], preview["treeCount"], preview["runCount"]) == (False, 5, 5)
        assert {tree["rootRunId"] for tree in preview["trees"]} == set(old_state.old)

        relative = client.request("state.prune", {"before": before, "backup": "b.sqlite"}, key="r")
        assert relative.outcome == "rejected" and relative.error is not None
        assert relative.error.code == "backupFailed"
        assert len(run_ids(client)) == 6, "a failed backup deletes nothing"

        payload = {"before": before, "backup": str(tmp_path / "before-prune.sqlite")}
        applied = client.request("state.prune", payload, key="p")
        assert applied.outcome == "accepted", applied
        assert applied.receipt is not None
        assert (applied.receipt["treeCount"], applied.receipt["applied"]) == (5, True)
        assert applied.receipt["backup"]["destination"] == payload["backup"]
        assert run_ids(client) == {old_state.waiting}

        retry = client.request("state.prune", payload, key="p")
        assert (retry.outcome, retry.receipt) == ("adopted", applied.receipt)
        other = client.request("state.prune", {**payload, "before": before - 1}, key="p")
        assert other.outcome == "conflict"
        assert verify(client) == {"valid": True, "violations": []}
    with StateDatabase(Path(payload["backup"]), mode="read-only") as backup, backup.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 6, "the backup was made before deleting"
