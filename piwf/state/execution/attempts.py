"""Node attempts (``node_attempts``) and a run's step order (``run_steps``): their one writer.

One attempt per (run, node path, visit, attempt number), with a deterministic id; at most one
attempt of a run is unfinished (a partial unique index holds it)::

    running ─request | timer─▶ waiting ─┐
       │                                ├─finish─▶ completed | failed | timed_out | cancelled
       └────────────────────────────────┘                                        (+ a step)
    running ─crash retry─▶ interrupted (the next attempt of the same visit opens)
    running ─a retry policy's failed try─▶ failed (no step); the next attempt opens
                                           pending until its wake time, then runs

``wake_at`` is a timer visit's committed wake time, or when a pending try may start (it is
cleared when that try starts, so a crash retry of it is an ordinary one).

Every finished visit appends one ``run_steps`` row, so the steps replay in order. A failed,
timed-out or cancelled attempt may keep its failure record (``failure_hash``: the canonical JSON
of a :class:`~piwf.workflow.failure.NodeFailure`, bounded by the engine). Writers run inside the
caller's one change and never commit; their ``WHERE`` clause states the state they expect.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import AttemptStatus
from piwf.workflow import identity, port_codec
from piwf.workflow.context import Outcome
from piwf.workflow.failure import AttemptFailure, NodeFailure

_FAILED_OUTCOMES = {
    AttemptStatus.FAILED: Outcome.FAILED,
    AttemptStatus.TIMED_OUT: Outcome.TIMED_OUT,
    AttemptStatus.CANCELLED: Outcome.CANCELLED,
}

#: The columns :func:`attempt_of_row` reads; queries append their own WHERE clause.
_SELECT_ATTEMPT = """
SELECT attempt_id, run_id, node_path, visit, attempt_number, node_type, status,
       lease_generation, output_hash, error_hash, failure_hash, started_at, deadline_at,
       wake_at, finished_at
FROM node_attempts
"""

_SELECT_ONE = _SELECT_ATTEMPT + " WHERE attempt_id = ?"

_SELECT_ACTIVE = (
    _SELECT_ATTEMPT + " WHERE run_id = ? AND status IN ('pending', 'running', 'waiting')"
)

_SELECT_STEPS = """
SELECT a.attempt_id, a.run_id, a.node_path, a.visit, a.attempt_number, a.node_type, a.status,
       a.lease_generation, a.output_hash, a.error_hash, a.failure_hash, a.started_at,
       a.deadline_at, a.wake_at, a.finished_at
FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
WHERE s.run_id = ? ORDER BY s.step_index
"""

# A range of steps with the byte length of each step's stored output and error (read from the
# blob rows' length column, so no value is loaded), for pages bounded by size.
_SELECT_STEP_RANGE = """
SELECT a.attempt_id, a.run_id, a.node_path, a.visit, a.attempt_number, a.node_type, a.status,
       a.lease_generation, a.output_hash, a.error_hash, a.failure_hash, a.started_at,
       a.deadline_at, a.wake_at, a.finished_at,
       coalesce(o.byte_length, 0) + coalesce(e.byte_length, 0) AS value_bytes
FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
LEFT JOIN blobs o ON o.blob_hash = a.output_hash
LEFT JOIN blobs e ON e.blob_hash = a.error_hash
WHERE s.run_id = :run_id AND s.step_index >= :start AND s.step_index < :stop
ORDER BY s.step_index LIMIT :limit
"""

_COUNT_STEPS = "SELECT count(*) FROM run_steps WHERE run_id = ?"

_SELECT_FAILED_STEPS = """
SELECT a.node_path, a.visit, a.attempt_number, a.status, a.failure_hash
FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
WHERE s.run_id = ? AND a.failure_hash IS NOT NULL ORDER BY s.step_index
"""

_SELECT_LAST_STEP_FAILURE = """
SELECT a.node_path, a.visit, a.attempt_number, a.status, a.failure_hash
FROM run_steps s JOIN node_attempts a ON a.attempt_id = s.attempt_id
WHERE s.run_id = ? ORDER BY s.step_index DESC LIMIT 1
"""

_COUNT = "SELECT count(*) FROM node_attempts WHERE run_id = ?"

_SELECT_VISITS = """
SELECT node_path, max(visit) AS visit FROM node_attempts WHERE run_id = ? GROUP BY node_path
"""

_SELECT_LAST_VISIT = """
SELECT coalesce(max(visit), 0) FROM node_attempts WHERE run_id = ? AND node_path = ?
"""

_INSERT = """
INSERT INTO node_attempts (attempt_id, run_id, node_path, visit, attempt_number, node_type,
                           status, lease_generation, started_at, deadline_at, wake_at,
                           created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

_START_PENDING = """
UPDATE node_attempts
SET status = 'running', started_at = ?, deadline_at = ?, wake_at = NULL,
    lease_generation = ?, updated_at = ?
WHERE attempt_id = ? AND status = 'pending'
"""

_COUNT_FAILED_TRIES = """
SELECT count(*) FROM node_attempts
WHERE run_id = ? AND node_path = ? AND visit = ? AND status IN ('failed', 'timed_out')
"""

_SELECT_FAILED_TRIES = (
    _SELECT_ATTEMPT
    + """ WHERE run_id = ? AND node_path = ? AND visit = ? AND attempt_number < ?
  AND status IN ('failed', 'timed_out') ORDER BY attempt_number"""
)

_FAIL_TRY = """
UPDATE node_attempts
SET status = ?, error_hash = ?, failure_hash = ?, finished_at = ?, updated_at = ?
WHERE attempt_id = ? AND status IN ('pending', 'running')
"""

_INTERRUPT = """
UPDATE node_attempts SET status = 'interrupted', finished_at = ?, updated_at = ?
WHERE attempt_id = ? AND status IN ('pending', 'running')
"""

_SET_WAITING = """
UPDATE node_attempts SET status = 'waiting', updated_at = ?
WHERE attempt_id = ? AND status IN ('pending', 'running')
"""

_CLOSE = """
UPDATE node_attempts
SET status = ?, output_hash = ?, error_hash = ?, failure_hash = ?, finished_at = ?, updated_at = ?
WHERE attempt_id = ? AND status IN ('pending', 'running', 'waiting')
"""

_CLOSE_ACTIVE = """
UPDATE node_attempts SET status = ?, finished_at = ?, updated_at = ?
WHERE run_id = ? AND status IN ('pending', 'running', 'waiting')
"""

_APPEND_STEP = """
INSERT INTO run_steps (run_id, step_index, attempt_id)
VALUES (?, (SELECT coalesce(max(step_index) + 1, 0) FROM run_steps WHERE run_id = ?), ?)
"""

# One attempt of another run's finished visit, as it is, under the copy's id; generation 1 is
# the copying run's first claim, so no attempt names a generation its own lease never reached.
_COPY_ATTEMPT = """
INSERT INTO node_attempts (attempt_id, run_id, node_path, visit, attempt_number, node_type,
                           status, lease_generation, prompt_hash, output_hash, receipt_hash,
                           error_hash, failure_hash, started_at, deadline_at, wake_at,
                           finished_at, created_at, updated_at)
SELECT :copy, :run, node_path, visit, attempt_number, node_type, status, 1, prompt_hash,
       output_hash, receipt_hash, error_hash, failure_hash, started_at, deadline_at, wake_at,
       finished_at, created_at, updated_at
FROM node_attempts
WHERE run_id = :source AND node_path = :path AND visit = :visit AND attempt_number = :number
"""


@dataclass(frozen=True)
class AttemptRow:
    """One ``node_attempts`` row."""

    attempt_id: str
    run_id: str
    path: str
    visit: int
    attempt: int
    node_type: str
    status: AttemptStatus
    lease_generation: int
    output_hash: bytes | None
    error_hash: bytes | None
    failure_hash: bytes | None
    started_at: int | None
    deadline_at: int | None
    finished_at: int | None
    wake_at: int | None = None


def attempt_id_for(run_id: str, path: str, visit: int, attempt: int) -> str:
    """Return the deterministic id of one attempt of one node visit (the engine's identity)."""
    return identity.attempt_id(run_id, path, visit, attempt)


# Reads -------------------------------------------------------------------------------------


def get_attempt(tx: Transaction, attempt_id: str) -> AttemptRow | None:
    """Return one attempt by its id, or None when there is none."""
    row = tx.one(_SELECT_ONE, (attempt_id,))
    return None if row is None else attempt_of_row(row)


def active_attempt(tx: Transaction, run_id: str) -> AttemptRow | None:
    """Return the run's one unfinished attempt (pending, running or waiting), or None."""
    row = tx.one(_SELECT_ACTIVE, (run_id,))
    return None if row is None else attempt_of_row(row)


def running_attempt(tx: Transaction, run_id: str) -> AttemptRow | None:
    """Return the run's unfinished attempt when it is executing (not waiting on a request)."""
    active = active_attempt(tx, run_id)
    if active is None or active.status is AttemptStatus.WAITING:
        return None
    return active


def attempt_count(tx: Transaction, run_id: str) -> int:
    """Return how many node attempts the run has (0 means nothing has executed)."""
    return int(tx.scalar(_COUNT, (run_id,)))


def last_visit(tx: Transaction, run_id: str, path: str) -> int:
    """Return the highest visit number of ``path`` in the run (0 before its first visit)."""
    return int(tx.scalar(_SELECT_LAST_VISIT, (run_id, path)))


def visits_by_path(tx: Transaction, run_id: str) -> dict[str, int]:
    """Return the highest visit number of every node path the run has visited."""
    return {row["node_path"]: row["visit"] for row in tx.all(_SELECT_VISITS, (run_id,))}


def failed_tries(tx: Transaction, run_id: str, path: str, visit: int) -> int:
    """How many tries of an unfinished visit a retry policy saw fail (its failed attempts)."""
    return int(tx.scalar(_COUNT_FAILED_TRIES, (run_id, path, visit)))


def earlier_failed_tries(tx: Transaction, attempt: AttemptRow) -> list[AttemptRow]:
    """The tries of ``attempt``'s visit that failed before it and were retried by a policy,
    in order (a finished visit's own failure is its step, never one of these)."""
    values = (attempt.run_id, attempt.path, attempt.visit, attempt.attempt)
    return [attempt_of_row(row) for row in tx.all(_SELECT_FAILED_TRIES, values)]


def list_steps(tx: Transaction, run_id: str) -> list[AttemptRow]:
    """Return the attempts that finished the run's visits, in step order."""
    return [attempt_of_row(row) for row in tx.all(_SELECT_STEPS, (run_id,))]


def step_count(tx: Transaction, run_id: str) -> int:
    """Return how many steps (finished visits) the run has; their indexes are 0..count-1."""
    return int(tx.scalar(_COUNT_STEPS, (run_id,)))


def list_step_range(
    tx: Transaction, run_id: str, start: int, stop: int, limit: int
) -> list[tuple[AttemptRow, int]]:
    """Return at most ``limit`` steps of indexes ``start``..``stop - 1`` in step order, each
    with the byte length of its stored output and error (the values are not read)."""
    values = {"run_id": run_id, "start": start, "stop": stop, "limit": limit}
    rows = tx.all(_SELECT_STEP_RANGE, values)
    return [(attempt_of_row(row), int(row["value_bytes"])) for row in rows]


def list_failures(tx: Transaction, run_id: str) -> list[AttemptFailure]:
    """Return the failure records of the run's finished visits, in step order."""
    return [_failure(tx, row) for row in tx.all(_SELECT_FAILED_STEPS, (run_id,))]


def last_step_failure(tx: Transaction, run_id: str) -> AttemptFailure | None:
    """Return the failure record of the run's last finished visit; None when that visit
    completed, kept no record, or the run has no step.

    A run that ended ``failed``, ``timed_out`` or ``cancelled`` because a node did ends on that
    node's visit, so this is the record of the node that ended it.
    """
    row = tx.one(_SELECT_LAST_STEP_FAILURE, (run_id,))
    if row is None or row["failure_hash"] is None:
        return None
    return _failure(tx, row)


def failure_of_attempt(tx: Transaction, attempt: AttemptRow) -> AttemptFailure | None:
    """Return the failure record ``attempt`` kept; None when it kept none (it completed, was
    interrupted, or failed before records existed)."""
    outcome = _FAILED_OUTCOMES.get(attempt.status)
    if attempt.failure_hash is None or outcome is None:
        return None
    return AttemptFailure(
        path=attempt.path,
        visit=attempt.visit,
        attempt=attempt.attempt,
        outcome=outcome,
        failure=read_failure(tx, attempt.failure_hash),
    )


# Writes (inside the caller's one change) ---------------------------------------------------


def open_attempt(
    tx: Transaction,
    *,
    run_id: str,
    path: str,
    visit: int,
    attempt: int,
    node_type: str,
    lease_generation: int,
    started_at: int | None,
    deadline_at: int | None,
    wake_at: int | None = None,
    pending: bool = False,
) -> str:
    """Insert a ``running`` attempt (``pending``: a try that waits until ``wake_at``) and
    return its id."""
    attempt_id = attempt_id_for(run_id, path, visit, attempt)
    status = AttemptStatus.PENDING if pending else AttemptStatus.RUNNING
    tx.execute(
        _INSERT,
        (
            attempt_id,
            run_id,
            path,
            visit,
            attempt,
            node_type,
            status.value,
            lease_generation,
            started_at,
            deadline_at,
            wake_at,
            tx.now,
            tx.now,
        ),
    )
    return attempt_id


def start_pending(
    tx: Transaction,
    attempt: AttemptRow,
    *,
    started_at: int,
    deadline_at: int | None,
    lease_generation: int,
) -> None:
    """A pending try starts running (its wake time is cleared)."""
    values = (started_at, deadline_at, lease_generation, tx.now, attempt.attempt_id)
    tx.execute(_START_PENDING, values)


def fail_try(
    tx: Transaction,
    attempt: AttemptRow,
    status: AttemptStatus,
    *,
    finished_at: int,
    error_hash: bytes,
    failure_hash: bytes | None,
) -> None:
    """Close a try a retry policy runs again: ``status`` with its error, and no step (the
    visit stays open under the next attempt)."""
    values = (status.value, error_hash, failure_hash, finished_at, tx.now, attempt.attempt_id)
    tx.execute(_FAIL_TRY, values)


def interrupt(tx: Transaction, attempt_id: str) -> None:
    """Close a pending or running attempt ``interrupted`` (a crash retry opens the next one)."""
    tx.execute(_INTERRUPT, (tx.now, tx.now, attempt_id))


def set_waiting(tx: Transaction, attempt_id: str) -> None:
    """A pending or running attempt waits on its request."""
    tx.execute(_SET_WAITING, (tx.now, attempt_id))


def finish_attempt(
    tx: Transaction,
    attempt: AttemptRow,
    status: AttemptStatus,
    *,
    finished_at: int,
    output_hash: bytes | None = None,
    error_hash: bytes | None = None,
    failure_hash: bytes | None = None,
) -> None:
    """Close an unfinished attempt with ``status`` and append its step to the run's order.

    ``failure_hash`` names the stored failure record of a failed, timed-out or cancelled
    attempt (the table's CHECK refuses it for any other status).
    """
    values = (status.value, output_hash, error_hash, failure_hash, finished_at, tx.now)
    tx.execute(_CLOSE, (*values, attempt.attempt_id))
    tx.execute(_APPEND_STEP, (attempt.run_id, attempt.run_id, attempt.attempt_id))


def close_active(tx: Transaction, run_id: str, status: AttemptStatus) -> None:
    """Close the run's unfinished attempt (if any) with ``status``; no step is appended."""
    tx.execute(_CLOSE_ACTIVE, (status.value, tx.now, tx.now, run_id))


def copy_finished_visit(tx: Transaction, step: AttemptRow, run_id: str) -> None:
    """Copy the visit another run's ``step`` finished into ``run_id`` and append its step: every
    attempt of the visit (earlier tries first) with its status, blobs and times, under
    ``run_id``'s attempt ids (a fork's copied steps, :mod:`piwf.state.execution.forks`)."""
    visit = {"source": step.run_id, "path": step.path, "visit": step.visit, "run": run_id}
    for number in range(1, step.attempt + 1):
        copy = attempt_id_for(run_id, step.path, step.visit, number)
        tx.execute(_COPY_ATTEMPT, {**visit, "number": number, "copy": copy})
    finished = attempt_id_for(run_id, step.path, step.visit, step.attempt)
    tx.execute(_APPEND_STEP, (run_id, run_id, finished))


def attempt_of_row(row: sqlite3.Row) -> AttemptRow:
    """The attempt of a row that has every column of ``_SELECT_ATTEMPT`` (any query may add
    more)."""
    return AttemptRow(
        attempt_id=row["attempt_id"],
        run_id=row["run_id"],
        path=row["node_path"],
        visit=row["visit"],
        attempt=row["attempt_number"],
        node_type=row["node_type"],
        status=AttemptStatus(row["status"]),
        lease_generation=row["lease_generation"],
        output_hash=_optional_bytes(row["output_hash"]),
        error_hash=_optional_bytes(row["error_hash"]),
        failure_hash=_optional_bytes(row["failure_hash"]),
        started_at=row["started_at"],
        deadline_at=row["deadline_at"],
        finished_at=row["finished_at"],
        wake_at=row["wake_at"],
    )


def _failure(tx: Transaction, row: sqlite3.Row) -> AttemptFailure:
    return AttemptFailure(
        path=row["node_path"],
        visit=row["visit"],
        attempt=row["attempt_number"],
        outcome=_FAILED_OUTCOMES[AttemptStatus(row["status"])],
        failure=read_failure(tx, bytes(row["failure_hash"])),
    )


def store_failure(tx: Transaction, failure: NodeFailure) -> bytes:
    """Store ``failure`` as a canonical JSON blob and return its hash (inside the change)."""
    return blobs.put_json(tx, port_codec.to_json(failure))


def read_failure(tx: Transaction, failure_hash: bytes) -> NodeFailure:
    """Read the failure record stored under ``failure_hash``.

    Raises :class:`~piwf.workflow.port_codec.PortCodecError` when the blob does not have a
    record's shape (only a damaged database holds one).
    """
    return port_codec.from_json(NodeFailure, blobs.read_json(tx, failure_hash))


def _optional_bytes(value: bytes | None) -> bytes | None:
    return None if value is None else bytes(value)
