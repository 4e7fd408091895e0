"""The DDL: enums mirror CHECK lists; constraints and partial unique indexes hold."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from enum import Enum

import pytest

from piwf import lifecycle
from piwf.state import StateDatabase, Transaction, blobs
from piwf.state import enums as e
from piwf.state.enums import ResourceType
from piwf.state.records import ensure_resource
from piwf.state.schema import SCHEMA_SQL
from piwf.workflow.sources import ReferenceKind

MIRRORS: list[tuple[str, str, Iterable[Enum]]] = [
    ("resources", "resource_type", e.ResourceType),
    ("leases", "owner_type", e.OwnerType),
    ("events", "actor_type", e.ActorType),
    ("blobs", "media_type", e.MediaType),
    ("effects", "status", lifecycle.EffectStatus),
    ("effects", "recovery", e.EffectRecovery),
    ("effects", "owner_scope", e.EffectOwnerScope),
    ("effect_attempts", "outcome", e.EffectAttemptOutcome),
    # The engine reads a running run with a parked queue row as ``parked``; it is never stored.
    ("runs", "status", set(lifecycle.RunStatus) - {lifecycle.RunStatus.PARKED}),
    # A root run leaves ``lineage_kind`` NULL.
    ("runs", "lineage_kind", set(lifecycle.Lineage) - {lifecycle.Lineage.ROOT}),
    ("run_queue", "status", e.QueueStatus),
    ("node_attempts", "status", e.AttemptStatus),
    ("run_bindings", "execution_mode", e.ExecutionMode),
    ("run_sources", "source_type", e.SourceType),
    ("run_sources", "reference_kind", ReferenceKind),
    ("workflow_messages", "kind", e.MessageKind),
    ("workflow_messages", "status", e.MessageStatus),
    ("workflow_messages", "reason", e.StepReason),
    ("workflow_turns", "state", e.TurnState),
    ("workflow_turns", "stop_reason", e.TurnStopReason),
    ("session_segments", "status", e.SegmentStatus),
    ("attempt_entries", "role", e.AttemptEntryRole),
    ("channels", "adapter_type", e.ChannelAdapterType),
    ("channel_messages", "purpose", e.ChannelMessagePurpose),
    ("channel_messages", "status", e.ChannelMessageStatus),
]


def check_values(table: str, column: str) -> set[str]:
    body = SCHEMA_SQL.split(f"CREATE TABLE {table} (", 1)[1].split(") STRICT", 1)[0]
    match = re.search(rf"\b{column} [^,]*?CHECK \({column} IN \(([^)]*)\)\)", body, re.S)
    assert match, f"no CHECK list for {table}.{column}"
    return set(re.findall(r"'([^']*)'", match.group(1)))


@pytest.mark.parametrize(("table", "column", "enum"), MIRRORS)
def test_each_enum_mirrors_its_check_constraint(
    table: str, column: str, enum: Iterable[Enum]
) -> None:
    assert check_values(table, column) == {member.value for member in enum}


def add_run(
    tx: Transaction,
    run_id: str,
    status: str = "queued",
    finished_at: int | None = None,
    parent: str | None = None,
    lineage: str | None = None,
    fingerprint: bytes | None = None,
    restart_number: int = 0,
) -> None:
    definition = blobs.put_json(tx, {"name": "hello"})
    tx.execute(
        "INSERT INTO workflow_definitions VALUES (?, 'hello', 1) ON CONFLICT DO NOTHING",
        (definition,),
    )
    resource = ensure_resource(tx, ResourceType.RUN, run_id)
    tx.execute(
        "INSERT INTO runs (run_id, resource_id, parent_run_id, root_run_id, lineage_kind,"
        " restart_number, parent_terminal_fingerprint, definition_digest, workflow_ref,"
        " status, input_hash, created_at, updated_at, finished_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'hello', ?, ?, 1, 1, ?)",
        (
            run_id,
            resource,
            parent,
            parent or run_id,
            lineage,
            restart_number,
            fingerprint,
            definition,
            status,
            blobs.put_json(tx, {}),
            finished_at,
        ),
    )


def add_attempt(tx: Transaction, run_id: str, attempt_id: str, status: str, visit: int) -> None:
    finished = None if status in ("pending", "running", "waiting") else 5
    tx.execute(
        "INSERT INTO node_attempts (attempt_id, run_id, node_path, visit, attempt_number,"
        " node_type, status, lease_generation, finished_at, created_at, updated_at)"
        " VALUES (?, ?, 'greet', ?, 1, 'compute', ?, 1, ?, 1, 1)",
        (attempt_id, run_id, visit, status, finished),
    )


# conformance: S9
def test_one_active_attempt_per_run(db: StateDatabase) -> None:
    with db.write() as tx:
        add_run(tx, "run-1", status="running")
        add_attempt(tx, "run-1", "a1", "completed", visit=1)
        add_attempt(tx, "run-1", "a2", "running", visit=2)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"), db.write() as tx:
        add_attempt(tx, "run-1", "a3", "pending", visit=3)
    with db.write() as tx:
        add_run(tx, "run-2", status="running")
        add_attempt(tx, "run-2", "b1", "running", visit=1)


@pytest.mark.parametrize(
    ("status", "finished_at"),
    [("completed", None), ("failed", None), ("queued", 10), ("waiting", 10), ("running", 10)],
)
def test_terminal_status_iff_finished_at(db: StateDatabase, status: str, finished_at: int) -> None:
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"), db.write() as tx:
        add_run(tx, "run-1", status=status, finished_at=finished_at)


def test_terminal_and_open_runs_with_consistent_times_are_accepted(db: StateDatabase) -> None:
    with db.write() as tx:
        add_run(tx, "run-1", status="completed", finished_at=10)
        add_run(tx, "run-2", status="waiting")


def test_restart_lineage_rules(db: StateDatabase) -> None:
    with db.write() as tx:
        add_run(tx, "run-1", status="failed", finished_at=10)
        add_run(
            tx, "run-2", parent="run-1", lineage="restart", fingerprint=b"\1" * 32, restart_number=1
        )
    bad = [
        {"parent": "run-1", "lineage": "restart", "fingerprint": None, "restart_number": 1},
        {"parent": "run-1", "lineage": None, "fingerprint": None, "restart_number": 1},
        {"parent": None, "lineage": "restart", "fingerprint": b"\1" * 32, "restart_number": 0},
        {"parent": None, "lineage": None, "fingerprint": None, "restart_number": 2},
        {"parent": "run-1", "lineage": "restart", "fingerprint": b"\2" * 32, "restart_number": 1},
    ]
    for index, fields in enumerate(bad):
        with pytest.raises(sqlite3.IntegrityError), db.write() as tx:
            add_run(tx, f"run-bad-{index}", **fields)  # type: ignore[arg-type]


def test_one_pending_step_message_per_request_and_sent_means_an_entry(
    db: StateDatabase,
) -> None:
    def message(tx: Transaction, number: int, status: str, entry: str | None) -> None:
        content = blobs.put_json(tx, {})
        tx.execute(
            "INSERT INTO workflow_messages (message_id, run_id, session_id, kind, reason,"
            " source_id, content_hash, order_number, status, entry_id, created_at, updated_at)"
            " VALUES (?, 'run-1', 's', 'step', 'initial', 'request-1', ?, ?, ?, ?, 1, 1)",
            (f"message-{number}", content, number, status, entry),
        )

    with db.write() as tx:
        add_run(tx, "run-1")
        message(tx, 1, "pending", None)
        message(tx, 2, "sent", "entry-2")
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"), db.write() as tx:
        message(tx, 3, "pending", None)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"), db.write() as tx:
        message(tx, 4, "sent", None)


def test_foreign_keys_are_enforced(db: StateDatabase) -> None:
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"), db.write() as tx:
        tx.execute(
            "INSERT INTO run_queue (run_id, status, available_at, created_at, updated_at)"
            " VALUES ('missing', 'queued', 1, 1, 1)"
        )


# conformance: S9
def test_one_effect_per_deterministic_key(db: StateDatabase) -> None:
    with db.write() as tx:
        source = ensure_resource(tx, ResourceType.RUN, "run-1")
        payload = blobs.put_json(tx, {})
        for effect_id in ("e1", "e2"):
            resource = ensure_resource(tx, ResourceType.EFFECT, effect_id)
            if effect_id == "e2":
                break
            tx.execute(
                "INSERT INTO effects (effect_id, resource_id, source_resource_id,"
                " source_revision, effect_type, idempotency_key, payload_hash, recovery,"
                " owner_scope, status, created_at, updated_at)"
                " VALUES (?, ?, ?, 1, 't', 'k', ?, 'manual', 'run', 'pending', 1, 1)",
                (effect_id, resource, source, payload),
            )
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"), db.write() as tx:
        tx.execute(
            "INSERT INTO effects (effect_id, resource_id, source_resource_id,"
            " source_revision, effect_type, idempotency_key, payload_hash, recovery,"
            " owner_scope, status, created_at, updated_at)"
            " VALUES ('e2', 'effect:e2', ?, 1, 't', 'k', ?, 'manual', 'run', 'pending', 1, 1)",
            (source, payload),
        )
