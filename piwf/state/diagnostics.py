"""Read-only state diagnostics: privacy-safe counts and invariant checks. Nothing here repairs.

:func:`status_counts` returns numbers only: no run, actor or session ids, paths, payloads or
tokens. :func:`find_violations` runs SQLite's own checks plus domain invariants, each reported
with a stable code:

==================  ============================================================
code                meaning
==================  ============================================================
integrity           the file is damaged: ``PRAGMA integrity_check`` reported a problem, or
                    SQLite could not read the file at all (malformed, not a database)
foreignKey          ``PRAGMA foreign_key_check`` found a dangling reference
queueRow            a run has no queue row
queueState          run status and queue status disagree (seed 001 "Run lifecycle" table)
terminalLease       a terminal run still has a live lease owner
effectAttempt       an effect's open attempt does not match its status
eventRevisions      an aggregate's events are not exactly revisions 1..revision
waitingRequest      a ``waiting`` run has no open (pending or answered) request
openRequest         an open request belongs to a finished attempt or a terminal run
decisionWinner      a decision's resolution and its winning submission disagree
decisionRequest     an open request and its decision's resolution disagree
activeAttempt       a terminal run still has an active (pending/running/waiting) attempt
settledRunEffect    a terminal run still has a ``pending`` or ``applying`` effect
attemptGeneration   an attempt was written by a generation newer than its run's claim
effectGeneration    one generation started an effect more than once (a blind retry)
resource*           managed-resource invariants (``resources/diagnostics.py``)
==================  ============================================================

On a damaged file only ``integrity`` violations are reported: the domain invariants read the
damaged pages, so their answers would mean nothing. Damage is never raised as an exception
(``find_violations`` of a damaged database returns its ``integrity`` violations); a locked or
busy database still raises.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.errors import StateCorruptError, StateError
from piwf.lifecycle import RunStatus
from piwf.state.database import StateDatabase, Transaction
from piwf.state.enums import BLOCKING_FAILURE_CLASSES, CRASH_LOOP_LIMIT, QueueStatus
from piwf.state.resources.diagnostics import resource_violations


@dataclass(frozen=True)
class Violation:
    """One broken invariant; ``detail`` names ids only, never payloads."""

    code: str
    detail: str

    def to_json(self) -> dict[str, JsonValue]:
        """Return the wire form."""
        return {"code": self.code, "detail": self.detail}


# Every live (non-terminal) queue row with its run's facts, through the queue status index. A
# finished run is never counted, whatever its queue row says (terminal facts win; a queue row
# that disagrees is a violation for `find_violations` to report, not a live run).
_LIVE_QUEUE_ROWS = """
SELECT q.status AS queue_status, r.status AS run_status, r.paused AS paused,
       q.error_code AS error_code,
       (q.error_code = 'runnerCrashed' AND q.consecutive_errors >= :crash_limit) AS crash_loop,
       count(*) AS number
FROM run_queue q JOIN runs r ON r.run_id = q.run_id
WHERE q.status IN ('queued', 'starting', 'running', 'parked')
  AND r.status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
