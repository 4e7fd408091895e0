"""The ``runs`` table and the records a run is created with: the one module that writes them.

Tables owned here: ``runs``, ``run_sources``, ``run_bindings``, ``projects`` and
``workflow_definitions``. Every read of a run goes through one row type, :class:`RunRow`: the
run row with its queue row (``run_queue``, written by :mod:`piwf.state.execution.queue`), its
revision, its workflow name and project path, and whether it holds an ambiguous effect. Run
input and final output are JSON blobs, the run error is a text blob; each is read through its
own named reader, so a text error is never parsed as JSON.

The writers here change one table each and never commit, record an event or check a claim: the
transitions of :mod:`piwf.state.execution` compose them with the revision, event and claim of
one change. Each writer states its precondition in its ``WHERE`` clause.

Display status is derived in one place (:func:`display_status`) with the seed's precedence:
terminal > ambiguous effect > durable pause > pending request (``waiting``) > active work
(``running``) > parked or admitted (``queued``); the closed set is the protocol's
``RunDisplayStatus`` (the seed's). A run parked until someone acts is ``queued`` with the
activity ``blocked`` and its reason in the view.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.errors import BlobConflictError
from piwf.lifecycle import TERMINAL_RUN_STATUSES, Lineage, RunStatus
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
from piwf.state.execution import queue
from piwf.state.records import Actor, ensure_resource, record_change, resource_id_for
from piwf.workflow.sources import ReferenceKind

_SELECT_RUN = """
SELECT r.run_id, r.resource_id, r.workflow_ref, d.workflow_name, r.title, r.status, r.paused,
       r.status_detail, r.lineage_kind, r.parent_run_id, r.root_run_id, r.restart_number,
       r.definition_digest, r.input_hash, r.final_output_hash, r.error_hash, p.canonical_path,
       r.created_at, r.updated_at, r.finished_at, q.status AS queue_status, q.error_code,
       q.available_at, q.consecutive_errors, res.revision,
       EXISTS (SELECT 1 FROM effects e WHERE e.source_resource_id = r.resource_id
               AND e.status = 'ambiguous') AS has_ambiguous_effect,
       EXISTS (SELECT 1 FROM interactive_requests i WHERE i.run_id = r.run_id
               AND i.status = 'pending' AND i.kind != 'agent') AS has_person_request
FROM runs r
JOIN workflow_definitions d ON d.definition_digest = r.definition_digest
JOIN resources res ON res.resource_id = r.resource_id
LEFT JOIN projects p ON p.project_id = r.project_id
LEFT JOIN run_queue q ON q.run_id = r.run_id
"""

_INSERT_DEFINITION = """
INSERT INTO workflow_definitions (definition_digest, workflow_name, created_at)
VALUES (?, ?, ?) ON CONFLICT (definition_digest) DO NOTHING
"""

_INSERT_PROJECT = """
INSERT INTO projects (project_id, canonical_path, created_at) VALUES (?, ?, ?)
ON CONFLICT (project_id) DO NOTHING
"""

_INSERT_RUN = """
INSERT INTO runs (run_id, resource_id, project_id, root_run_id, definition_digest, workflow_ref,
                  launch_options_hash, title, status, input_hash, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?)
"""

_INSERT_BINDING = """
INSERT INTO run_bindings (run_id, origin_session_id, execution_mode, created_at)
VALUES (?, ?, ?, ?)
"""

_INSERT_SOURCE = """
INSERT INTO run_sources (run_id, mount_path, reference_kind, reference, source_type, source_ref,
                         source_revision, piwf_version)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

_SELECT_SOURCES = """
SELECT mount_path, source_type, source_ref, source_revision, reference_kind, reference, piwf_version
FROM run_sources WHERE run_id = ? ORDER BY mount_path
"""

