"""Managed resources: the object (spec, status, conditions, finalizers), its queue row, its views.

A resource is the aggregate ``managed_resource:<uid>``; its ``resources.revision`` is the
resource version. Every write here bumps it once with one event, in the caller's transaction::

    apply (new key)        -> created: generation 1, initial status, queued ``applied``
    apply (other spec)     -> generation + 1, queued ``applied``
    apply (same spec)      -> Adopted, nothing written
    delete (no finalizers, no live reconcile) -> removed at once (event ``resource.deleted``)
    delete (otherwise)     -> deletion timestamp set, queued ``deleting``
    reconcile request      -> queued ``requested`` (the object is unchanged: no new version)

The removed resource keeps its ``resources`` row and events as its audit, so a uid is never
reused. Queue rows are scheduling state, not part of the object: enqueueing never changes the
resource version. Reconcile claims, results and recovery live in
:mod:`piwf.state.resources.reconciles`.
"""

from __future__ import annotations

import secrets
import shlex
import sqlite3
from dataclasses import dataclass
from typing import Any

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import ResourceQueueReason, ResourceType
from piwf.state.leases import read_lease
from piwf.state.records import Actor, ensure_resource, read_revision, record_change, resource_id_for

_SELECT_RESOURCE = """
SELECT m.uid, m.resource_id, m.manager_name, m.resource_key, m.project_path, m.source_path,
       m.source_digest, m.timeout_ms, m.generation, m.observed_generation, m.spec_hash,
       m.status_hash, m.conditions_hash, m.deletion_requested_at, m.created_at, m.updated_at,
       res.revision
FROM managed_resources m JOIN resources res ON res.resource_id = m.resource_id
"""

_INSERT_RESOURCE = """
INSERT INTO managed_resources (uid, resource_id, manager_name, resource_key, project_path,
                               source_path, source_digest, timeout_ms, generation,
                               observed_generation, spec_hash, status_hash, conditions_hash,
                               created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, 0, ?, ?, ?, ?, ?)
"""

_UPDATE_SPEC = """
UPDATE managed_resources
SET generation = generation + ?, spec_hash = ?, project_path = ?, source_path = ?,
    source_digest = ?, timeout_ms = ?, updated_at = ?
WHERE uid = ?
"""

# An event wakes the resource at once, even out of an error backoff; the queue version grows so
# that a reconcile already running does not drop this newer reason when it settles.
_ENQUEUE = """
INSERT INTO managed_resource_queue (uid, available_at, reason, queue_version,
                                    consecutive_errors, created_at, updated_at)
VALUES (:uid, :now, :reason, 1, 0, :now, :now)
ON CONFLICT (uid) DO UPDATE
SET available_at = min(available_at, :now), reason = :reason,
    queue_version = queue_version + 1, updated_at = :now
"""

# A result-driven schedule sets the due time exactly (a backoff must not be shortened by min()).
_SCHEDULE = """
INSERT INTO managed_resource_queue (uid, available_at, reason, queue_version,
                                    consecutive_errors, last_error_hash, created_at, updated_at)
VALUES (:uid, :at, :reason, 1, :errors, :error, :now, :now)
ON CONFLICT (uid) DO UPDATE
SET available_at = :at, reason = :reason, queue_version = queue_version + 1,
    consecutive_errors = :errors, last_error_hash = :error, updated_at = :now
"""

_DEQUEUE = "DELETE FROM managed_resource_queue WHERE uid = ? AND queue_version = ?"

_COUNT_DUE = "SELECT count(*) FROM managed_resource_queue WHERE available_at <= ?"

_HAS_QUEUED = "SELECT EXISTS (SELECT 1 FROM managed_resource_queue)"

_SET_STATUS = """
UPDATE managed_resources SET status_hash = ?, conditions_hash = ?, observed_generation = ?,
       updated_at = ?
WHERE uid = ?
"""

_DELETE_FINALIZERS = "DELETE FROM managed_resource_finalizers WHERE uid = ?"

_INSERT_FINALIZER = """
INSERT INTO managed_resource_finalizers (uid, finalizer, position) VALUES (?, ?, ?)
"""

_SELECT_QUEUE = """
SELECT available_at, reason, queue_version, consecutive_errors, last_error_hash
FROM managed_resource_queue WHERE uid = ?
"""

_SELECT_FINALIZERS = """
SELECT finalizer FROM managed_resource_finalizers WHERE uid = ? ORDER BY position
"""


@dataclass(frozen=True)
class ResolvedManager:
    """What a source-resolver child computed for an apply: the manager file, its SHA-256, its
    reconcile deadline and the initial status of the spec."""

    source_path: str
    source_digest: str
    timeout_ms: int
    initial_status: dict[str, JsonValue]