GROUP BY 1, 2, 3, 4, 5
"""

#: The reasons a parked run needs an operator, as ``server.status`` names them.
_BLOCKING_CODES = frozenset(code.value for code in BLOCKING_FAILURE_CLASSES)


def server_counts(tx: Transaction) -> dict[str, int]:
    """Return the live counts ``server.status`` shows, through indexes only.

    Every non-terminal run is counted once, in the first that applies:

    - ``waiting``: it waits for an answer (a pending request), paused or not;
    - ``running``: a runner is starting or executing it;
    - ``parked:<reason>``: it is stopped and needs an operator: ``paused``, or a blocking
      failure class (``runnerNoProgress``, ``sourceChanged``, ``effectAmbiguous``,
      ``protocolRejected``, or ``runnerCrashed`` once its crash streak blocks relaunching);
    - ``queued``: it will start by itself (admitted, or parked resumable, maybe after a
      back-off).

    ``paused`` counts paused runs whatever their state. Unlike :func:`status_counts` it never
    scans terminal history (events, blobs, finished runs), so its cost stays flat as the
    database grows.
    """
    counts = {"queued": 0, "running": 0, "waiting": 0, "paused": 0}
    parked: dict[str, int] = {}
    for row in tx.all(_LIVE_QUEUE_ROWS, {"crash_limit": CRASH_LOOP_LIMIT}):
        number = int(row["number"])
        counts["paused"] += number if row["paused"] else 0
        reason = _parked_reason(row)
        if row["run_status"] == RunStatus.WAITING.value:
            counts["waiting"] += number
        elif row["queue_status"] in (QueueStatus.STARTING.value, QueueStatus.RUNNING.value):
            counts["running"] += number
        elif reason is not None:
            parked[reason] = parked.get(reason, 0) + number
        else:
            counts["queued"] += number
    counts.update({f"parked:{reason}": number for reason, number in parked.items()})
    counts["parked"] = sum(parked.values())
    counts["expiredLeases"] = tx.scalar(
        "SELECT count(*) FROM leases WHERE expires_at <= ? AND owner_id IS NOT NULL", (tx.now,)
    )
    counts["pendingRequests"] = tx.scalar(
        "SELECT count(*) FROM interactive_requests WHERE status = 'pending'"
    )
    counts["ambiguousEffects"] = tx.scalar(
        "SELECT count(*) FROM effects WHERE status = 'ambiguous'"
    )
    return counts


def _parked_reason(row: sqlite3.Row) -> str | None:
    """Why a parked row needs an operator, or None when it will start by itself."""
    if row["queue_status"] != QueueStatus.PARKED.value:
        return None
    if row["error_code"] in _BLOCKING_CODES or row["crash_loop"]:
        return str(row["error_code"])
    if row["paused"]:
        return "paused"
    return None


def status_counts(tx: Transaction) -> dict[str, JsonValue]:
    """Return safe counts of runs, queue rows, leases and effects."""
    runs: dict[str, JsonValue] = {status.value: 0 for status in RunStatus}
    for row in tx.all("SELECT status, count(*) FROM runs GROUP BY status"):
        runs[row[0]] = row[1]
    queue: dict[str, JsonValue] = {status.value: 0 for status in QueueStatus}
    for row in tx.all("SELECT status, count(*) FROM run_queue GROUP BY status"):
        queue[row[0]] = row[1]
    return {
        "runs": runs,
        "queue": queue,
        # A finished run is never paused (``runs.finish`` clears the flag); the status filter
        # keeps this count equal to ``server_counts``'s, which sees unfinished runs only.
        "pausedRuns": tx.scalar(
            "SELECT count(*) FROM runs WHERE paused = 1"
            " AND status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')"
        ),
        "activeLeases": tx.scalar(
            "SELECT count(*) FROM leases WHERE owner_id IS NOT NULL AND expires_at > ?",
            (tx.now,),
        ),
        "expiredLeases": tx.scalar(
            "SELECT count(*) FROM leases WHERE owner_id IS NOT NULL AND expires_at <= ?",
            (tx.now,),
        ),
        "unsettledEffects": tx.scalar(
            "SELECT count(*) FROM effects WHERE status IN ('pending', 'applying', 'ambiguous')"
        ),
        "ambiguousEffects": tx.scalar("SELECT count(*) FROM effects WHERE status = 'ambiguous'"),
        "pendingRequests": tx.scalar(
            "SELECT count(*) FROM interactive_requests WHERE status = 'pending'"
        ),
        "events": tx.scalar("SELECT count(*) FROM events"),
        "blobs": tx.scalar("SELECT count(*) FROM blobs"),
        "databaseBytes": tx.scalar(
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"
        ),
    }


_QUEUE_ROW = """
SELECT r.run_id FROM runs r WHERE NOT EXISTS (SELECT 1 FROM run_queue q WHERE q.run_id = r.run_id)
"""

# The run and queue projections of seed 001's lifecycle table: every pair not listed there.
_QUEUE_STATE = """
SELECT r.run_id FROM runs r JOIN run_queue q ON q.run_id = r.run_id
WHERE NOT (
      (r.status = 'queued' AND q.status = 'queued')
   OR (r.status = 'running' AND q.status IN ('starting', 'running', 'parked'))
   OR (r.status = 'waiting' AND q.status = 'parked')
   OR (r.status = 'completed' AND q.status = 'done')
   OR (r.status IN ('failed', 'timed_out') AND q.status = 'failed')
   OR (r.status = 'cancelled' AND q.status = 'cancelled'))
