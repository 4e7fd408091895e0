"""Live settings: the only writer of ``workflow_settings``, ``workflow_setting_changes`` and
``attempt_settings`` (:mod:`piwf.state.schema.settings`).

::

    node_started(scope)  ── open_copy: the scope (created with its initial value, change 0)
                            and its newest copy ── stamp_attempt: the attempt keeps that copy
    run.changeSettings   ── accept_change: change N+1 (only on top of change N: a change
                            computed from an older value is a Conflict), event
                            ``settings.changed`` on the scope's own aggregate

A change never touches the run's revision: a runner working meanwhile keeps its authority,
and only its later attempts see the change.
"""

from __future__ import annotations

import secrets
import sqlite3
from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.lifecycle import Conflict
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import ResourceType
from piwf.state.records import Actor, ensure_resource, read_revision, record_change
from piwf.workflow.port import SettingsCopy, SettingsScope

_SELECT_SCOPE = """
SELECT s.scope_id, s.resource_id, s.run_id, s.mount_path, s.invocation,
  s.change_number, s.current_hash, s.updated_at FROM workflow_settings s
WHERE s.run_id = ? AND s.mount_path = ? AND s.invocation = ?
"""

_SELECT_NEWEST_SCOPE = """
SELECT s.scope_id, s.resource_id, s.run_id, s.mount_path, s.invocation,
  s.change_number, s.current_hash, s.updated_at FROM workflow_settings s
WHERE s.run_id = ? AND s.mount_path = ? ORDER BY s.invocation DESC LIMIT 1
"""

_SELECT_RUN_SCOPES = """
SELECT s.scope_id, s.resource_id, s.run_id, s.mount_path, s.invocation,
  s.change_number, s.current_hash, s.updated_at FROM workflow_settings s
WHERE s.run_id = ? ORDER BY s.mount_path, s.invocation
"""

# The run's newest scopes (by creation: rowid order), shown by mount path and entry.
_SELECT_NEWEST_RUN_SCOPES = """
SELECT s.scope_id, s.resource_id, s.run_id, s.mount_path, s.invocation,
  s.change_number, s.current_hash, s.updated_at FROM workflow_settings s
WHERE s.rowid IN (SELECT rowid FROM workflow_settings WHERE run_id = ? ORDER BY rowid DESC LIMIT ?)
ORDER BY s.mount_path, s.invocation
"""

# The newest entries of one mount of the run (the unique key's index), newest first.
_SELECT_NEWEST_MOUNT_SCOPES = """
SELECT s.scope_id, s.resource_id, s.run_id, s.mount_path, s.invocation,
  s.change_number, s.current_hash, s.updated_at FROM workflow_settings s
WHERE s.run_id = ? AND s.mount_path = ? ORDER BY s.invocation DESC LIMIT ?
"""

_COUNT_RUN_SCOPES = "SELECT count(*) FROM workflow_settings WHERE run_id = ?"
_COUNT_MOUNT_SCOPES = "SELECT count(*) FROM workflow_settings WHERE run_id = ? AND mount_path = ?"

_INSERT_SCOPE = """
INSERT INTO workflow_settings (scope_id, resource_id, run_id, mount_path, invocation,
  change_number, initial_hash, current_hash, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?)
"""

_INSERT_ATTEMPT = """
INSERT INTO attempt_settings (attempt_id, scope_id, change_number, settings_hash)
VALUES (?, ?, ?, ?)
"""

_SELECT_ATTEMPT = """
SELECT change_number, settings_hash FROM attempt_settings WHERE attempt_id = ?
"""

_UPDATE_SCOPE = """
UPDATE workflow_settings SET change_number = ?, current_hash = ?, updated_at = ?
WHERE scope_id = ? AND change_number = ?
"""

_INSERT_CHANGE = """
INSERT INTO workflow_setting_changes (change_id, scope_id, request_id, change_number,
  actor_type, actor_id, patch_hash, before_hash, after_hash, accepted_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

_SELECT_CHANGE_BY_REQUEST = """
SELECT change_id, change_number, request_id, actor_type, patch_hash,
  after_hash, accepted_at FROM workflow_setting_changes WHERE scope_id = ? AND request_id = ?