_INSERT_RESTART_RUN = """
INSERT INTO runs (run_id, resource_id, project_id, parent_run_id, root_run_id, lineage_kind,
                  restart_number, parent_terminal_fingerprint, definition_digest, workflow_ref,
                  launch_options_hash, title, status, input_hash, created_at, updated_at)
SELECT :child, :resource, project_id, run_id, root_run_id, :lineage, restart_number + 1,
       :fingerprint, definition_digest, workflow_ref, launch_options_hash, title, 'queued',
       input_hash, :now, :now
FROM runs WHERE run_id = :parent
"""

_COPY_SOURCES = """
INSERT INTO run_sources (run_id, mount_path, reference_kind, reference, source_type, source_ref,
                         source_revision, piwf_version)
SELECT ?, mount_path, reference_kind, reference, source_type, source_ref, source_revision,
       piwf_version FROM run_sources WHERE run_id = ?
"""

_COPY_BINDING = """
INSERT INTO run_bindings (run_id, origin_session_id, execution_mode, created_at)
SELECT ?, origin_session_id, execution_mode, ? FROM run_bindings WHERE run_id = ?
"""

_SELECT_RESTART_CHILD = """
SELECT run_id FROM runs WHERE parent_run_id = ? AND lineage_kind = 'restart'
"""

_SET_STATUS = "UPDATE runs SET status = ?, updated_at = ? WHERE run_id = ?"

_START = """
UPDATE runs SET status = 'running', updated_at = ?
WHERE run_id = ? AND status IN ('queued', 'running')
"""

_RESUME_WAITING = """
UPDATE runs SET status = 'running', updated_at = ? WHERE run_id = ? AND status = 'waiting'
"""

_SET_TITLE = "UPDATE runs SET title = ?, updated_at = ? WHERE run_id = ?"

_SET_PAUSED = "UPDATE runs SET paused = ?, updated_at = ? WHERE run_id = ?"

_FINISH = """
UPDATE runs SET status = ?, final_output_hash = ?, error_hash = ?, finished_at = ?, updated_at = ?,
                paused = 0
WHERE run_id = ? AND status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
"""

_SELECT_INPUT = "SELECT input_hash FROM runs WHERE run_id = ?"
_SELECT_FINAL_OUTPUT = "SELECT final_output_hash FROM runs WHERE run_id = ?"
_SELECT_ERROR = "SELECT error_hash FROM runs WHERE run_id = ?"


@dataclass(frozen=True)
class SourceFile:
    """One mount of a run (``""``: the root): its reference and the file that resolved to."""

    mount_path: str
    source_type: SourceType
    source_ref: str
    source_revision: str
    reference_kind: ReferenceKind
    reference: str
    piwf_version: str | None = None


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
    #: The origin session an interactive run is bound to (None: headless).
    session_id: str | None = None


