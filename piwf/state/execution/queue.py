"""The ``run_queue`` table: the one module that writes it, and the scheduler's queries over it.

A run's queue row says whether the scheduler may launch it (seed 001 run x queue table)::

    queued ─claim─▶ starting ─ready─▶ running ─park | runner exit─▶ parked ─claim─▶ starting
    any ─finish | cancel─▶ done | failed | cancelled

A parked row may carry a failure class (``error_code``) and its text; the blocking classes keep
it away from the scheduler until an explicit resume, and ``consecutive_errors`` counts a crash
streak that first backs the relaunch off and then blocks it. Queue facts are read through
:class:`~piwf.state.execution.runs.RunRow` (the run with its queue row); the queries here
answer the scheduler's questions (which run next, how many, is anything due).

Writers run inside the caller's one change and never commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import (
    BLOCKING_FAILURE_CLASSES,
    CRASH_LOOP_LIMIT,
    FailureClass,
    QueueStatus,
)

TERMINAL_QUEUE_STATUSES = frozenset({QueueStatus.DONE, QueueStatus.FAILED, QueueStatus.CANCELLED})

_INSERT_QUEUED = """
INSERT INTO run_queue (run_id, status, available_at, created_at, updated_at)
VALUES (?, 'queued', ?, ?, ?)
"""

_UPDATE = """
UPDATE run_queue
SET status = :status, error_code = :error_code, error_hash = :error_hash,
    finished_at = :finished_at, updated_at = :now,
    available_at = CASE WHEN :available_now THEN :now ELSE available_at END
WHERE run_id = :run_id
"""

_START = """
UPDATE run_queue
SET status = 'starting', error_code = NULL, error_hash = NULL, started_at = ?, updated_at = ?
WHERE run_id = ? AND status IN ('queued', 'parked')
"""

# Pause parks the queue row but keeps its error code and text: resume decides about those.
_PARK_KEEPING_ERROR = """
UPDATE run_queue SET status = 'parked', updated_at = ?
WHERE run_id = ? AND status IN ('queued', 'starting', 'running', 'parked')
"""

_COUNT_CRASH = "UPDATE run_queue SET consecutive_errors = consecutive_errors + 1 WHERE run_id = ?"

_CRASHES = "SELECT consecutive_errors FROM run_queue WHERE run_id = ?"

_DELAY = "UPDATE run_queue SET available_at = ? WHERE run_id = ?"

_SET_ERROR_TEXT = "UPDATE run_queue SET error_hash = ? WHERE run_id = ?"

_END_CRASH_STREAK = """
UPDATE run_queue SET consecutive_errors = 0 WHERE run_id = ? AND consecutive_errors > 0
"""

_SELECT_ERROR_TEXT = "SELECT error_hash FROM run_queue WHERE run_id = ?"

#: How much of a stored reason a run's projection (``run.get``) carries.
REASON_PREVIEW_CHARS = 2000

# Eligibility of a run for the scheduler, but for its due time; :blocking is a JSON array of
# blocking error codes and :exclude a JSON array of run ids the caller is already handling. A
# pending request waits for an answer, unless a headless agent command drives it (it has agent
# turns): then the run's next runner runs the command again.
_ELIGIBLE_FROM = """
FROM run_queue q
JOIN runs r ON r.run_id = q.run_id
LEFT JOIN leases l ON l.resource_id = r.resource_id
WHERE q.status IN ('queued', 'parked')
  AND r.paused = 0
  AND r.status IN ('queued', 'running')
  AND (q.error_code IS NULL OR q.error_code NOT IN (SELECT value FROM json_each(:blocking)))
  AND NOT (q.error_code = 'runnerCrashed' AND q.consecutive_errors >= :crash_limit)
  AND (l.owner_id IS NULL OR l.expires_at <= :now)
  AND NOT EXISTS (SELECT 1 FROM interactive_requests i
                  WHERE i.run_id = r.run_id AND i.status = 'pending'
                    AND NOT EXISTS (SELECT 1 FROM agent_turns t
                                    WHERE t.request_id = i.request_id))
  AND NOT EXISTS (SELECT 1 FROM effects e
                  WHERE e.source_resource_id = r.resource_id AND e.status = 'ambiguous')
  AND r.run_id NOT IN (SELECT value FROM json_each(:exclude))
