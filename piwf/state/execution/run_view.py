"""What the live run view reads about a run's steps, inside the caller's one read snapshot.

Read-only (nothing here writes or leaves a trace). The view (docs/OBSERVING.md) takes from here:

    steps       the finished visits in step order (``run_steps``), a page after a step index,
                each with its attempt row and the latest published updates of that attempt
    step count  how many finished steps the run has
    current     the unfinished attempt (``node_attempts``, at most one per run): the run's
                current node while it runs, the node it waits on while a request is pending

Tables read: ``run_steps`` and ``node_attempts`` (written by :mod:`attempts`) and
``workflow_updates`` (written by :mod:`updates`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from piwf.state.database import Transaction
from piwf.state.execution import attempts
from piwf.state.execution.attempts import AttemptRow

_SELECT_STEP_PAGE = """
SELECT s.step_index, a.attempt_id, a.run_id, a.node_path, a.visit, a.attempt_number,
       a.node_type, a.status, a.lease_generation, a.output_hash, a.error_hash, a.failure_hash,
       a.started_at, a.deadline_at, a.wake_at, a.finished_at
FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
WHERE s.run_id = ? AND s.step_index > ? ORDER BY s.step_index LIMIT ?
"""

_COUNT_STEPS = "SELECT count(*) FROM run_steps WHERE run_id = ?"

# The latest record of each (type, key) of one attempt, in publishing order.
_SELECT_UPDATES = """
SELECT attempt_id, update_type, update_key, update_seq, data_hash, recorded_at
FROM workflow_updates WHERE attempt_id IN ({marks}) ORDER BY attempt_id, update_seq
"""


@dataclass(frozen=True)
class PublishedUpdate:
    """The latest update an attempt published under one (type, key)."""

    update_type: str
    key: str
    seq: int
    data_hash: bytes
    recorded_at: int


@dataclass(frozen=True)
class StepRow:
    """One finished visit: its place in the run's step order and its attempt."""

    index: int
    attempt: AttemptRow
    updates: tuple[PublishedUpdate, ...]


def step_page(tx: Transaction, run_id: str, *, after: int, limit: int) -> list[StepRow]:
    """Up to ``limit`` finished steps with an index above ``after`` (-1: from the first), in
    step order, each with its attempt's latest updates."""
    rows = tx.all(_SELECT_STEP_PAGE, (run_id, after, limit))
    found = [(int(row["step_index"]), attempts.attempt_of_row(row)) for row in rows]
    updates = updates_of(tx, [attempt.attempt_id for _index, attempt in found])
    return [
        StepRow(index, attempt, tuple(updates.get(attempt.attempt_id, ())))
        for index, attempt in found
    ]


def step_count(tx: Transaction, run_id: str) -> int:
    """How many finished steps the run has."""
    return int(tx.scalar(_COUNT_STEPS, (run_id,)) or 0)


def current_attempt(tx: Transaction, run_id: str) -> AttemptRow | None:
    """The run's unfinished attempt (pending, running or waiting), if any."""
    return attempts.active_attempt(tx, run_id)


def updates_of(tx: Transaction, attempt_ids: Sequence[str]) -> dict[str, list[PublishedUpdate]]:
    """The latest updates of each attempt in ``attempt_ids``, in publishing order."""
    if not attempt_ids:
        return {}
    marks = ", ".join("?" for _ in attempt_ids)
    found: dict[str, list[PublishedUpdate]] = {}
    for row in tx.all(_SELECT_UPDATES.format(marks=marks), tuple(attempt_ids)):
        found.setdefault(row["attempt_id"], []).append(
            PublishedUpdate(
                update_type=row["update_type"],
                key=row["update_key"],
                seq=int(row["update_seq"]),
                data_hash=bytes(row["data_hash"]),
                recorded_at=int(row["recorded_at"]),
            )
        )
    return found