@dataclass(frozen=True)
class RunRow:
    """A run with its queue row: the one shape every reader of ``runs`` and ``run_queue`` gets.

    The hashes name blobs (read them with the named readers below); :meth:`to_json` is what
    clients see and carries no payloads, tokens, hashes or actor ids.
    """

    run_id: str
    resource_id: str
    workflow_ref: str
    workflow_name: str
    title: str | None
    status: RunStatus
    paused: bool
    status_detail: str | None
    lineage: Lineage
    parent_run_id: str | None
    root_run_id: str
    restart_number: int
    definition_digest: bytes
    input_hash: bytes
    final_output_hash: bytes | None
    error_hash: bytes | None
    #: The canonical project directory the run was started in, if any.
    project_path: str | None
    created_at: int
    updated_at: int
    finished_at: int | None
    queue_status: QueueStatus | None
    error_code: str | None
    available_at: int | None
    consecutive_errors: int
    revision: int
    has_ambiguous_effect: bool
    #: A checkpoint or protected decision of the run waits for its answer.
    has_person_request: bool

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

    @property
    def display_status(self) -> str:
        """The one display status every renderer shows (see :func:`display_status`)."""
        return display_status(
            self.status,
            paused=self.paused,
            has_ambiguous_effect=self.has_ambiguous_effect,
            has_pending_request=False,
            queue_status=self.queue_status,
        )

    @property
    def needs_action(self) -> bool:
        """Stopped until an operator acts: paused, or parked for a blocking failure class.

        A ``runnerCrashed`` streak that reached :data:`CRASH_LOOP_LIMIT` blocks too (the
        scheduler's own rule); ``error_code`` says which.
        """
        if self.terminal:
            return False
        if self.paused:
            return True
        if self.queue_status is not QueueStatus.PARKED or self.error_code is None:
            return False
        if self.error_code in {code.value for code in BLOCKING_FAILURE_CLASSES}:
            return True
        return bool(
            self.error_code == FailureClass.RUNNER_CRASHED.value
            and self.consecutive_errors >= CRASH_LOOP_LIMIT
        )

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
            # As the run view's activity ``waitingForPerson``: not while paused or ambiguous.
            "waitingForPerson": self.has_person_request and self.display_status == "waiting",
            "lineage": self.lineage.value,
            "parentRunId": self.parent_run_id,
            "rootRunId": self.root_run_id,
            "restartNumber": self.restart_number,
            "definitionDigest": self.definition_digest.hex(),
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
    if status in TERMINAL_RUN_STATUSES:
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


#: What every run id starts with (a client may choose the rest: ``run.start``'s ``runId``).
RUN_ID_PREFIX = "run-"


def new_run_id() -> str:
    """Return a fresh, unguessable run id."""
    return f"{RUN_ID_PREFIX}{secrets.token_hex(10)}"


def run_resource_id(run_id: str) -> str:
    """Return the resource id of a run aggregate."""
    return resource_id_for(ResourceType.RUN, run_id)


# Reads -------------------------------------------------------------------------------------


_SELECT_RUN_REVISION = """
SELECT res.revision FROM runs r JOIN resources res ON res.resource_id = r.resource_id
WHERE r.run_id = ?
"""


def read_run_revision(tx: Transaction, run_id: str) -> int | None:
    """The run's revision now (None: no such run), without reading the rest of it."""
    found = tx.scalar(_SELECT_RUN_REVISION, (run_id,))
    return None if found is None else int(found)


def load_run(tx: Transaction, run_id: str) -> RunRow | None:
    """Return the run, or None when there is no such run. Any transaction."""
    row = tx.one(_SELECT_RUN + " WHERE r.run_id = ?", (run_id,))
    return None if row is None else _row(row)


def require_run(tx: Transaction, run_id: str) -> RunRow:
    """Return the run; raises ``LookupError`` when there is no such run."""
    run = load_run(tx, run_id)
    if run is None:
        raise LookupError(f"no run {run_id}")
    return run


def list_runs(
    tx: Transaction,
    *,
    limit: int = 50,
    before: tuple[int, str] | None = None,
    display: str | None = None,
) -> list[RunRow]:
    """Return runs newest first; ``before`` = (created_at, run_id) of the last row seen;
    ``display``: only runs with that display status.

    A terminal display status is the run's status (an indexed filter). The others are derived
    (:func:`display_status`), so they are chosen among the unfinished runs only: the work in
    flight, never the history.
    """
    clauses: list[str] = []
    params: list[object] = []
    if before is not None:
        clauses.append("(r.created_at, r.run_id) < (?, ?)")
        params += [before[0], before[1]]
    terminal = {status.value for status in TERMINAL_RUN_STATUSES}
    if display is not None:
        if display in terminal:
            clauses.append("r.status = ?")
            params.append(display)
        else:
            marks = ", ".join("?" for _ in terminal)
            clauses.append(f"r.status NOT IN ({marks})")
            params += sorted(terminal)
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    order = " ORDER BY r.created_at DESC, r.run_id DESC"
    if display is None or display in terminal:
        rows = tx.all(_SELECT_RUN + where + order + " LIMIT ?", (*params, limit))
        return [_row(row) for row in rows]
    found = [_row(row) for row in tx.all(_SELECT_RUN + where + order, tuple(params))]
    return [run for run in found if run.display_status == display][:limit]