@dataclass(frozen=True)
class ResourceRow:
    """One managed resource row with its resource version (the aggregate revision)."""

    uid: str
    resource_id: str
    manager: str
    key: str
    project_path: str | None
    source_path: str
    source_digest: str
    timeout_ms: int
    generation: int
    observed_generation: int
    spec_hash: bytes
    status_hash: bytes
    conditions_hash: bytes
    deletion_requested_at: int | None
    created_at: int
    updated_at: int
    resource_version: int


@dataclass(frozen=True)
class QueueRow:
    """A resource's queue row: when it is due, why, and its error streak."""

    available_at: int
    reason: ResourceQueueReason
    queue_version: int
    consecutive_errors: int
    last_error: str | None


@dataclass(frozen=True)
class ResourceView:
    """A resource as clients see it: the object plus its queue and reconcile state."""

    row: ResourceRow
    spec: JsonValue
    status: JsonValue
    conditions: list[dict[str, JsonValue]]
    finalizers: list[str]
    queue: QueueRow | None
    reconciling: bool

    @property
    def state(self) -> str:
        """One word for lists: deleting, reconciling, backoff, queued or settled."""
        if self.row.deletion_requested_at is not None:
            return "deleting"
        if self.reconciling:
            return "reconciling"
        if self.queue is not None and self.queue.consecutive_errors > 0:
            return "backoff"
        if self.queue is not None:
            return "queued"
        return "settled"

    @property
    def ready(self) -> str | None:
        """The status of the ``Ready`` condition, if the manager reports one."""
        found = next((c for c in self.conditions if c.get("type") == "Ready"), None)
        value = None if found is None else found.get("status")
        return value if isinstance(value, str) else None


def managed_resource_id(uid: str) -> str:
    """The aggregate id of a managed resource."""
    return resource_id_for(ResourceType.MANAGED_RESOURCE, uid)


#: What every managed resource's uid starts with.
RESOURCE_UID_PREFIX = "mr-"


def new_uid(tx: Transaction) -> str:
    """A fresh uid that no resource, live or removed, has ever had."""
    while True:
        uid = f"{RESOURCE_UID_PREFIX}{secrets.token_hex(10)}"
        if read_revision(tx, managed_resource_id(uid)) is None:
            return uid


def get_resource(tx: Transaction, manager: str, key: str) -> ResourceRow | None:
    """The live resource of (manager, key), or None."""
    row = tx.one(
        _SELECT_RESOURCE + " WHERE m.manager_name = ? AND m.resource_key = ?", (manager, key)
    )
    return None if row is None else _row(row)


def get_resource_by_uid(tx: Transaction, uid: str) -> ResourceRow | None:
    """The live resource with this uid, or None."""
    row = tx.one(_SELECT_RESOURCE + " WHERE m.uid = ?", (uid,))
    return None if row is None else _row(row)


def list_resources(
    tx: Transaction, *, manager: str | None = None, limit: int = 100
) -> list[ResourceRow]:
    """Live resources ordered by manager and key (one manager's when ``manager`` is given)."""
    if manager is None:
        rows = tx.all(
            _SELECT_RESOURCE + " ORDER BY m.manager_name, m.resource_key LIMIT ?", (limit,)
        )
    else:
        rows = tx.all(
            _SELECT_RESOURCE + " WHERE m.manager_name = ? ORDER BY m.resource_key LIMIT ?",
            (manager, limit),
        )
    return [_row(row) for row in rows]


def read_view(tx: Transaction, row: ResourceRow) -> ResourceView:
    """The client view of ``row`` (spec, status, conditions, finalizers, queue, claim)."""
    conditions = blobs.read_json(tx, row.conditions_hash)
    lease = read_lease(tx, row.resource_id)
    return ResourceView(
        row=row,
        spec=blobs.read_json(tx, row.spec_hash),
        status=blobs.read_json(tx, row.status_hash),
        conditions=[dict(c) for c in conditions if isinstance(c, dict)]
        if isinstance(conditions, list)
        else [],
        finalizers=read_finalizers(tx, row.uid),
        queue=read_queue(tx, row.uid),
        reconciling=lease is not None and lease.is_live(tx.now),
    )


def read_finalizers(tx: Transaction, uid: str) -> list[str]:
    """The resource's finalizers in order."""
    return [str(row[0]) for row in tx.all(_SELECT_FINALIZERS, (uid,))]


