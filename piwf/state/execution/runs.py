"""Runs and their queue rows: creation, typed reads and the control transitions.

A run and its ``run_queue`` row follow the seed's table (run status x queue status); every
transition here changes both, bumps the run revision once and writes its event in one
transaction. Run input and final output are JSON blobs, the run error is a text blob; each is
read through its own named reader, so a text error is never parsed as JSON.

Display status is derived in one place (:func:`display_status`) with the seed's precedence:
terminal > ambiguous effect > durable pause > pending request (``waiting``) > active work
(``running``) > parked or admitted (``queued``).
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.errors import BlobConflictError
from piwf.lifecycle import RunStatus
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import (
    BLOCKING_FAILURE_CLASSES,
    CRASH_LOOP_LIMIT,
    ExecutionMode,
    FailureClass,
    QueueStatus,
    ResourceType,
    SourceType,
)
from piwf.state.records import Actor, ensure_resource, record_change

DISPLAY_STATUSES = (
    "queued",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "timed_out",
    "cancelled",
    "ambiguous",
)

_SELECT_RUN = """
SELECT r.run_id, r.resource_id, r.workflow_ref, d.workflow_name, r.title, r.status, r.paused,
       r.status_detail, r.parent_run_id, r.root_run_id, r.restart_number, r.definition_digest,
       r.created_at, r.updated_at, r.finished_at, q.status AS queue_status, q.error_code,
       q.available_at, q.consecutive_errors, res.revision,
       EXISTS (SELECT 1 FROM effects e WHERE e.source_resource_id = r.resource_id
               AND e.status = 'ambiguous') AS has_ambiguous_effect
FROM runs r
JOIN workflow_definitions d ON d.definition_digest = r.definition_digest
JOIN resources res ON res.resource_id = r.resource_id
LEFT JOIN run_queue q ON q.run_id = r.run_id
"""

_INSERT_RUN = """
INSERT INTO runs (run_id, resource_id, project_id, root_run_id, definition_digest, workflow_ref,
                  launch_options_hash, title, status, input_hash, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?)
"""

_INSERT_QUEUE = """
INSERT INTO run_queue (run_id, status, available_at, created_at, updated_at)
VALUES (?, 'queued', ?, ?, ?)
"""


@dataclass(frozen=True)
class SourceFile:
    """One source of a run: the root (``mount_path=""``) or a mounted workflow."""

    mount_path: str
    source_type: SourceType
    source_ref: str
    source_revision: str


@dataclass(frozen=True)
class NewRun:
    """Everything needed to commit a queued run; resolved outside the server's process."""

    workflow_ref: str
    workflow_name: str
    definition_digest: bytes
    definition_snapshot: JsonValue
    input: JsonValue
    sources: Sequence[SourceFile]
    title: str | None = None
    project_path: str | None = None
    launch_options: JsonValue = None


@dataclass(frozen=True)
class RunView:
    """A run as clients see it; contains no payloads, tokens or actor ids."""

    run_id: str
    workflow_ref: str
    workflow_name: str
    title: str | None
    status: RunStatus
    display_status: str
    paused: bool
    status_detail: str | None
    queue_status: QueueStatus | None
    error_code: str | None
    #: Stopped until an operator acts: paused, or parked for a blocking failure class (or a
    #: crash streak that stopped relaunching). ``error_code`` says which.
    needs_action: bool
    parent_run_id: str | None
    root_run_id: str
    restart_number: int
    definition_digest: str
    revision: int
    created_at: int
    updated_at: int
    finished_at: int | None

    def to_json(self) -> dict[str, JsonValue]:
        """Return the wire form (camelCase keys)."""
        return {
            "runId": self.run_id,
            "workflowRef": self.workflow_ref,
            "workflowName": self.workflow_name,
            "title": self.title,
            "status": self.status.value,
            "displayStatus": self.display_status,
            "paused": self.paused,
            "statusDetail": self.status_detail,
            "queueStatus": None if self.queue_status is None else self.queue_status.value,
            "errorCode": self.error_code,
            "needsAction": self.needs_action,
            "parentRunId": self.parent_run_id,
            "rootRunId": self.root_run_id,
            "restartNumber": self.restart_number,
            "definitionDigest": self.definition_digest,
            "revision": self.revision,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "finishedAt": self.finished_at,
        }


