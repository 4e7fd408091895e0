"""Runner processes (``run_runners``) and the receipts of their messages (``runner_messages``).

The one module that writes either table.

One runner row per process launched for a run generation, recorded *before* the spawn::

    starting ──process──▶ starting(pid) ──ready──▶ ready ──first accepted message──▶ running
        │                                            │                                 │
        └──────────── exit (exited | cancelled | timedOut | crashed | claimLost | orphaned) ┘

A runner row is a supervision record, not part of the run aggregate: launch, process and exit
writes change no run revision and write no run event (the launch and process writes check and
renew the run claim; the exit write needs no claim, it only closes the row). ``ready`` is the
exception: it moves the queue row to ``running``, so it is one change of the run and stamps
``ready_revision``. The no-progress rule compares the run revision with that stamp (or with
``launch_revision`` for a runner that never became ready), so the server's own bookkeeping never
counts as progress.

Receipts: :func:`apply_runner_message` stores the answer to each state-changing message under
``(runner_epoch, message_id)`` in the transaction of the change; a retry with the same
fingerprint gets the stored answer without re-applying, another fingerprint is rejected. The
answer is a blob, except for the most common one, a change applied that reports only the run
revision it left: that receipt has no result blob, its ``accepted_revision`` is the whole answer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, CommandKind, Conflict
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import LIVE_RUNNER_STATUSES, QueueStatus, RunnerMessageOutcome, RunnerStatus
from piwf.state.execution import queue
from piwf.state.execution.core import RunLaunch, record_run_change, require_run_claim
from piwf.state.execution.runs import require_run, run_resource_id
from piwf.state.leases import Claim, claim_actor
from piwf.state.records import Actor, read_revision
from piwf.workflow import port
from piwf.workflow.port_codec import result_from_json, result_to_json

_SELECT_RUNNER = """
SELECT runner_epoch, run_id, generation, server_epoch, command, launch_envelope_hash,
       launch_revision, ready_revision, pid, process_start_identity, status, started_at,
       ready_at, finished_at, exit_code, signal
FROM run_runners
"""

_SELECT_DIAGNOSTIC = "SELECT diagnostic_hash FROM run_runners WHERE runner_epoch = ?"

_SELECT_ORPHANED = (
    _SELECT_RUNNER
    + " WHERE status IN ('starting', 'ready', 'running') AND server_epoch < ? ORDER BY started_at"
)

_SELECT_GENERATION_RUNNER = """
SELECT runner_epoch FROM run_runners WHERE run_id = ? AND generation = ?
ORDER BY started_at DESC, rowid DESC LIMIT 1
"""

_SELECT_LIVE_RUNNER = (
    _SELECT_RUNNER + " WHERE run_id = ? AND status IN ('starting', 'ready', 'running')"
)

_INSERT_RUNNER = """
INSERT INTO run_runners (runner_epoch, run_id, generation, server_epoch, command,
                         launch_envelope_hash, launch_revision, status, started_at)