"""

_SELECT_CHANGES = """
SELECT change_id, change_number, request_id, actor_type, patch_hash,
  after_hash, accepted_at FROM workflow_setting_changes WHERE scope_id = ?
ORDER BY change_number DESC LIMIT ?
"""


@dataclass(frozen=True)
class ScopeRow:
    """One settings scope and its newest value."""

    scope_id: str
    resource_id: str
    run_id: str
    mount_path: str
    invocation: int
    change_number: int
    value: JsonValue
    updated_at_ms: int

    @property
    def copy(self) -> SettingsCopy:
        return SettingsCopy(self.change_number, self.value)


@dataclass(frozen=True)
class ChangeRow:
    """One accepted change (``actor_type`` is ``human`` or ``session``; the actor's id is
    kept private)."""

    change_id: str
    change_number: int
    request_id: str
    actor_type: str
    patch: JsonValue
    value: JsonValue
    accepted_at_ms: int


def open_copy(tx: Transaction, run_id: str, scope: SettingsScope) -> ScopeRow:
    """The scope of ``scope`` (created now with its initial value if it does not exist)."""
    found = _scope(tx, _SELECT_SCOPE, (run_id, scope.mount_path, scope.invocation))
    if found is not None:
        return found
    scope_id = f"settings-{secrets.token_hex(8)}"
    resource_id = ensure_resource(tx, ResourceType.SETTINGS, scope_id)
    initial = blobs.put_json(tx, scope.initial)
    tx.execute(
        _INSERT_SCOPE,
        (
            scope_id,
            resource_id,
            run_id,
            scope.mount_path,
            scope.invocation,
            initial,
            initial,
            tx.now,
            tx.now,
        ),
    )
    return ScopeRow(
        scope_id, resource_id, run_id, scope.mount_path, scope.invocation, 0, scope.initial, tx.now
    )


def stamp_attempt(tx: Transaction, attempt_id: str, scope: ScopeRow) -> SettingsCopy:
    """Record that ``attempt_id`` starts with ``scope``'s newest copy; return that copy."""
    tx.execute(
        _INSERT_ATTEMPT,
        (attempt_id, scope.scope_id, scope.change_number, blobs.put_json(tx, scope.value)),
    )
    return scope.copy


def attempt_copy(tx: Transaction, attempt_id: str) -> SettingsCopy | None:
    """The copy ``attempt_id`` started with, or ``None`` (its workflow declares none)."""
    row = tx.one(_SELECT_ATTEMPT, (attempt_id,))
    if row is None:
        return None
    return SettingsCopy(int(row["change_number"]), blobs.read_json(tx, row["settings_hash"]))


def newest_scope(tx: Transaction, run_id: str, mount_path: str) -> ScopeRow | None:
    """The scope of the latest entry of ``mount_path`` (``""``: the root) in ``run_id``."""
    return _scope(tx, _SELECT_NEWEST_SCOPE, (run_id, mount_path))


def run_scopes(tx: Transaction, run_id: str, newest: int | None = None) -> list[ScopeRow]:
    """Every settings scope of ``run_id`` (or the ``newest`` created last), by mount path and
    entry. A loop that enters a mount with settings adds a scope on every entry."""
    if newest is None:
        rows = tx.all(_SELECT_RUN_SCOPES, (run_id,))
    else:
        rows = tx.all(_SELECT_NEWEST_RUN_SCOPES, (run_id, newest))
    return [_scope_row(tx, row) for row in rows]


def mount_scopes(tx: Transaction, run_id: str, mount_path: str, newest: int) -> list[ScopeRow]:
    """The scopes of the ``newest`` latest entries of ``mount_path`` (``""``: the root) in
    ``run_id``, oldest first; the cost follows ``newest``, not how often the run entered it."""
    rows = tx.all(_SELECT_NEWEST_MOUNT_SCOPES, (run_id, mount_path, newest))
    return [_scope_row(tx, row) for row in reversed(rows)]


