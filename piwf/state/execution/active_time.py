"""Active time of node attempts (``attempt_active_intervals``): the one module that writes it.

An attempt's active time is what its deadline counts (an agent's ``timeout_ms``): only the
time its agent was working (a headless agent command ran), never delivery, waiting, pause or
server downtime. It is the sum of the attempt's intervals; at most one is open::

    open_interval          the agent started working (``process.register``): a new interval,
                           started_at = observed_at = now
    observe_run            the server still sees it working (every claim renewal of the run):
                           observed_at = now
    close_interval         it stopped working while this server watched (``process.unregister``,
                           the runner ended, its group was reaped): ended_at = now
    close_all_at_observed  startup recovery: every interval left open by a dead server ends at
                           its observed_at, so the downtime is never charged

Reads for deadline enforcement (the server decides what to do; this module only counts):

- :func:`active_elapsed_ms` (``tx``, attempt, ``now_ms``): the attempt's active time so far;
  an open interval counts up to ``now_ms`` (its agent is working under this server now).
- :func:`open_intervals`: every open interval with the active time its attempt had before it,
  so a deadline of ``timeout_ms`` falls due at :meth:`OpenInterval.due_at` unless the interval
  closes first. A closed attempt's active time no longer grows, so only open intervals can
  fall due.

Times are the transaction's ``tx.now`` (the injected clock). A clock that steps backwards
never shortens an interval: ``observed_at`` and ``ended_at`` only move forward. Writers run
inside the caller's transaction and never commit.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from piwf.state.database import Transaction

_INSERT = """
INSERT INTO attempt_active_intervals (attempt_id, interval_number, started_at, observed_at,
                                      ended_at, elapsed_ms)
SELECT :attempt, coalesce(max(interval_number), 0) + 1, :now, :now, NULL, 0
FROM attempt_active_intervals WHERE attempt_id = :attempt
"""

_SELECT_OPEN_NUMBER = """
SELECT interval_number FROM attempt_active_intervals WHERE attempt_id = ? AND ended_at IS NULL
"""

# The SET expressions all read the old row, so elapsed_ms matches the new observed_at.
_OBSERVE_RUN = """
UPDATE attempt_active_intervals
SET observed_at = max(observed_at, :now), elapsed_ms = max(observed_at, :now) - started_at
WHERE ended_at IS NULL
  AND attempt_id IN (SELECT attempt_id FROM node_attempts WHERE run_id = :run)
"""

_CLOSE = """
UPDATE attempt_active_intervals
SET observed_at = max(observed_at, :now), ended_at = max(observed_at, :now),
    elapsed_ms = max(observed_at, :now) - started_at
WHERE attempt_id = :attempt AND ended_at IS NULL
"""

_CLOSE_ALL_AT_OBSERVED = """
UPDATE attempt_active_intervals SET ended_at = observed_at, elapsed_ms = observed_at - started_at
WHERE ended_at IS NULL
"""

_SELECT_INTERVALS = """
SELECT attempt_id, interval_number, started_at, observed_at, ended_at, elapsed_ms
FROM attempt_active_intervals WHERE attempt_id = ? ORDER BY interval_number
"""

_SELECT_ELAPSED = """
SELECT coalesce(sum(CASE WHEN ended_at IS NULL
                         THEN max(observed_at, :now) - started_at
                         ELSE elapsed_ms END), 0)
FROM attempt_active_intervals WHERE attempt_id = :attempt
"""

_SELECT_OPEN = """
SELECT o.attempt_id, a.run_id, o.interval_number, o.started_at, o.observed_at,
       (SELECT coalesce(sum(c.elapsed_ms), 0) FROM attempt_active_intervals c
        WHERE c.attempt_id = o.attempt_id AND c.ended_at IS NOT NULL) AS elapsed_before_ms
FROM attempt_active_intervals o JOIN node_attempts a ON a.attempt_id = o.attempt_id
WHERE o.ended_at IS NULL
ORDER BY o.started_at, o.attempt_id
"""


@dataclass(frozen=True)
class ActiveInterval:
    """One interval of an attempt's active time; ``ended_at`` is None while it is open."""

    attempt_id: str
    interval_number: int
    started_at: int
    observed_at: int
    ended_at: int | None
    elapsed_ms: int


@dataclass(frozen=True)
class OpenInterval:
    """An open interval, with the active time its attempt had before it began."""

    attempt_id: str
    run_id: str
    interval_number: int
    started_at: int
    observed_at: int
    elapsed_before_ms: int

    def due_at(self, timeout_ms: int) -> int:
        """When the attempt's active time reaches ``timeout_ms`` if the interval stays open
        (already past when the attempt used it up in earlier intervals)."""
        return self.started_at + max(0, timeout_ms - self.elapsed_before_ms)


# Reads -----------------------------------------------------------------------------------


def active_elapsed_ms(tx: Transaction, attempt_id: str, now_ms: int) -> int:
    """Return the attempt's active time in ms: every closed interval, and an open one up to
    ``now_ms`` (never less than its ``observed_at``). 0 for an attempt with no interval."""
    return int(tx.scalar(_SELECT_ELAPSED, {"attempt": attempt_id, "now": now_ms}))


def intervals(tx: Transaction, attempt_id: str) -> list[ActiveInterval]:
    """Return the attempt's intervals, oldest first."""
    return [_interval(row) for row in tx.all(_SELECT_INTERVALS, (attempt_id,))]


def open_intervals(tx: Transaction) -> list[OpenInterval]:
    """Return every open interval (at most one per attempt), oldest first."""
    return [
        OpenInterval(
            attempt_id=row["attempt_id"],
            run_id=row["run_id"],
            interval_number=row["interval_number"],
            started_at=row["started_at"],
            observed_at=row["observed_at"],
            elapsed_before_ms=row["elapsed_before_ms"],
        )
        for row in tx.all(_SELECT_OPEN)
    ]


# Writes (inside the caller's one change) -------------------------------------------------


def open_interval(tx: Transaction, attempt_id: str) -> int:
    """Open the attempt's next interval at ``tx.now`` and return its number; an interval that
    is already open stays as it is and its number is returned (a repeat changes nothing)."""
    current = tx.scalar(_SELECT_OPEN_NUMBER, (attempt_id,))
    if current is not None:
        return int(current)
    tx.execute(_INSERT, {"attempt": attempt_id, "now": tx.now})
    return int(tx.scalar(_SELECT_OPEN_NUMBER, (attempt_id,)))


def observe_run(tx: Transaction, run_id: str) -> int:
    """Move ``observed_at`` of the run's open intervals to ``tx.now``; return how many."""
    return tx.execute(_OBSERVE_RUN, {"run": run_id, "now": tx.now}).rowcount


def close_interval(tx: Transaction, attempt_id: str) -> bool:
    """Close the attempt's open interval at ``tx.now``; False when none was open."""
    return tx.execute(_CLOSE, {"attempt": attempt_id, "now": tx.now}).rowcount > 0


def close_all_at_observed(tx: Transaction) -> int:
    """Close every open interval at its own ``observed_at`` (startup recovery: their server
    is gone, and the time since it last saw them is not charged); return how many."""
    return tx.execute(_CLOSE_ALL_AT_OBSERVED).rowcount


def _interval(row: sqlite3.Row) -> ActiveInterval:
    return ActiveInterval(
        attempt_id=row["attempt_id"],
        interval_number=row["interval_number"],
        started_at=row["started_at"],
        observed_at=row["observed_at"],
        ended_at=row["ended_at"],
        elapsed_ms=row["elapsed_ms"],
    )
