"""Resource-runner rows: one per reconcile process, a supervision record and audit.

A row is written before the spawn (``starting``), gets the pid and start identity once the
process exists, becomes ``running`` when the child reported ``ready`` (with the SHA-256 of the
manager file it loaded) and is closed with one outcome (``exited``, ``timedOut``, ``crashed``,
``claimLost``, ``orphaned``). ``result`` records what the reconcile's result did. Writing a
row never changes the resource version; at most one row per resource is live. The one module
that writes ``managed_resource_runners``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import ReconcileOutcome, ResourceRunnerStatus
from piwf.state.leases import Claim, renew_claim

#: What every reconcile id (the key of a runner row, and its log's name) starts with.
RECONCILE_ID_PREFIX = "reconcile-"

_INSERT_RUNNER = """
INSERT INTO managed_resource_runners (reconcile_id, resource_id, uid, claim_generation,
    server_epoch, resource_version, resource_generation, queue_version, deadline_at, status,
    started_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'starting', ?)
"""

_SET_PROCESS = """
UPDATE managed_resource_runners SET pid = ?, process_start_identity = ?
WHERE reconcile_id = ? AND pid IS NULL AND status IN ('starting', 'running')
"""

_SET_RUNNING = """
UPDATE managed_resource_runners SET status = 'running', source_digest = ?
WHERE reconcile_id = ? AND status = 'starting'
"""

_CLOSE = """
UPDATE managed_resource_runners SET status = ?, finished_at = ?, exit_code = ?, signal = ?
WHERE reconcile_id = ? AND status IN ('starting', 'running')
"""

_SET_ERROR = "UPDATE managed_resource_runners SET error_hash = ? WHERE reconcile_id = ?"

_SET_RESULT = "UPDATE managed_resource_runners SET result = ? WHERE reconcile_id = ?"

_SELECT_RUNNER = """
SELECT reconcile_id, resource_id, uid, claim_generation, server_epoch, resource_version,
       resource_generation, queue_version, deadline_at, pid, process_start_identity, status,
       result, started_at, finished_at
FROM managed_resource_runners
"""


@dataclass(frozen=True)
class RunnerRow:
    """One ``managed_resource_runners`` row."""

    reconcile_id: str
    resource_id: str
    uid: str
    claim_generation: int
    server_epoch: int
    resource_version: int
    resource_generation: int
    queue_version: int
    deadline_at: int
    pid: int | None
    process_start_identity: str | None
    status: ResourceRunnerStatus
    result: ReconcileOutcome | None
    started_at: int
    finished_at: int | None


def insert_runner(
    tx: Transaction,
    *,
    reconcile_id: str,
    resource_id: str,
    uid: str,
    claim_generation: int,
    server_epoch: int,
    resource_version: int,
    resource_generation: int,
    queue_version: int,
    deadline_at: int,
) -> None:
    """Insert a ``starting`` row (the caller renewed the claim in this transaction)."""
    tx.execute(
        _INSERT_RUNNER,
        (
            reconcile_id,
            resource_id,
            uid,
            claim_generation,
            server_epoch,
            resource_version,
            resource_generation,
            queue_version,
            deadline_at,
            tx.now,
        ),
    )


def record_reconcile_process(
    tx: Transaction, claim: Claim, reconcile_id: str, pid: int, identity: str, *, lease_ms: int
) -> Claim:
    """Record the spawned process's pid and start identity under the live claim, once, while
    the runner is live (its pid may come after its ``ready``)."""
    claim = renew_claim(tx, claim, lease_ms)
    tx.execute(_SET_PROCESS, (pid, identity, reconcile_id))
    return claim


def mark_reconcile_running(
    tx: Transaction, claim: Claim, reconcile_id: str, source_digest: str, *, lease_ms: int
) -> Claim:
    """The runner loaded its manager (``ready``): record the source it runs, mark it running."""
    claim = renew_claim(tx, claim, lease_ms)
    tx.execute(_SET_RUNNING, (source_digest, reconcile_id))
    return claim


def get_runner(tx: Transaction, reconcile_id: str) -> RunnerRow | None:
    """One runner row, or None."""
    row = tx.one(_SELECT_RUNNER + " WHERE reconcile_id = ?", (reconcile_id,))
    return None if row is None else _runner(row)


def list_runners(tx: Transaction, resource_id: str, limit: int = 10) -> list[RunnerRow]:
    """The latest runner rows of one resource, newest first."""
    rows = tx.all(
        _SELECT_RUNNER + " WHERE resource_id = ? ORDER BY started_at DESC, reconcile_id LIMIT ?",
        (resource_id, limit),
    )
    return [_runner(row) for row in rows]


def count_runners(tx: Transaction, resource_id: str) -> int:
    """How many runner rows (reconciles) the resource has had."""
    return int(
        tx.scalar(
            "SELECT count(*) FROM managed_resource_runners WHERE resource_id = ?", (resource_id,)
        )
    )


def record_reconcile_exit(
    tx: Transaction,
    reconcile_id: str,
    status: ResourceRunnerStatus,
    *,
    exit_code: int | None = None,
    signal: str | None = None,
) -> bool:
    """Close a live runner row with its one outcome; False when it was already closed.

    A supervision record: needs no claim and changes no resource version.
    """
    cursor = tx.execute(_CLOSE, (status.value, tx.now, exit_code, signal, reconcile_id))
    return cursor.rowcount == 1


def record_error(tx: Transaction, reconcile_id: str, error: str) -> None:
    """Keep why a reconcile failed (text blob, cut to 4000 characters) on its runner row."""
    tx.execute(_SET_ERROR, (blobs.put_text(tx, error[:4000]), reconcile_id))


def record_result(tx: Transaction, reconcile_id: str, outcome: ReconcileOutcome) -> None:
    """Record what the reconcile's result did (its one outcome) on its runner row."""
    tx.execute(_SET_RESULT, (outcome.value, reconcile_id))


def orphaned_runners(tx: Transaction, epoch: int) -> list[RunnerRow]:
    """Runner rows still live from servers older than ``epoch``."""
    rows = tx.all(
        _SELECT_RUNNER + " WHERE status IN ('starting', 'running') AND server_epoch < ?"
        " ORDER BY started_at",
        (epoch,),
    )
    return [_runner(row) for row in rows]


def live_runner(tx: Transaction, reconcile_id: str, claim: Claim) -> RunnerRow:
    """The open row of this claim's reconcile; ``LookupError`` when it has a result already,
    belongs to another claim generation or does not exist."""
    runner = get_runner(tx, reconcile_id)
    if (
        runner is None
        or runner.resource_id != claim.resource_id
        or runner.claim_generation != claim.generation
        or runner.result is not None
    ):
        raise LookupError(f"reconcile {reconcile_id} is not open under this claim")
    return runner


def _runner(row: sqlite3.Row) -> RunnerRow:
    return RunnerRow(
        reconcile_id=row["reconcile_id"],
        resource_id=row["resource_id"],
        uid=row["uid"],
        claim_generation=row["claim_generation"],
        server_epoch=row["server_epoch"],
        resource_version=row["resource_version"],
        resource_generation=row["resource_generation"],
        queue_version=row["queue_version"],
        deadline_at=row["deadline_at"],
        pid=row["pid"],
        process_start_identity=row["process_start_identity"],
        status=ResourceRunnerStatus(row["status"]),
        result=None if row["result"] is None else ReconcileOutcome(row["result"]),
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )
