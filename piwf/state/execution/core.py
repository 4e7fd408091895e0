"""Shared pieces of the execution store: run rows, attempt rows and run authority.

Everything here runs inside a caller's ``write()`` (or ``read()``) transaction and never
commits. The public operations live in :mod:`piwf.state.execution` and its siblings; this module
holds what they share so that each of them states its own SQL and transition and nothing else.

Authority comes in two shapes:

- :func:`require_run_claim` is the first step of every runner-driven write: the exact live run
  claim is renewed, or :class:`~piwf.errors.ClaimLostError` is raised before anything is read.
- :func:`take_run_authority` is used by server-side transitions (control, recovery) that may find
  the claim gone: a live claim passed by the caller is renewed and reused; otherwise a new claim
  is taken with generation + 1, which is only possible when no other owner's lease is live.

:func:`set_queue` and :func:`close_run_dependents` are the queue and terminal-closing steps
that several transitions share; they run inside the caller's one change.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from piwf import canonical
from piwf.errors import ClaimLostError
from piwf.lifecycle import TERMINAL_RUN_STATUSES, CommandKind, Conflict, EffectStatus, RunStatus
from piwf.state import blobs, decisions
from piwf.state import effects as fx
from piwf.state.database import Transaction
from piwf.state.enums import (
    ActorType,
    AttemptStatus,
    FailureClass,
    OwnerType,
    QueueStatus,
    ResourceType,
)
from piwf.state.leases import Claim, read_lease, renew_claim, take_claim, verify_claim
from piwf.state.records import Actor, record_change, resource_id_for

#: The actor of every change a runner proposes; the event's lease generation names the runner.
RUNNER_ACTOR = Actor(ActorType.RUNNER)

_SELECT_RUN_ROW = """
SELECT r.run_id, r.resource_id, r.status, r.paused, r.title, r.lineage_kind, r.parent_run_id,
       r.root_run_id, r.restart_number, r.definition_digest, r.input_hash,
       r.final_output_hash, r.error_hash, r.finished_at, q.status AS queue_status,
       q.error_code, res.revision
FROM runs r
JOIN resources res ON res.resource_id = r.resource_id
LEFT JOIN run_queue q ON q.run_id = r.run_id
WHERE r.run_id = ?
"""

#: The open (pending or answered) request of one attempt.
SELECT_OPEN_REQUEST = """
SELECT request_id, run_id, attempt_id, kind, content_hash, on_timeout_hash, timeout_ms, status,
       answer_hash, answered_by, rejection_hash
FROM interactive_requests WHERE attempt_id = ? AND status IN ('pending', 'answered')
"""

#: The columns :func:`attempt_from_row` reads; callers append their own WHERE clause.
SELECT_ATTEMPT = """
SELECT attempt_id, run_id, node_path, visit, attempt_number, node_type, status,
       lease_generation, output_hash, error_hash, started_at, deadline_at, finished_at
FROM node_attempts
"""

_SELECT_ACTIVE_ATTEMPT = (
    SELECT_ATTEMPT + " WHERE run_id = ? AND status IN ('pending', 'running', 'waiting')"
)

_COUNT_ATTEMPTS = "SELECT count(*) FROM node_attempts WHERE run_id = ?"

_UPDATE_QUEUE = """
UPDATE run_queue
SET status = :status, error_code = :error_code, error_hash = :error_hash,
    finished_at = :finished_at, updated_at = :now,
    available_at = CASE WHEN :available_now THEN :now ELSE available_at END
WHERE run_id = :run_id
"""

_CLOSE_ACTIVE_ATTEMPT = """
UPDATE node_attempts SET status = ?, finished_at = ?, updated_at = ?
WHERE run_id = ? AND status IN ('pending', 'running', 'waiting')
"""

_CANCEL_OPEN_REQUESTS = """
UPDATE interactive_requests SET status = 'cancelled', updated_at = ?
WHERE run_id = ? AND status IN ('pending', 'answered')
"""

TERMINAL_QUEUE_STATUSES = frozenset({QueueStatus.DONE, QueueStatus.FAILED, QueueStatus.CANCELLED})


@dataclass(frozen=True)
class RunRow:
    """The run, queue and revision facts every execution transition checks."""

    run_id: str
    resource_id: str
    status: RunStatus
    paused: bool
    title: str | None
    lineage_kind: str | None
    parent_run_id: str | None
    root_run_id: str
    restart_number: int
    definition_digest: bytes
    input_hash: bytes
    final_output_hash: bytes | None
    error_hash: bytes | None
    finished_at: int | None
    queue_status: QueueStatus | None
    error_code: str | None
    revision: int

    @property
    def terminal(self) -> bool:
        """Whether the run has its final status."""
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def executing(self) -> bool:
        """Whether a runner generation holds the run (``running`` with queue starting/running)."""
        return self.status is RunStatus.RUNNING and self.queue_status in (
            QueueStatus.STARTING,
            QueueStatus.RUNNING,
        )


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
    started_at: int | None
    deadline_at: int | None
    finished_at: int | None


@dataclass(frozen=True)
class RunLaunch:
    """A run claimed for one runner generation, and the one command that runner executes.

    ``launch_revision`` is the run revision the claim committed; ``parent_run_id`` is set for a
    ``restart`` (the runner's ``RestartCommand`` names it). ``claim`` holds the raw token: keep it
    in the server process and never log it.
    """

    claim: Claim
    run_id: str
    command: CommandKind
    launch_revision: int
    parent_run_id: str | None = None

    @property
    def generation(self) -> int:
        """The claim generation this launch runs under."""
        return self.claim.generation


def run_resource_id(run_id: str) -> str:
    """Return the resource id of a run aggregate."""
    return resource_id_for(ResourceType.RUN, run_id)


def load_run(tx: Transaction, run_id: str) -> RunRow | None:
    """Return the run's row facts, or None when there is no such run."""
    row = tx.one(_SELECT_RUN_ROW, (run_id,))
    if row is None:
        return None
    return RunRow(
        run_id=row["run_id"],
        resource_id=row["resource_id"],
        status=RunStatus(row["status"]),
        paused=bool(row["paused"]),
        title=row["title"],
        lineage_kind=row["lineage_kind"],
        parent_run_id=row["parent_run_id"],
        root_run_id=row["root_run_id"],
        restart_number=row["restart_number"],
        definition_digest=bytes(row["definition_digest"]),
        input_hash=bytes(row["input_hash"]),
        final_output_hash=optional_bytes(row["final_output_hash"]),
        error_hash=optional_bytes(row["error_hash"]),
        finished_at=row["finished_at"],
        queue_status=None if row["queue_status"] is None else QueueStatus(row["queue_status"]),
        error_code=row["error_code"],
        revision=row["revision"],
    )


def require_run(tx: Transaction, run_id: str) -> RunRow:
    """Return the run's row facts; raises ``LookupError`` when there is no such run."""
    run = load_run(tx, run_id)
    if run is None:
        raise LookupError(f"no run {run_id}")
    return run


def require_run_claim(tx: Transaction, claim: Claim, run_id: str, lease_ms: int) -> Claim:
    """Renew the exact live claim on ``run_id`` and return it renewed.

    Raises :class:`ClaimLostError` (``missingAuthority`` for a claim on another aggregate) before
    anything else is read, so a stale runner learns nothing and changes nothing.
    """
    resource_id = run_resource_id(run_id)
    if claim.resource_id != resource_id:
        raise ClaimLostError("missingAuthority", resource_id, claim.generation)
    return renew_claim(tx, claim, lease_ms)


def take_run_authority(
    tx: Transaction,
    run: RunRow,
    *,
    claim: Claim | None,
    owner_type: OwnerType,
    owner_id: str,
    lease_ms: int,
) -> Claim | Conflict:
    """Return a live claim on ``run`` for a server-side transition (control or recovery).

    A ``claim`` that is still the exact live claim of this run is renewed and reused. Otherwise
    a new claim (generation + 1) is taken for ``(owner_type, owner_id)``, which fences every
    earlier token; that needs the lease to be free, released or expired, so a live claim of
    another owner is a :class:`Conflict` (nobody force-takes a live claim). Taking a claim does
    not bump the revision: the caller's one change records it with the new generation.
    """
    if claim is not None and claim.resource_id == run.resource_id:
        try:
            verify_claim(tx, claim)
        except ClaimLostError:
            pass
        else:
            return renew_claim(tx, claim, lease_ms)
    lease = read_lease(tx, run.resource_id)
    if lease is not None and lease.is_live(tx.now):
        holder = "unknown" if lease.owner_type is None else lease.owner_type.value
        return Conflict(
            f"run {run.run_id} is held by a live {holder} claim (generation {lease.generation})"
        )
    taken = take_claim(tx, run.resource_id, owner_type, owner_id, lease_ms)
    if isinstance(taken, Conflict):  # pragma: no cover - the lease was checked just above
        return taken
    return taken.value


def record_run_change(
    tx: Transaction,
    run: RunRow,
    event_type: str,
    actor: Actor,
    claim: Claim | None,
    payload: object | None = None,
) -> int:
    """Bump the run revision once, append its event and return the new revision.

    ``claim`` was renewed by the caller; it is verified again here (not renewed twice).
    """
    return record_change(
        tx, run.resource_id, run.revision, event_type, actor, claim=claim, payload=payload
    ).revision


def active_attempt(tx: Transaction, run_id: str) -> AttemptRow | None:
    """Return the run's one unfinished attempt (pending, running or waiting), or None."""
    row = tx.one(_SELECT_ACTIVE_ATTEMPT, (run_id,))
    return None if row is None else attempt_from_row(row)


def attempt_count(tx: Transaction, run_id: str) -> int:
    """Return how many node attempts the run has (0 means nothing has executed)."""
    return int(tx.scalar(_COUNT_ATTEMPTS, (run_id,)))


def attempt_id_for(run_id: str, path: str, visit: int, attempt: int) -> str:
    """Return the deterministic id of one attempt of one node visit."""
    digest = canonical.digest_hex(["piwf.attempt.v1", run_id, path, visit, attempt])
    return f"attempt-{digest[:40]}"


def attempt_from_row(row: sqlite3.Row) -> AttemptRow:
    """Build an :class:`AttemptRow` from a row of :data:`SELECT_ATTEMPT`'s columns."""
    return AttemptRow(
        attempt_id=row["attempt_id"],
        run_id=row["run_id"],
        path=row["node_path"],
        visit=row["visit"],
        attempt=row["attempt_number"],
        node_type=row["node_type"],
        status=AttemptStatus(row["status"]),
        lease_generation=row["lease_generation"],
        output_hash=optional_bytes(row["output_hash"]),
        error_hash=optional_bytes(row["error_hash"]),
        started_at=row["started_at"],
        deadline_at=row["deadline_at"],
        finished_at=row["finished_at"],
    )


def set_queue(
    tx: Transaction,
    run_id: str,
    status: QueueStatus,
    *,
    error_code: FailureClass | None = None,
    error_text: str | None = None,
    available_now: bool = False,
) -> None:
    """Move the run's queue row to ``status`` with this error (or none), in the caller's change.

    A terminal queue status also sets ``finished_at``; ``available_now`` makes the row eligible
    for the scheduler from this instant.
    """
    error_hash = None if error_text is None else blobs.put_text(tx, error_text)
    finished_at = tx.now if status in TERMINAL_QUEUE_STATUSES else None
    tx.execute(
        _UPDATE_QUEUE,
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


def close_run_dependents(
    tx: Transaction,
    run: RunRow,
    *,
    attempt_status: AttemptStatus,
    actor: Actor,
    claim: Claim,
) -> None:
    """Close what a terminal run leaves open, inside the terminal change.

    The active attempt gets ``attempt_status``, open requests become ``cancelled`` (an
    unresolved decision records an ``explicit_cancel`` winner first), pending
    effects ``cancelled`` and applying ones ``ambiguous`` (nothing that may have happened outside
    is forgotten). ``claim`` must be the live claim the terminal change is recorded under.
    """
    tx.execute(_CLOSE_ACTIVE_ATTEMPT, (attempt_status.value, tx.now, tx.now, run.run_id))
    reason = f"the run closed its open requests ({attempt_status.value})"
    decisions.cancel_unresolved_in(tx, run.run_id, reason=reason, actor=actor)
    tx.execute(_CANCEL_OPEN_REQUESTS, (tx.now, run.run_id))
    for effect in fx.list_effects(tx, run.resource_id):
        if effect.status in (EffectStatus.PENDING, EffectStatus.APPLYING):
            fx.cancel_effect(tx, effect.effect_id, actor=actor, claim=claim)


def executing_run(tx: Transaction, run_id: str) -> RunRow | Conflict:
    """Return the run when a runner generation holds it, else the port's ``Conflict``."""
    run = load_run(tx, run_id)
    if run is None:
        return Conflict(f"run {run_id} does not exist")
    if not run.executing:
        queue = "none" if run.queue_status is None else run.queue_status.value
        return Conflict(f"run {run_id} is {run.status.value} (queue {queue}), not executing")
    return run


def visit_attempt(tx: Transaction, run: RunRow, path: str, visit: int) -> AttemptRow | Conflict:
    """Return the active attempt when it belongs to visit ``visit`` of ``path``, else Conflict."""
    active = active_attempt(tx, run.run_id)
    if active is None or (active.path, active.visit) != (path, visit):
        return Conflict(f"visit {visit} of {path!r} is not the active visit")
    return active


def optional_bytes(value: bytes | None) -> bytes | None:
    """Return a nullable BLOB column as ``bytes`` (or None)."""
    return None if value is None else bytes(value)