"""

_RUNNABLE_FROM = _ELIGIBLE_FROM + "  AND q.available_at <= :now\n"

_SELECT_NEXT_RUNNABLE = (
    "SELECT q.run_id " + _RUNNABLE_FROM + " ORDER BY q.available_at, q.created_at, q.run_id LIMIT 1"
)

_COUNT_RUNNABLE = "SELECT count(*) " + _RUNNABLE_FROM

# The runnable runs the scheduler takes before :run_id (its own order), at most :most of them.
# Only constant SQL is joined here; values bind.
_COUNT_RUNNABLE_AHEAD = (
    "SELECT count(*) FROM (SELECT 1 "  # noqa: S608
    + _RUNNABLE_FROM
    + "  AND (q.available_at, q.created_at, q.run_id) <"
    " (SELECT available_at, created_at, run_id FROM run_queue WHERE run_id = :run_id)"
    " LIMIT :most)"
)

# Runs that will start by themselves, now or at a scheduled time: admitted or executing runs,
# and runs waiting out a back-off (eligible but for their due time).
_HAS_ADMITTED_RUN = """
SELECT EXISTS (SELECT 1 FROM run_queue WHERE status IN ('queued', 'starting', 'running'))
"""

_HAS_ELIGIBLE_RUN = "SELECT EXISTS (SELECT 1 " + _ELIGIBLE_FROM + ")"

_NEXT_DUE_AT = "SELECT min(q.available_at) " + _ELIGIBLE_FROM + "  AND q.available_at > :now\n"

_SELECT_EXPIRED_RUNNING = """
SELECT r.run_id, coalesce(l.generation, 0) AS generation,
       (SELECT w.runner_epoch FROM run_runners w WHERE w.run_id = r.run_id
        ORDER BY w.started_at DESC, w.rowid DESC LIMIT 1) AS runner_epoch
FROM run_queue q
JOIN runs r ON r.run_id = q.run_id
LEFT JOIN leases l ON l.resource_id = r.resource_id
WHERE q.status IN ('starting', 'running') AND r.status = 'running'
  AND (l.owner_id IS NULL OR l.expires_at <= :now)
ORDER BY q.available_at, q.created_at, r.run_id
"""

_SELECT_EXECUTING = """
SELECT run_id FROM run_queue WHERE status IN ('starting', 'running')
ORDER BY run_id LIMIT ?
"""

_BLOCKING = json.dumps(sorted(code.value for code in BLOCKING_FAILURE_CLASSES))


@dataclass(frozen=True)
class ExpiredRun:
    """A run still marked executing whose claim is absent or expired (its server is gone)."""

    run_id: str
    generation: int
    runner_epoch: str | None


# Writes (inside the caller's one change) ---------------------------------------------------


def insert_queued(tx: Transaction, run_id: str) -> None:
    """Insert the ``queued`` queue row of a new run, available now."""
    tx.execute(_INSERT_QUEUED, (run_id, tx.now, tx.now, tx.now))


def set_queue(
    tx: Transaction,
    run_id: str,
    status: QueueStatus,
    *,
    error_code: FailureClass | None = None,
    error_text: str | None = None,
    available_now: bool = False,
) -> None:
    """Move the run's queue row to ``status`` with this error (or none).

    A terminal queue status also sets ``finished_at``; ``available_now`` makes the row eligible
    for the scheduler from this instant.
    """
    error_hash = None if error_text is None else blobs.put_text(tx, error_text)
    finished_at = tx.now if status in TERMINAL_QUEUE_STATUSES else None
    tx.execute(
        _UPDATE,
        {
            "status": status.value,
            "error_code": None if error_code is None else error_code.value,
            "error_hash": error_hash,
            "finished_at": finished_at,
            "available_now": int(available_now),
            "now": tx.now,
            "run_id": run_id,
        },
    )


def mark_starting(tx: Transaction, run_id: str) -> None:
    """A ``queued`` or ``parked`` row becomes ``starting``; its previous error is cleared."""
    tx.execute(_START, (tx.now, tx.now, run_id))


def park_keeping_error(tx: Transaction, run_id: str) -> None:
    """Park a non-terminal row and keep its error code and text (a pause; resume decides)."""
    tx.execute(_PARK_KEEPING_ERROR, (tx.now, run_id))


def count_crash(tx: Transaction, run_id: str) -> int:
    """Count one more consecutive runner crash; return the streak."""
    tx.execute(_COUNT_CRASH, (run_id,))
    return int(tx.scalar(_CRASHES, (run_id,)))


def delay(tx: Transaction, run_id: str, available_at: int) -> None:
    """Keep the row away from the scheduler until ``available_at`` (a back-off)."""
    tx.execute(_DELAY, (available_at, run_id))


def set_error_text(tx: Transaction, run_id: str, text: str) -> None:
    """Replace the stored reason of the row's error (what happened, what to do)."""
    tx.execute(_SET_ERROR_TEXT, (blobs.put_text(tx, text), run_id))