def count_scopes(tx: Transaction, run_id: str, mount_path: str | None = None) -> int:
    """How many settings scopes ``run_id`` has (of ``mount_path`` only, when given)."""
    if mount_path is None:
        return int(tx.scalar(_COUNT_RUN_SCOPES, (run_id,)))
    return int(tx.scalar(_COUNT_MOUNT_SCOPES, (run_id, mount_path)))


def change_by_request(tx: Transaction, scope_id: str, request_id: str) -> ChangeRow | None:
    """The change ``request_id`` made to the scope, if one was accepted."""
    row = tx.one(_SELECT_CHANGE_BY_REQUEST, (scope_id, request_id))
    return None if row is None else _change_row(tx, row)


def recent_changes(tx: Transaction, scope_id: str, limit: int = 20) -> list[ChangeRow]:
    """The scope's newest changes, newest first."""
    return [_change_row(tx, row) for row in tx.all(_SELECT_CHANGES, (scope_id, limit))]


def accept_change(
    tx: Transaction,
    scope: ScopeRow,
    *,
    based_on: int,
    request_id: str,
    actor: Actor,
    patch: JsonValue,
    value: JsonValue,
) -> ChangeRow | Conflict:
    """Make ``value`` (``patch`` applied to change ``based_on``) change ``based_on`` + 1.

    A change computed from another value than the newest is a ``Conflict`` and writes
    nothing. Event ``settings.changed`` (the patch, never the value) on the scope's aggregate.
    """
    current = _scope(tx, _SELECT_SCOPE, (scope.run_id, scope.mount_path, scope.invocation))
    if current is None or current.change_number != based_on:
        newest = "none" if current is None else str(current.change_number)
        return Conflict(f"the settings are at change {newest}, not {based_on}")
    number = based_on + 1
    payload = {
        "runId": scope.run_id,
        "mountPath": scope.mount_path,
        "invocation": scope.invocation,
        "changeNumber": number,
        "requestId": request_id,
        "patch": patch,
    }
    revision = read_revision(tx, scope.resource_id) or 0
    record_change(tx, scope.resource_id, revision, "settings.changed", actor, payload=payload)
    after = blobs.put_json(tx, value)
    before = blobs.put_json(tx, current.value)
    tx.execute(_UPDATE_SCOPE, (number, after, tx.now, scope.scope_id, based_on))
    change_id = f"change-{secrets.token_hex(8)}"
    tx.execute(
        _INSERT_CHANGE,
        (
            change_id,
            scope.scope_id,
            request_id,
            number,
            actor.actor_type.value,
            actor.actor_id,
            blobs.put_json(tx, patch),
            before,
            after,
            tx.now,
        ),
    )
    return ChangeRow(change_id, number, request_id, actor.actor_type.value, patch, value, tx.now)


def _scope(tx: Transaction, sql: str, params: tuple[object, ...]) -> ScopeRow | None:
    row = tx.one(sql, params)
    return None if row is None else _scope_row(tx, row)


def _scope_row(tx: Transaction, row: sqlite3.Row) -> ScopeRow:
    return ScopeRow(
        scope_id=row["scope_id"],
        resource_id=row["resource_id"],
        run_id=row["run_id"],
        mount_path=row["mount_path"],
        invocation=int(row["invocation"]),
        change_number=int(row["change_number"]),
        value=blobs.read_json(tx, row["current_hash"]),
        updated_at_ms=int(row["updated_at"]),
    )


def _change_row(tx: Transaction, row: sqlite3.Row) -> ChangeRow:
    return ChangeRow(
        change_id=row["change_id"],
        change_number=int(row["change_number"]),
        request_id=row["request_id"],
        actor_type=row["actor_type"],
        patch=blobs.read_json(tx, row["patch_hash"]),
        value=blobs.read_json(tx, row["after_hash"]),
        accepted_at_ms=int(row["accepted_at"]),
    )