def restart_child_of(tx: Transaction, run_id: str) -> str | None:
    """Return the id of the run that restarts ``run_id`` (at most one exists), or None."""
    found = tx.scalar(_SELECT_RESTART_CHILD, (run_id,))
    return None if found is None else str(found)


def list_run_sources(tx: Transaction, run_id: str) -> list[SourceFile]:
    """Return the recorded sources of a run, root first."""
    rows = tx.all(_SELECT_SOURCES, (run_id,))
    return [
        SourceFile(r[0], SourceType(r[1]), r[2], r[3], ReferenceKind(r[4]), r[5], r[6])
        for r in rows
    ]


def read_run_input(tx: Transaction, run_id: str) -> JsonValue:
    """Return the run input (a JSON blob); raises ``LookupError`` for an unknown run."""
    digest = tx.scalar(_SELECT_INPUT, (run_id,))
    if digest is None:
        raise LookupError(f"no run {run_id}")
    return blobs.read_json(tx, bytes(digest))


def read_run_final_output(tx: Transaction, run_id: str) -> JsonValue:
    """Return the final output of a completed run, or None."""
    digest = tx.scalar(_SELECT_FINAL_OUTPUT, (run_id,))
    return None if digest is None else blobs.read_json(tx, bytes(digest))


def read_run_error(tx: Transaction, run_id: str) -> str | None:
    """Return the error text of a failed run, or None."""
    digest = tx.scalar(_SELECT_ERROR, (run_id,))
    return None if digest is None else blobs.read_text(tx, bytes(digest))


# Writes (inside the caller's one change) ---------------------------------------------------


def create_run(tx: Transaction, run_id: str, new: NewRun, actor: Actor) -> RunRow:
    """Commit a ``queued`` run with its queue row, sources, binding and definition.

    The definition snapshot must hash to ``definition_digest`` (:class:`BlobConflictError`
    otherwise). Raises ``sqlite3.IntegrityError`` if ``run_id`` exists. Event ``run.created``.
    """
    snapshot_hash = blobs.put_json(tx, new.definition_snapshot)
    if snapshot_hash != new.definition_digest:
        raise BlobConflictError("definition snapshot does not match its digest")
    tx.execute(_INSERT_DEFINITION, (snapshot_hash, new.workflow_name, tx.now))
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
    queue.insert_queued(tx, run_id)
    mode = ExecutionMode.HEADLESS if new.session_id is None else ExecutionMode.INTERACTIVE
    tx.execute(_INSERT_BINDING, (run_id, new.session_id, mode.value, tx.now))
    for source in new.sources:
        tx.execute(
            _INSERT_SOURCE,
            (
                run_id,
                source.mount_path,
                source.reference_kind.value,
                source.reference,
                source.source_type.value,
                source.source_ref,
                source.source_revision,
                source.piwf_version,
            ),
        )
    return require_run(tx, run_id)


def insert_restart(
    tx: Transaction,
    parent: RunRow,
    *,
    child_id: str,
    child_resource_id: str,
    fingerprint: bytes | None,
    lineage: Lineage = Lineage.RESTART,
) -> None:
    """Insert the ``queued`` restart (or fork) child of ``parent``: its queue row, sources and
    binding, the parent's definition, input, project, title, launch options, ``lineage``,
    ``restart_number + 1`` and ``fingerprint`` (a restart's only). The caller checked it may."""
    tx.execute(
        _INSERT_RESTART_RUN,
        {
            "child": child_id,
            "resource": child_resource_id,
            "fingerprint": fingerprint,
            "lineage": lineage.value,
            "now": tx.now,
            "parent": parent.run_id,
        },
    )
    queue.insert_queued(tx, child_id)
    copy_sources(tx, child_id, parent.run_id)
    tx.execute(_COPY_BINDING, (child_id, tx.now, parent.run_id))