"""

_ACTIVE_ATTEMPT = """
SELECT a.attempt_id FROM node_attempts a JOIN runs r ON r.run_id = a.run_id
WHERE a.status IN ('pending', 'running', 'waiting')
  AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
"""

_SETTLED_RUN_EFFECT = """
SELECT e.effect_id FROM effects e JOIN runs r ON r.resource_id = e.source_resource_id
WHERE e.status IN ('pending', 'applying')
  AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
"""

# Fencing: no attempt may carry a generation its run's claim never reached.
_ATTEMPT_GENERATION = """
SELECT a.attempt_id FROM node_attempts a
JOIN runs r ON r.run_id = a.run_id
JOIN leases l ON l.resource_id = r.resource_id
WHERE a.lease_generation > l.generation
"""

_TERMINAL_LEASE = """
SELECT r.run_id FROM runs r JOIN leases l ON l.resource_id = r.resource_id
WHERE r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
  AND l.owner_id IS NOT NULL AND l.expires_at > ?
"""

_EFFECT_ATTEMPT = """
SELECT e.effect_id FROM effects e
WHERE (e.status = 'applying') != EXISTS (
        SELECT 1 FROM effect_attempts a WHERE a.effect_id = e.effect_id AND a.finished_at IS NULL)
   OR e.attempt_count != (SELECT count(*) FROM effect_attempts a WHERE a.effect_id = e.effect_id)
"""

_EVENT_REVISIONS = """
SELECT res.resource_id FROM resources res
LEFT JOIN (SELECT resource_id, count(*) AS n, max(resource_revision) AS top,
                  min(resource_revision) AS bottom
           FROM events GROUP BY resource_id) ev ON ev.resource_id = res.resource_id
WHERE coalesce(ev.n, 0) != res.revision
   OR (res.revision > 0 AND (ev.top != res.revision OR ev.bottom != 1))
"""


# A resolution is made by exactly one winning submission, and a winning submission always has
# its resolution.
_DECISION_WINNER = """
SELECT d.decision_id FROM human_decisions d
WHERE EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)
   != ((SELECT count(*) FROM human_decision_submissions s
        WHERE s.decision_id = d.decision_id AND s.outcome = 'won') = 1)
"""

# An answered or settled request has a winner; a pending one has none.
_DECISION_REQUEST = """
SELECT d.decision_id FROM human_decisions d
JOIN interactive_requests i ON i.request_id = d.decision_id
WHERE (i.status IN ('answered', 'settled', 'pending'))
  AND (i.status = 'pending')
      = EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)
"""


_WAITING_REQUEST = """
SELECT r.run_id FROM runs r
WHERE r.status = 'waiting' AND NOT EXISTS (
  SELECT 1 FROM interactive_requests i
  WHERE i.run_id = r.run_id AND i.status IN ('pending', 'answered'))
"""

_OPEN_REQUEST = """
SELECT i.request_id FROM interactive_requests i
JOIN node_attempts a ON a.attempt_id = i.attempt_id
JOIN runs r ON r.run_id = i.run_id
WHERE i.status IN ('pending', 'answered')
  AND (a.finished_at IS NOT NULL OR r.finished_at IS NOT NULL)
"""


_EFFECT_GENERATION = """
SELECT effect_id FROM effect_attempts GROUP BY effect_id, lease_generation HAVING count(*) > 1
"""


#: SQLite's primary result codes that mean the bytes are not a sound database.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
#: Their messages, for interpreters whose sqlite3 errors carry no code (Python 3.10).
_DAMAGE_MESSAGES = ("malformed", "not a database", "corrupt")


def is_damage(error: sqlite3.DatabaseError) -> bool:
    """Return whether ``error`` means the file is damaged (corrupt, or not a database at all),
    as opposed to locked, busy, read-only or an I/O failure."""
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    return any(text in str(error) for text in _DAMAGE_MESSAGES)


def damage_violation(error: sqlite3.DatabaseError | StateCorruptError) -> Violation:
    """Return the ``integrity`` violation for damage SQLite could not read through."""
    said = error.sqlite_message if isinstance(error, StateCorruptError) else None
    return Violation("integrity", f"SQLite cannot read the file: {said or error}")


def integrity_violations(tx: Transaction) -> list[Violation]:
    """Return what ``PRAGMA integrity_check`` finds (at most its 100 rows); damage so deep that
    the check itself fails is one violation too. Empty for a sound file."""
    try:
        rows = tx.all("PRAGMA integrity_check")
    except StateCorruptError as error:
        return [damage_violation(error)]
    except sqlite3.DatabaseError as error:
        if not is_damage(error):
            raise
        return [damage_violation(error)]
    return [Violation("integrity", str(row[0])) for row in rows if row[0] != "ok"]


def find_violations(tx: Transaction) -> list[Violation]:
    """Return every broken invariant (empty for a sound database).

    A damaged file gives its ``integrity`` violations only (see the module docstring); errors
    other than damage (a lock held past ``busy_timeout``, say) propagate.
    """
    damaged = integrity_violations(tx)
    if damaged:
        return damaged
    try:
        return _invariant_violations(tx)
    except StateCorruptError as error:
        return [damage_violation(error)]
    except sqlite3.DatabaseError as error:
        if not is_damage(error):
            raise
        return [damage_violation(error)]


def verify_database(db: StateDatabase) -> list[Violation]:
    """Run :func:`find_violations` in a read snapshot of its own and return what it found.

    SQLite reports damage met inside a transaction once more when that transaction ends, even
    a read; once damage is found, that repeat is expected and dropped, so the caller gets the
    ``integrity`` violations rather than an exception. Anything else propagates.
    """
    found: list[Violation] = []
    try:
        with db.read() as tx:
            found = find_violations(tx)
    except (sqlite3.DatabaseError, StateError):
        if not any(violation.code == "integrity" for violation in found):
            raise
    return found


def _invariant_violations(tx: Transaction) -> list[Violation]:
    found: list[Violation] = []
    for row in tx.all("PRAGMA foreign_key_check"):
        found.append(Violation("foreignKey", f"{row[0]} row {row[1]} references {row[2]}"))
    for row in tx.all(_QUEUE_ROW):
        found.append(Violation("queueRow", f"run {row[0]}"))
    for row in tx.all(_QUEUE_STATE):
        found.append(Violation("queueState", f"run {row[0]}"))
    for row in tx.all(_TERMINAL_LEASE, (tx.now,)):
        found.append(Violation("terminalLease", f"run {row[0]}"))
    for row in tx.all(_EFFECT_ATTEMPT):
        found.append(Violation("effectAttempt", f"effect {row[0]}"))
    for row in tx.all(_EVENT_REVISIONS):
        found.append(Violation("eventRevisions", f"resource {row[0]}"))
    for row in tx.all(_WAITING_REQUEST):
        found.append(Violation("waitingRequest", f"run {row[0]}"))
    for row in tx.all(_OPEN_REQUEST):
        found.append(Violation("openRequest", f"request {row[0]}"))
    for row in tx.all(_DECISION_WINNER):
        found.append(Violation("decisionWinner", f"decision {row[0]}"))
    for row in tx.all(_DECISION_REQUEST):
        found.append(Violation("decisionRequest", f"decision {row[0]}"))
    for row in tx.all(_ACTIVE_ATTEMPT):
        found.append(Violation("activeAttempt", f"attempt {row[0]}"))
    for row in tx.all(_SETTLED_RUN_EFFECT):
        found.append(Violation("settledRunEffect", f"effect {row[0]}"))
    for row in tx.all(_ATTEMPT_GENERATION):
        found.append(Violation("attemptGeneration", f"attempt {row[0]}"))
    for row in tx.all(_EFFECT_GENERATION):
        found.append(Violation("effectGeneration", f"effect {row[0]}"))
    found.extend(Violation(code, detail) for code, detail in resource_violations(tx))
    return found