def display_status(
    status: RunStatus,
    *,
    paused: bool,
    has_ambiguous_effect: bool,
    has_pending_request: bool,
    queue_status: QueueStatus | None,
) -> str:
    """Derive the one display status every renderer shows (seed precedence)."""
    if status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED):
        return str(status.value)
    if has_ambiguous_effect:
        return "ambiguous"
    if paused:
        return "paused"
    if has_pending_request or status is RunStatus.WAITING:
        return "waiting"
    if status is RunStatus.RUNNING and queue_status in (QueueStatus.STARTING, QueueStatus.RUNNING):
        return "running"
    return "queued"


def new_run_id() -> str:
    """Return a fresh, unguessable run id."""
    return f"run-{secrets.token_hex(10)}"


def create_run(tx: Transaction, run_id: str, new: NewRun, actor: Actor) -> RunView:
    """Commit a ``queued`` run with its queue row, sources and definition.

    The definition snapshot must hash to ``definition_digest`` (:class:`BlobConflictError`
    otherwise). Raises ``sqlite3.IntegrityError`` if ``run_id`` exists.
    """
    snapshot_hash = blobs.put_json(tx, new.definition_snapshot)
    if snapshot_hash != new.definition_digest:
        raise BlobConflictError("definition snapshot does not match its digest")
    tx.execute(
        "INSERT INTO workflow_definitions (definition_digest, workflow_name, created_at)"
        " VALUES (?, ?, ?) ON CONFLICT (definition_digest) DO NOTHING",
        (snapshot_hash, new.workflow_name, tx.now),
    )
    project_id = None if new.project_path is None else _ensure_project(tx, new.project_path)
    resource_id = ensure_resource(tx, ResourceType.RUN, run_id)
    record_change(
        tx,
        resource_id,
        0,
        "run.created",
        actor,
        payload={"workflowName": new.workflow_name, "definitionDigest": snapshot_hash.hex()},
    )
    launch_hash = None if new.launch_options is None else blobs.put_json(tx, new.launch_options)
    tx.execute(
        _INSERT_RUN,
        (
            run_id,
            resource_id,
            project_id,
            run_id,
            snapshot_hash,
            new.workflow_ref,
            launch_hash,
            new.title,
            blobs.put_json(tx, new.input),
            tx.now,
            tx.now,
        ),
    )
    tx.execute(_INSERT_QUEUE, (run_id, tx.now, tx.now, tx.now))
    tx.execute(
        "INSERT INTO run_bindings (run_id, origin_session_id, execution_mode, created_at)"
        " VALUES (?, NULL, ?, ?)",
        (run_id, ExecutionMode.HEADLESS.value, tx.now),
    )
    for source in new.sources:
        tx.execute(
            "INSERT INTO run_sources (run_id, mount_path, source_type, source_ref,"
            " source_revision) VALUES (?, ?, ?, ?, ?)",
            (
                run_id,
                source.mount_path,
                source.source_type.value,
                source.source_ref,
                source.source_revision,
            ),
        )
    view = get_run(tx, run_id)
    assert view is not None
    return view


def get_run(tx: Transaction, run_id: str) -> RunView | None:
    """Return one run, or None."""
    row = tx.one(_SELECT_RUN + " WHERE r.run_id = ?", (run_id,))
    return None if row is None else _view(row)


def list_runs(
    tx: Transaction, *, limit: int = 50, before: tuple[int, str] | None = None
) -> list[RunView]:
    """Return runs newest first; ``before`` = (created_at, run_id) of the last row seen."""
    if before is None:
        rows = tx.all(_SELECT_RUN + " ORDER BY r.created_at DESC, r.run_id DESC LIMIT ?", (limit,))
    else:
        rows = tx.all(
            _SELECT_RUN + " WHERE (r.created_at, r.run_id) < (?, ?)"
            " ORDER BY r.created_at DESC, r.run_id DESC LIMIT ?",
            (before[0], before[1], limit),
        )
    return [_view(row) for row in rows]