VALUES (?, ?, ?, ?, ?, ?, ?, 'starting', ?)
"""

_SET_PROCESS = """
UPDATE run_runners SET pid = ?, process_start_identity = ?
WHERE runner_epoch = ? AND pid IS NULL AND status IN ('starting', 'ready', 'running')
"""

_SET_READY = """
UPDATE run_runners SET status = 'ready', ready_at = ?, ready_revision = ?
WHERE runner_epoch = ? AND status = 'starting'
"""

_SET_RUNNING = """
UPDATE run_runners SET status = 'running' WHERE runner_epoch = ? AND status = 'ready'
"""

_CLOSE_RUNNER = """
UPDATE run_runners
SET status = ?, finished_at = ?, exit_code = ?, signal = ?, diagnostic_hash = ?
WHERE runner_epoch = ? AND status IN ('starting', 'ready', 'running')
"""

_MOVE_PROGRESS_BASELINE = """
UPDATE run_runners SET ready_revision = ?
WHERE run_id = ? AND status IN ('ready', 'running')
"""

_SELECT_RECEIPT = """
SELECT request_fingerprint, outcome, accepted_revision, result_hash, error_hash
FROM runner_messages WHERE runner_epoch = ? AND message_id = ?
"""

_INSERT_RECEIPT = """
INSERT INTO runner_messages (runner_epoch, message_id, request_fingerprint, outcome,
                             accepted_revision, result_hash, error_hash, completed_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""


@dataclass(frozen=True)
class RunnerRecord:
    """One runner row; ``progress_baseline`` is the revision the no-progress rule compares."""

    runner_epoch: str
    run_id: str
    generation: int
    server_epoch: int
    command: CommandKind
    launch_envelope_hash: bytes
    launch_revision: int
    ready_revision: int | None
    pid: int | None
    process_start_identity: str | None
    status: RunnerStatus
    started_at: int
    ready_at: int | None
    finished_at: int | None
    exit_code: int | None
    signal: str | None

    @property
    def live(self) -> bool:
        """Whether the row still describes a process that may be running."""
        return self.status in LIVE_RUNNER_STATUSES

    @property
    def progress_baseline(self) -> int:
        """The run revision after the server's last bookkeeping write for this runner."""
        return self.launch_revision if self.ready_revision is None else self.ready_revision


@dataclass(frozen=True)
class RunnerReply:
    """The answer to one runner message, fresh or replayed from its receipt.

    ``result`` is the port result for ``accepted``/``adopted``/``rejected`` outcomes of an
    applied message; it is ``None`` with an ``error`` for ``claimLost`` and for messages refused
    before they were applied (unknown runner, reused message id).
    """

    message_id: str
    outcome: RunnerMessageOutcome
    result: port.PortResult | None
    revision: int | None
    error: str | None
    replayed: bool = False


def get_runner(tx: Transaction, runner_epoch: str) -> RunnerRecord | None:
    """Return one runner row, or None."""
    row = tx.one(_SELECT_RUNNER + " WHERE runner_epoch = ?", (runner_epoch,))
    return None if row is None else _runner_from_row(row)


def runner_diagnostic(tx: Transaction, runner_epoch: str) -> str | None:
    """Return the diagnostic text a closed runner row keeps (the protocol rule it broke), or
    None when it has none."""
    digest = tx.scalar(_SELECT_DIAGNOSTIC, (runner_epoch,))
    return None if digest is None else blobs.read_text(tx, bytes(digest))


def list_runners(tx: Transaction, run_id: str) -> list[RunnerRecord]:
    """Return the runner rows of a run, oldest first."""
    rows = tx.all(_SELECT_RUNNER + " WHERE run_id = ? ORDER BY started_at, rowid", (run_id,))
    return [_runner_from_row(row) for row in rows]


def live_runner(tx: Transaction, run_id: str) -> RunnerRecord | None:
    """Return the run's live runner (at most one exists), or None."""
    row = tx.one(_SELECT_LIVE_RUNNER, (run_id,))
    return None if row is None else _runner_from_row(row)


def orphaned_runners(tx: Transaction, epoch: int) -> list[RunnerRecord]:
    """Return the runner rows still live from servers older than ``epoch``, oldest first."""
    return [_runner_from_row(row) for row in tx.all(_SELECT_ORPHANED, (epoch,))]


def latest_runner_of_generation(tx: Transaction, run_id: str, generation: int) -> str | None:
    """Return the epoch of the run's latest runner of claim ``generation``, or None."""
    found = tx.scalar(_SELECT_GENERATION_RUNNER, (run_id, generation))
    return None if found is None else str(found)


def record_runner_launch(
    tx: Transaction,
    launch: RunLaunch,
    *,
    runner_epoch: str,
    server_epoch: int,
    envelope: JsonValue,
    lease_ms: int,
) -> Applied[RunnerRecord] | Adopted[RunnerRecord] | Conflict:
    """Record a runner as ``starting`` before its process is spawned (same or next transaction
    after :func:`~piwf.state.execution.claim_next_run`).

    Renews the launch claim first (:class:`ClaimLostError` when it is stale). The envelope is
    stored as a JSON blob. Returns :class:`Adopted` for a repeat of the same launch, and
    :class:`Conflict` when the run is no longer ``starting`` under this claim, changed since it
    was claimed, or already has a live runner. No run revision changes.
    """
    require_run_claim(tx, launch.claim, launch.run_id, lease_ms)
    envelope_hash = blobs.put_json(tx, envelope)
    existing = get_runner(tx, runner_epoch)
    if existing is not None:
        same = (
            existing.run_id == launch.run_id
            and existing.generation == launch.generation
            and existing.command is launch.command
            and existing.launch_envelope_hash == envelope_hash
        )
        if same:
            return Adopted(existing)
        return Conflict(f"runner epoch {runner_epoch} was recorded for another launch")
    run = require_run(tx, launch.run_id)
    if not run.executing or run.queue_status is not QueueStatus.STARTING:
        return Conflict(f"run {run.run_id} is not starting (queue {_value(run.queue_status)})")
    if run.revision != launch.launch_revision:
        return Conflict(
            f"run {run.run_id} is at revision {run.revision}, launched at {launch.launch_revision}"
        )
    other = live_runner(tx, run.run_id)
    if other is not None:
        return Conflict(f"run {run.run_id} already has a live runner ({other.status.value})")
    tx.execute(
        _INSERT_RUNNER,
        (
            runner_epoch,
            run.run_id,
            launch.generation,
            server_epoch,
            launch.command.value,
            envelope_hash,
            run.revision,
            tx.now,
        ),
    )
    return Applied(_require_runner(tx, runner_epoch))


def record_runner_process(
    tx: Transaction,
    claim: Claim,
    runner_epoch: str,
    pid: int,
    start_identity: str,
    *,
    lease_ms: int,
) -> Applied[RunnerRecord] | Adopted[RunnerRecord] | Conflict:
    """Record the spawned process (pid and start identity) of a live runner.

    Renews ``claim`` first (:class:`ClaimLostError`). A repeat with the same identity is
    :class:`Adopted`; another identity, a closed runner or a runner of another generation is a
    :class:`Conflict`. Raises ``LookupError`` for an unknown runner and ``ValueError`` for an
    empty identity. No run revision changes.
    """
    if pid <= 0 or not start_identity:
        raise ValueError("a runner process needs a positive pid and a start identity")
    runner = _require_runner(tx, runner_epoch)
    require_run_claim(tx, claim, runner.run_id, lease_ms)
    if runner.pid is not None:
        if (runner.pid, runner.process_start_identity) == (pid, start_identity):
            return Adopted(runner)
        return Conflict(f"runner {runner_epoch} already has another process")
    problem = _runner_problem(runner, claim)
    if problem is not None:
        return Conflict(problem)
    tx.execute(_SET_PROCESS, (pid, start_identity, runner_epoch))
    return Applied(_require_runner(tx, runner_epoch))


def mark_runner_ready(
    tx: Transaction, claim: Claim, runner_epoch: str, *, lease_ms: int
) -> Applied[RunnerRecord] | Adopted[RunnerRecord] | Conflict:
    """The runner answered ``ready``: runner ``ready``, queue ``running``, one run change.

    Renews ``claim`` first (:class:`ClaimLostError`). Stamps ``ready_revision`` with the revision
    this change commits (event ``runner.ready``). A runner already ready or running is
    :class:`Adopted`; a closed runner, another generation or a run that is not starting is a
    :class:`Conflict`.
    """
    runner = _require_runner(tx, runner_epoch)
    claim = require_run_claim(tx, claim, runner.run_id, lease_ms)
    if runner.status in (RunnerStatus.READY, RunnerStatus.RUNNING):
        return Adopted(runner)
    problem = _runner_problem(runner, claim)
    if problem is not None:
        return Conflict(problem)
    run = require_run(tx, runner.run_id)
    if not run.executing or run.queue_status is not QueueStatus.STARTING:
        return Conflict(f"run {run.run_id} is not starting (queue {_value(run.queue_status)})")
    actor = Actor(claim_actor(claim), claim.owner_id)
    payload = {"runnerEpoch": runner_epoch, "generation": runner.generation}
    revision = record_run_change(tx, run, "runner.ready", actor, claim, payload)
    tx.execute(_SET_READY, (tx.now, revision, runner_epoch))
    queue.set_queue(tx, run.run_id, QueueStatus.RUNNING)
    return Applied(_require_runner(tx, runner_epoch))


def move_progress_baseline(tx: Transaction, run_id: str, revision: int) -> None:
    """Count the run's changes up to ``revision`` as bookkeeping for its ready runner.

    The no-progress rule compares the run revision with this stamp, so a change that is not
    progress (reopening a crashed visit) never lets a runner that dies again look productive.
    """
    tx.execute(_MOVE_PROGRESS_BASELINE, (revision, run_id))


def record_runner_exit(
    tx: Transaction,
    runner_epoch: str,
    status: RunnerStatus,
    *,
    exit_code: int | None = None,
    signal: str | None = None,
    diagnostic: str | None = None,
) -> Applied[RunnerRecord] | Adopted[RunnerRecord] | Conflict:
    """Close a runner row with its one terminal outcome; needs no claim.

    Only the row changes (the run is decided separately, see
    :func:`~piwf.state.execution.recover_after_runner_exit`). ``diagnostic`` is stored as a text
    blob. A repeat of the same outcome is :class:`Adopted`, another outcome of a closed row a
    :class:`Conflict`. Raises ``ValueError`` for a live status and ``LookupError`` for an
    unknown runner.
    """
    if status in LIVE_RUNNER_STATUSES:
        raise ValueError(f"{status.value} is not a runner outcome")
    runner = _require_runner(tx, runner_epoch)
    if not runner.live:
        if runner.status is status:
            return Adopted(runner)
        return Conflict(f"runner {runner_epoch} already ended {runner.status.value}")
    diagnostic_hash = None if diagnostic is None else blobs.put_text(tx, diagnostic)
    tx.execute(
        _CLOSE_RUNNER,
        (status.value, tx.now, exit_code, signal, diagnostic_hash, runner_epoch),
    )
    return Applied(_require_runner(tx, runner_epoch))


def apply_runner_message(
    tx: Transaction,
    claim: Claim,
    runner_epoch: str,
    message_id: str,
    fingerprint: bytes,
    apply: Callable[[], port.PortResult],
) -> RunnerReply:
    """Apply one state-changing runner message at most once and store its receipt.

    ``apply`` is one of the ``apply_*`` functions bound to its message; it runs in a savepoint of
    ``tx``. The answer, by case:

    - a stored receipt with the same ``fingerprint``: its answer again (``replayed=True``),
      without calling ``apply``;
    - a stored receipt with another fingerprint: ``rejected`` (nothing stored);
    - an unknown runner epoch: ``rejected`` (nothing stored);
    - a runner that is closed or of another generation than ``claim``, or ``apply`` raising
      :class:`ClaimLostError`: ``claimLost`` (stored; ``apply``'s writes are undone);
    - otherwise ``apply``'s result: ``accepted`` (Applied), ``adopted`` (Adopted) or
      ``rejected`` (Conflict, RecoveryRequired), stored with the run revision.

    The first accepted message moves a ``ready`` runner to ``running``. Any other exception
    propagates and the caller's transaction rolls back.
    """
    if len(fingerprint) != 32:
        raise ValueError("a message fingerprint is a 32-byte SHA-256 digest")
    stored = tx.one(_SELECT_RECEIPT, (runner_epoch, message_id))
    if stored is not None:
        if bytes(stored["request_fingerprint"]) == fingerprint:
            return _reply_from_receipt(tx, message_id, stored)
        return RunnerReply(
            message_id,
            RunnerMessageOutcome.REJECTED,
            None,
            None,
            f"message id {message_id} was used for another request",
        )
    runner = get_runner(tx, runner_epoch)
    if runner is None:
        return RunnerReply(
            message_id, RunnerMessageOutcome.REJECTED, None, None, "unknown runner epoch"
        )
    if run_resource_id(runner.run_id) != claim.resource_id or _runner_problem(runner, claim):
        error = f"runner {runner_epoch} no longer holds run {runner.run_id}"
        return _store_claim_lost(tx, runner_epoch, message_id, fingerprint, error)
    try:
        with tx.savepoint():
            result = apply()
    except ClaimLostError as lost:
        error = f"claim lost ({lost.reason})"
        return _store_claim_lost(tx, runner_epoch, message_id, fingerprint, error)
    outcome = _outcome_of(result)
    revision = _revision_after(tx, claim, result)
    result_hash = (
        None if _is_plain_applied(result, revision) else blobs.put_json(tx, result_to_json(result))
    )
    tx.execute(
        _INSERT_RECEIPT,
        (runner_epoch, message_id, fingerprint, outcome.value, revision, result_hash, None, tx.now),
    )
    if outcome is RunnerMessageOutcome.ACCEPTED and runner.status is RunnerStatus.READY:
        tx.execute(_SET_RUNNING, (runner_epoch,))
    return RunnerReply(message_id, outcome, result, revision, None)


def _revision_after(tx: Transaction, claim: Claim, result: port.PortResult) -> int | None:
    """The run revision once ``result`` was applied: the one an applied or adopted change
    reports (every applier reports the revision it leaves), else the stored one."""
    if isinstance(result, (Applied, Adopted)) and result.value.revision is not None:
        return result.value.revision
    return read_revision(tx, claim.resource_id)


def _is_plain_applied(result: port.PortResult, revision: int | None) -> bool:
    """Whether ``result`` is an ``Applied`` that says no more than the revision the receipt
    stores beside it (most changes): such a receipt keeps no result blob, and
    :func:`_reply_from_receipt` rebuilds it from ``accepted_revision``."""
    return (
        isinstance(result, Applied)
        and revision is not None
        and result.value == port.Committed(revision)
    )


def _outcome_of(result: port.PortResult) -> RunnerMessageOutcome:
    if isinstance(result, Applied):
        return RunnerMessageOutcome.ACCEPTED
    if isinstance(result, Adopted):
        return RunnerMessageOutcome.ADOPTED
    return RunnerMessageOutcome.REJECTED


def _store_claim_lost(
    tx: Transaction, runner_epoch: str, message_id: str, fingerprint: bytes, error: str
) -> RunnerReply:
    error_hash = blobs.put_text(tx, error)
    tx.execute(
        _INSERT_RECEIPT,
        (
            runner_epoch,
            message_id,
            fingerprint,
            RunnerMessageOutcome.CLAIM_LOST.value,
            None,
            None,
            error_hash,
            tx.now,
        ),
    )
    return RunnerReply(message_id, RunnerMessageOutcome.CLAIM_LOST, None, None, error)


def _reply_from_receipt(tx: Transaction, message_id: str, stored: sqlite3.Row) -> RunnerReply:
    """The stored answer again. An ``accepted`` receipt without a result blob was a plain
    ``Applied`` (:func:`_is_plain_applied`): its result is the stored revision alone."""
    outcome = RunnerMessageOutcome(stored["outcome"])
    result_hash = stored["result_hash"]
    error_hash = stored["error_hash"]
    revision = stored["accepted_revision"]
    result: port.PortResult | None
    if result_hash is not None:
        result = result_from_json(blobs.read_json(tx, bytes(result_hash)))
    elif outcome is RunnerMessageOutcome.ACCEPTED and revision is not None:
        result = Applied(port.Committed(revision))
    else:
        result = None
    return RunnerReply(
        message_id=message_id,
        outcome=outcome,
        result=result,
        revision=revision,
        error=None if error_hash is None else blobs.read_text(tx, bytes(error_hash)),
        replayed=True,
    )


def _runner_problem(runner: RunnerRecord, claim: Claim) -> str | None:
    if not runner.live:
        return f"runner {runner.runner_epoch} already ended {runner.status.value}"
    if runner.generation != claim.generation:
        return (
            f"runner {runner.runner_epoch} belongs to generation {runner.generation},"
            f" not {claim.generation}"
        )
    return None


def _require_runner(tx: Transaction, runner_epoch: str) -> RunnerRecord:
    runner = get_runner(tx, runner_epoch)
    if runner is None:
        raise LookupError(f"no runner {runner_epoch}")
    return runner


def _runner_from_row(row: sqlite3.Row) -> RunnerRecord:
    return RunnerRecord(
        runner_epoch=row["runner_epoch"],
        run_id=row["run_id"],
        generation=row["generation"],
        server_epoch=row["server_epoch"],
        command=CommandKind(row["command"]),
        launch_envelope_hash=bytes(row["launch_envelope_hash"]),
        launch_revision=row["launch_revision"],
        ready_revision=row["ready_revision"],
        pid=row["pid"],
        process_start_identity=row["process_start_identity"],
        status=RunnerStatus(row["status"]),
        started_at=row["started_at"],
        ready_at=row["ready_at"],
        finished_at=row["finished_at"],
        exit_code=row["exit_code"],
        signal=row["signal"],
    )


def _value(status: QueueStatus | None) -> str:
    return "none" if status is None else status.value