def end_crash_streak(tx: Transaction, run_id: str) -> None:
    """Reset the consecutive-crash count (a node finished, or an operator resumed the run)."""
    tx.execute(_END_CRASH_STREAK, (run_id,))


# Reads -------------------------------------------------------------------------------------


def read_queue_reason(tx: Transaction, run_id: str) -> str | None:
    """Return the stored reason of the run's queue error (why it is parked), or None.

    The text names the broken rule, the crash count or the changed files; never a payload.
    A reason longer than :data:`REASON_PREVIEW_CHARS` is cut there and says how many characters
    follow; the run view carries the whole reason (by reference when it is large).
    """
    digest = reason_digest(tx, run_id)
    if digest is None:
        return None
    text = blobs.read_text(tx, digest)
    if len(text) <= REASON_PREVIEW_CHARS:
        return text
    more = len(text) - REASON_PREVIEW_CHARS
    return f"{text[:REASON_PREVIEW_CHARS]}… ({more} more characters: piwf run explain {run_id})"


def reason_digest(tx: Transaction, run_id: str) -> bytes | None:
    """Return the digest of the stored reason (a text blob the run owns), or None."""
    digest = tx.scalar(_SELECT_ERROR_TEXT, (run_id,))
    return None if digest is None else bytes(digest)


def next_runnable(tx: Transaction, exclude: tuple[str, ...] = ()) -> str | None:
    """Return the id of the next run the scheduler may claim now, or None.

    Eligible, ordered by ``available_at, created_at``: queue ``queued`` or ``parked`` and
    available now, not paused, run ``queued`` or ``running``, no blocking error code (nor a
    ``runnerCrashed`` streak of :data:`CRASH_LOOP_LIMIT`), lease free or expired, no pending
    request, no ambiguous effect, not in ``exclude``. Any transaction.
    """
    found = tx.scalar(_SELECT_NEXT_RUNNABLE, _eligibility(tx, exclude))
    return None if found is None else str(found)


def count_runnable(tx: Transaction) -> int:
    """Return how many runs :func:`next_runnable` could return now (any transaction)."""
    return int(tx.scalar(_COUNT_RUNNABLE, _eligibility(tx, ())))


def count_runnable_ahead(tx: Transaction, run_id: str, most: int) -> int:
    """Return how many runnable runs :func:`next_runnable` returns before ``run_id``, counting
    at most ``most`` of them (0 for a run not in the queue). Any transaction."""
    params = {**_eligibility(tx, ()), "run_id": run_id, "most": most}
    return int(tx.scalar(_COUNT_RUNNABLE_AHEAD, params))


def has_admitted_or_eligible_run(tx: Transaction) -> bool:
    """Whether a run is queued, starting or running, or eligible but for its due time."""
    return bool(tx.scalar(_HAS_ADMITTED_RUN)) or bool(
        tx.scalar(_HAS_ELIGIBLE_RUN, _eligibility(tx, ()))
    )


def next_due_at(tx: Transaction) -> int | None:
    """The earliest instant a run eligible but for its due time becomes runnable (a timer's
    wake time, a retry's back-off, a crash back-off), or None (any transaction)."""
    found = tx.scalar(_NEXT_DUE_AT, _eligibility(tx, ()))
    return None if found is None else int(found)


def executing_run_ids(tx: Transaction, limit: int) -> list[str]:
    """Up to ``limit`` runs whose queue row is ``starting`` or ``running`` (the runs holding
    execution slots), by run id."""
    return [str(row[0]) for row in tx.all(_SELECT_EXECUTING, (limit,))]


def expired_running_runs(tx: Transaction) -> list[ExpiredRun]:
    """Return runs marked starting/running whose claim is absent or expired, oldest first.

    Startup recovery closes their runner rows (``record_runner_exit``, e.g. ``orphaned``) and
    then calls :func:`~piwf.state.execution.recovery.recover_after_runner_exit` for each.
    Read-only; any transaction.
    """
    rows = tx.all(_SELECT_EXPIRED_RUNNING, {"now": tx.now})
    return [ExpiredRun(row["run_id"], row["generation"], row["runner_epoch"]) for row in rows]


def _eligibility(tx: Transaction, exclude: tuple[str, ...]) -> dict[str, object]:
    return {
        "now": tx.now,
        "blocking": _BLOCKING,
        "crash_limit": CRASH_LOOP_LIMIT,
        "exclude": json.dumps(list(exclude)),
    }