def read_queue(tx: Transaction, uid: str) -> QueueRow | None:
    """The resource's queue row, or None when it is settled."""
    row = tx.one(_SELECT_QUEUE, (uid,))
    if row is None:
        return None
    error_hash = row["last_error_hash"]
    return QueueRow(
        available_at=row["available_at"],
        reason=ResourceQueueReason(row["reason"]),
        queue_version=row["queue_version"],
        consecutive_errors=row["consecutive_errors"],
        last_error=None if error_hash is None else blobs.read_text(tx, bytes(error_hash)),
    )


def apply_resource(
    tx: Transaction,
    *,
    manager: str,
    key: str,
    spec: JsonValue,
    resolved: ResolvedManager,
    project_path: str | None,
    actor: Actor,
    expected_version: int | None = None,
) -> Applied[ResourceRow] | Adopted[ResourceRow] | Conflict:
    """Create the resource or change its spec; an equal spec and source is :class:`Adopted`.

    ``expected_version``, when given, must be the current resource version (a new resource
    has version 0). A deleting resource is a :class:`Conflict`. A changed spec bumps the
    generation; a changed manager source alone keeps it. Both enqueue the resource.
    """
    existing = get_resource(tx, manager, key)
    current_version = 0 if existing is None else existing.resource_version
    if expected_version is not None and expected_version != current_version:
        return Conflict(_version_conflict(manager, key, current_version, expected_version))
    spec_hash = blobs.put_json(tx, spec)
    if existing is None:
        return Applied(_create(tx, manager, key, spec_hash, resolved, project_path, actor))
    if existing.deletion_requested_at is not None:
        return Conflict(f"resource {manager}/{key} is being deleted")
    spec_changed = existing.spec_hash != spec_hash
    source_changed = (
        existing.source_path,
        existing.source_digest,
        existing.timeout_ms,
        existing.project_path,
    ) != (resolved.source_path, resolved.source_digest, resolved.timeout_ms, project_path)
    if not spec_changed and not source_changed:
        return Adopted(existing)
    record_change(
        tx,
        existing.resource_id,
        existing.resource_version,
        "resource.spec_changed" if spec_changed else "resource.source_changed",
        actor,
        payload={"generation": existing.generation + int(spec_changed)},
    )
    tx.execute(
        _UPDATE_SPEC,
        (
            int(spec_changed),
            spec_hash,
            project_path,
            resolved.source_path,
            resolved.source_digest,
            resolved.timeout_ms,
            tx.now,
            existing.uid,
        ),
    )
    enqueue(tx, existing.uid, ResourceQueueReason.APPLIED)
    return Applied(_require(tx, existing.uid))


def _create(
    tx: Transaction,
    manager: str,
    key: str,
    spec_hash: bytes,
    resolved: ResolvedManager,
    project_path: str | None,
    actor: Actor,
) -> ResourceRow:
    uid = new_uid(tx)
    resource_id = ensure_resource(tx, ResourceType.MANAGED_RESOURCE, uid)
    record_change(
        tx,
        resource_id,
        0,
        "resource.created",
        actor,
        payload={"manager": manager, "key": key, "generation": 1},
    )
    tx.execute(
        _INSERT_RESOURCE,
        (
            uid,
            resource_id,
            manager,
            key,
            project_path,
            resolved.source_path,
            resolved.source_digest,
            resolved.timeout_ms,
            spec_hash,
            blobs.put_json(tx, resolved.initial_status),
            blobs.put_json(tx, []),
            tx.now,
            tx.now,
        ),
    )
    enqueue(tx, uid, ResourceQueueReason.APPLIED)
    return _require(tx, uid)


def request_deletion(
    tx: Transaction, row: ResourceRow, actor: Actor, *, expected_version: int | None = None
) -> Applied[ResourceRow | None] | Adopted[ResourceRow] | Conflict:
    """Delete the resource: at once when it has no finalizer and no live reconcile, else mark
    it deleting and enqueue it so its manager can finalize. ``Applied(None)`` means removed;
    a resource already deleting is :class:`Adopted`."""
    if expected_version is not None and expected_version != row.resource_version:
        return Conflict(
            _version_conflict(row.manager, row.key, row.resource_version, expected_version)
        )
    if row.deletion_requested_at is not None:
        return Adopted(row)
    lease = read_lease(tx, row.resource_id)
    if not read_finalizers(tx, row.uid) and not (lease is not None and lease.is_live(tx.now)):
        remove_resource(tx, row, actor)
        return Applied(None)
    record_change(tx, row.resource_id, row.resource_version, "resource.deletion_requested", actor)
    tx.execute(
        "UPDATE managed_resources SET deletion_requested_at = ?, updated_at = ? WHERE uid = ?",
        (tx.now, tx.now, row.uid),
    )
    enqueue(tx, row.uid, ResourceQueueReason.DELETING)
    return Applied(_require(tx, row.uid))