def list_run_sources(tx: Transaction, run_id: str) -> list[SourceFile]:
    """Return the recorded sources of a run, root first."""
    rows = tx.all(
        "SELECT mount_path, source_type, source_ref, source_revision FROM run_sources"
        " WHERE run_id = ? ORDER BY mount_path",
        (run_id,),
    )
    return [SourceFile(row[0], SourceType(row[1]), row[2], row[3]) for row in rows]


def read_run_input(tx: Transaction, run_id: str) -> JsonValue:
    """Return the run input (a JSON blob)."""
    digest = tx.scalar("SELECT input_hash FROM runs WHERE run_id = ?", (run_id,))
    if digest is None:
        raise LookupError(f"no run {run_id}")
    return blobs.read_json(tx, bytes(digest))


def read_run_final_output(tx: Transaction, run_id: str) -> JsonValue:
    """Return the final output of a completed run, or None."""
    digest = tx.scalar("SELECT final_output_hash FROM runs WHERE run_id = ?", (run_id,))
    return None if digest is None else blobs.read_json(tx, bytes(digest))


def read_run_error(tx: Transaction, run_id: str) -> str | None:
    """Return the error text of a failed run, or None."""
    digest = tx.scalar("SELECT error_hash FROM runs WHERE run_id = ?", (run_id,))
    return None if digest is None else blobs.read_text(tx, bytes(digest))


def read_queue_reason(tx: Transaction, run_id: str) -> str | None:
    """Return the stored reason of the run's queue error (why it is parked), or None.

    The text names the broken rule, the crash count or the changed files; never a payload.
    """
    digest = tx.scalar("SELECT error_hash FROM run_queue WHERE run_id = ?", (run_id,))
    return None if digest is None else blobs.read_text(tx, bytes(digest))[:2000]


def _ensure_project(tx: Transaction, canonical_path: str) -> str:
    project_id = "project-" + hashlib.sha256(canonical_path.encode("utf-8")).hexdigest()[:40]
    tx.execute(
        "INSERT INTO projects (project_id, canonical_path, created_at) VALUES (?, ?, ?)"
        " ON CONFLICT (project_id) DO NOTHING",
        (project_id, canonical_path, tx.now),
    )
    return project_id


def _view(row: sqlite3.Row) -> RunView:
    status = RunStatus(row["status"])
    queue_status = None if row["queue_status"] is None else QueueStatus(row["queue_status"])
    paused = bool(row["paused"])
    return RunView(
        run_id=row["run_id"],
        workflow_ref=row["workflow_ref"],
        workflow_name=row["workflow_name"],
        title=row["title"],
        status=status,
        display_status=display_status(
            status,
            paused=paused,
            has_ambiguous_effect=bool(row["has_ambiguous_effect"]),
            has_pending_request=False,
            queue_status=queue_status,
        ),
        paused=paused,
        status_detail=row["status_detail"],
        queue_status=queue_status,
        error_code=row["error_code"],
        needs_action=_needs_action(status, paused, queue_status, row),
        parent_run_id=row["parent_run_id"],
        root_run_id=row["root_run_id"],
        restart_number=row["restart_number"],
        definition_digest=bytes(row["definition_digest"]).hex(),
        revision=row["revision"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


def _needs_action(
    status: RunStatus, paused: bool, queue_status: QueueStatus | None, row: sqlite3.Row
) -> bool:
    """Whether an unfinished run will not go on until someone acts (the scheduler's rule)."""
    if status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED):
        return False
    if paused:
        return True
    if queue_status is not QueueStatus.PARKED or row["error_code"] is None:
        return False
    if row["error_code"] in {code.value for code in BLOCKING_FAILURE_CLASSES}:
        return True
    return bool(
        row["error_code"] == FailureClass.RUNNER_CRASHED.value
        and row["consecutive_errors"] >= CRASH_LOOP_LIMIT
    )