def copy_sources(tx: Transaction, run_id: str, from_run_id: str) -> None:
    """Record ``from_run_id``'s sources as ``run_id``'s: the same files, never discovered again."""
    tx.execute(_COPY_SOURCES, (run_id, from_run_id))


def set_status(tx: Transaction, run_id: str, status: RunStatus) -> None:
    """Set a non-terminal run's status (``waiting`` or ``running``); the queue row is separate."""
    if status in TERMINAL_RUN_STATUSES or status is RunStatus.PARKED:
        raise ValueError(f"{status.value} is not set directly (finish or cancel the run)")
    tx.execute(_SET_STATUS, (status.value, tx.now, run_id))


def mark_started(tx: Transaction, run_id: str) -> None:
    """A ``queued`` or ``running`` run becomes ``running`` (it has been claimed for a runner)."""
    tx.execute(_START, (tx.now, run_id))


def resume_waiting(tx: Transaction, run_id: str) -> None:
    """A ``waiting`` run becomes ``running`` again (its request was answered)."""
    tx.execute(_RESUME_WAITING, (tx.now, run_id))


def set_title(tx: Transaction, run_id: str, title: str) -> None:
    """Record the run's title."""
    tx.execute(_SET_TITLE, (title, tx.now, run_id))


def set_paused(tx: Transaction, run_id: str, paused: bool) -> None:
    """Set or clear the durable pause flag."""
    tx.execute(_SET_PAUSED, (int(paused), tx.now, run_id))


def finish(
    tx: Transaction,
    run_id: str,
    status: RunStatus,
    *,
    output_hash: bytes | None = None,
    error_hash: bytes | None = None,
) -> None:
    """Give a non-terminal run its terminal ``status``, final output or error and finish time;
    clear its pause flag (a finished run is never paused: nothing is left to hold back)."""
    if status not in TERMINAL_RUN_STATUSES:
        raise ValueError(f"{status.value} is not a terminal status")
    tx.execute(_FINISH, (status.value, output_hash, error_hash, tx.now, tx.now, run_id))


def _ensure_project(tx: Transaction, canonical_path: str) -> str:
    project_id = "project-" + hashlib.sha256(canonical_path.encode("utf-8")).hexdigest()[:40]
    tx.execute(_INSERT_PROJECT, (project_id, canonical_path, tx.now))
    return project_id


def _row(row: sqlite3.Row) -> RunRow:
    return RunRow(
        run_id=row["run_id"],
        resource_id=row["resource_id"],
        workflow_ref=row["workflow_ref"],
        workflow_name=row["workflow_name"],
        title=row["title"],
        status=RunStatus(row["status"]),
        paused=bool(row["paused"]),
        status_detail=row["status_detail"],
        lineage=Lineage.ROOT if row["lineage_kind"] is None else Lineage(row["lineage_kind"]),
        parent_run_id=row["parent_run_id"],
        root_run_id=row["root_run_id"],
        restart_number=row["restart_number"],
        definition_digest=bytes(row["definition_digest"]),
        input_hash=bytes(row["input_hash"]),
        final_output_hash=_optional_bytes(row["final_output_hash"]),
        error_hash=_optional_bytes(row["error_hash"]),
        project_path=row["canonical_path"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
        queue_status=None if row["queue_status"] is None else QueueStatus(row["queue_status"]),
        error_code=row["error_code"],
        available_at=row["available_at"],
        consecutive_errors=row["consecutive_errors"] or 0,
        revision=row["revision"],
        has_ambiguous_effect=bool(row["has_ambiguous_effect"]),
        has_person_request=bool(row["has_person_request"]),
    )


def _optional_bytes(value: bytes | None) -> bytes | None:
    return None if value is None else bytes(value)
