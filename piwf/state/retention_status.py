"""The automatic retention sweep's bookkeeping: one row, ``retention_state``, no payloads.

The helpers run inside the caller's transaction (a write one to record) and never commit.
"""

from __future__ import annotations

from dataclasses import dataclass

from piwf.state.database import Transaction


@dataclass(frozen=True)
class RetentionStatus:
    """The stored bookkeeping of the automatic sweep (no payloads)."""

    last_started_at: int | None
    last_completed_at: int | None
    last_trees_deleted: int
    last_runs_deleted: int
    last_trees_protected: int
    total_trees_deleted: int
    last_failure_at: int | None
    last_failure: str | None


def read_status(tx: Transaction) -> RetentionStatus:
    """Return the stored sweep bookkeeping (the row is created with the schema)."""
    row = tx.one(
        "SELECT last_started_at, last_completed_at, last_trees_deleted, last_runs_deleted,"
        " last_trees_protected, total_trees_deleted, last_failure_at, last_failure"
        " FROM retention_state WHERE id = 1"
    )
    assert row is not None, "retention_state has its row from the schema"
    return RetentionStatus(*tuple(row))


def record_sweep_started(tx: Transaction) -> None:
    """Note that an automatic sweep began now (``tx.now``)."""
    tx.execute("UPDATE retention_state SET last_started_at = ? WHERE id = 1", (tx.now,))


def record_trees_deleted(tx: Transaction, count: int) -> None:
    """Count ``count`` deleted trees in the running total (in their deletion's transaction)."""
    tx.execute(
        "UPDATE retention_state SET total_trees_deleted = total_trees_deleted + ? WHERE id = 1",
        (count,),
    )


def record_sweep_completed(tx: Transaction, *, trees: int, runs: int, protected: int) -> None:
    """Note a completed sweep and what it deleted; a completed sweep clears the last failure."""
    tx.execute(
        "UPDATE retention_state SET last_completed_at = ?, last_trees_deleted = ?,"
        " last_runs_deleted = ?, last_trees_protected = ?,"
        " last_failure_at = NULL, last_failure = NULL WHERE id = 1",
        (tx.now, trees, runs, protected),
    )


def record_sweep_failed(tx: Transaction, diagnostic: str) -> None:
    """Keep one bounded diagnostic of the last failure (the caller passes no payloads)."""
    text = diagnostic.strip()[:512] or "failed"
    tx.execute(
        "UPDATE retention_state SET last_failure_at = ?, last_failure = ? WHERE id = 1",
        (tx.now, text),
    )