def remove_resource(tx: Transaction, row: ResourceRow, actor: Actor, **change: Any) -> None:
    """Remove the resource row (its finalizers, queue row and child requests go with it); the
    aggregate row and events stay as the audit. ``change`` is passed to ``record_change``
    (a reconcile passes its claim)."""
    current = read_revision(tx, row.resource_id)
    assert current is not None
    record_change(
        tx,
        row.resource_id,
        current,
        "resource.deleted",
        actor,
        payload={"manager": row.manager, "key": row.key},
        **change,
    )
    tx.execute("DELETE FROM managed_resources WHERE uid = ?", (row.uid,))


def enqueue(tx: Transaction, uid: str, reason: ResourceQueueReason) -> None:
    """Make the resource due now (creating its queue row); the resource version is unchanged."""
    tx.execute(_ENQUEUE, {"uid": uid, "now": tx.now, "reason": reason.value})


def request_reconcile(tx: Transaction, row: ResourceRow) -> ResourceRow:
    """Enqueue the resource for an immediate reconcile (``piwf resource reconcile``)."""
    enqueue(tx, row.uid, ResourceQueueReason.REQUESTED)
    return row


def schedule(
    tx: Transaction,
    uid: str,
    reason: ResourceQueueReason,
    available_at: int,
    *,
    errors: int,
    error: str | None = None,
) -> None:
    """Make the resource due exactly at ``available_at`` with this error streak (a result's or a
    failure's schedule: a backoff is never shortened); the queue version grows."""
    tx.execute(
        _SCHEDULE,
        {
            "uid": uid,
            "at": available_at,
            "reason": reason.value,
            "errors": errors,
            "error": None if error is None else blobs.put_text(tx, error[:4000]),
            "now": tx.now,
        },
    )


def dequeue(tx: Transaction, uid: str, queue_version: int) -> bool:
    """Drop the resource's queue row if it is still at ``queue_version`` (nothing newer was
    enqueued meanwhile); return whether it was dropped."""
    return tx.execute(_DEQUEUE, (uid, queue_version)).rowcount == 1


def count_ready(tx: Transaction) -> int:
    """How many queue rows are due now (claimed or not)."""
    return int(tx.scalar(_COUNT_DUE, (tx.now,)))


def has_queued(tx: Transaction) -> bool:
    """Whether any resource has a queue row (due now or later): reconcile work is scheduled."""
    return bool(tx.scalar(_HAS_QUEUED))


def write_status(
    tx: Transaction, uid: str, *, status_hash: bytes, conditions_hash: bytes, observed: int
) -> None:
    """Store a reconcile's status, conditions and observed generation (inside its change)."""
    tx.execute(_SET_STATUS, (status_hash, conditions_hash, observed, tx.now, uid))


def replace_finalizers(tx: Transaction, uid: str, finalizers: list[str]) -> None:
    """Replace the resource's finalizer list (order kept)."""
    tx.execute(_DELETE_FINALIZERS, (uid,))
    for position, name in enumerate(finalizers):
        tx.execute(_INSERT_FINALIZER, (uid, name, position))


def spec_size(spec: object) -> int:
    """The canonical JSON size of a spec or status (raises ``CanonicalJsonError``)."""
    return len(canonical.encode(spec))


def _require(tx: Transaction, uid: str) -> ResourceRow:
    found = get_resource_by_uid(tx, uid)
    if found is None:
        raise LookupError(f"no managed resource {uid}")
    return found


def _row(row: sqlite3.Row) -> ResourceRow:
    return ResourceRow(
        uid=row["uid"],
        resource_id=row["resource_id"],
        manager=row["manager_name"],
        key=row["resource_key"],
        project_path=row["project_path"],
        source_path=row["source_path"],
        source_digest=row["source_digest"],
        timeout_ms=row["timeout_ms"],
        generation=row["generation"],
        observed_generation=row["observed_generation"],
        spec_hash=bytes(row["spec_hash"]),
        status_hash=bytes(row["status_hash"]),
        conditions_hash=bytes(row["conditions_hash"]),
        deletion_requested_at=row["deletion_requested_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        resource_version=row["revision"],
    )


def _version_conflict(manager: str, key: str, current: int, expected: int) -> str:
    """Why a change made against another version was refused, and how to make it again."""
    return (
        f"resource {manager}/{key} is at version {current}, not {expected}: someone changed it"
        f" since it was read. Read it again (piwf resource get {manager} {shlex.quote(key)}),"
        " then make the change against the version it shows. Nothing was changed"
    )
