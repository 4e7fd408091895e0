"""The execution tables: enums mirror their CHECK lists, and the row-shape constraints hold."""

from __future__ import annotations

import re
import sqlite3
from enum import Enum

import pytest

from piwf import lifecycle
from piwf.state import StateDatabase, Transaction, blobs
from piwf.state import enums as e
from piwf.state.schema import SCHEMA_SQL

from .test_execution_support import create, two_step

MIRRORS: list[tuple[str, str, type[Enum]]] = [
    ("run_queue", "error_code", e.FailureClass),
    ("run_runners", "status", e.RunnerStatus),
    ("run_runners", "command", lifecycle.CommandKind),
    ("runner_messages", "outcome", e.RunnerMessageOutcome),
    ("interactive_requests", "kind", lifecycle.InteractionKind),
    ("interactive_requests", "status", e.InteractionStatus),
    ("interactive_requests", "answered_by", lifecycle.AnsweredBy),
    ("run_notifications", "kind", lifecycle.NotifyKind),
    ("human_decisions", "kind", e.DecisionKind),
    ("human_decision_resolutions", "outcome", e.ResolutionOutcome),
    ("human_decision_resolutions", "provenance", e.ResolutionProvenance),
    ("human_decision_submissions", "source", e.SubmissionSource),
    ("human_decision_submissions", "outcome", e.SubmissionOutcome),
    ("agent_processes", "ended_by", e.AgentProcessEnd),
]


def check_values(table: str, column: str) -> set[str]:
    body = SCHEMA_SQL.split(f"CREATE TABLE {table} (", 1)[1].split(") STRICT", 1)[0]
    match = re.search(rf"\b{column} [^,]*?CHECK \({column} IN \(([^)]*)\)\)", body, re.S)
    assert match, f"no CHECK list for {table}.{column}"
    return set(re.findall(r"'([^']*)'", match.group(1)))


@pytest.mark.parametrize(("table", "column", "enum"), MIRRORS)
def test_each_execution_enum_mirrors_its_check_constraint(
    table: str, column: str, enum: type[Enum]
) -> None:
    assert check_values(table, column) == {member.value for member in enum}


def test_live_and_blocking_sets_are_subsets_of_their_enums() -> None:
    live_index = SCHEMA_SQL.split("CREATE UNIQUE INDEX run_runners_active_idx", 1)[1].split(";")[0]
    assert set(re.findall(r"'([^']*)'", live_index)) == {s.value for s in e.LIVE_RUNNER_STATUSES}
    assert {code.value for code in e.BLOCKING_FAILURE_CLASSES} == {
        "sourceChanged",
        "runnerNoProgress",
        "effectAmbiguous",
        "protocolRejected",
    }


def insert_runner(tx: Transaction, epoch: str, **columns: object) -> None:
    values: dict[str, object] = {
        "runner_epoch": epoch,
        "run_id": "run-1",
        "generation": 1,
        "server_epoch": 1,
        "command": "start",
        "launch_envelope_hash": blobs.put_json(tx, {}),
        "launch_revision": 0,
        "status": "starting",
        "started_at": 1,
    }
    values.update(columns)
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    tx.execute(f"INSERT INTO run_runners ({names}) VALUES ({marks})", tuple(values.values()))


@pytest.mark.parametrize(
    "columns",
    [
        {"pid": 10},
        {"process_start_identity": "x"},
        {"status": "exited"},
        {"status": "starting", "finished_at": 5},
        {"status": "ready"},
        {"status": "starting", "ready_at": 2, "ready_revision": 1},
        {"status": "ready", "ready_at": 2},
        {"command": "jump"},
        {"generation": 0},
    ],
)
def test_runner_rows_keep_their_shape(db: StateDatabase, columns: dict[str, object]) -> None:
    create(db, two_step())
    with db.write() as tx:
        insert_runner(tx, "ok", pid=10, process_start_identity="10:boot")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"), db.write() as tx:
        insert_runner(tx, "bad", **columns)


def test_queue_error_codes_are_the_closed_failure_set(db: StateDatabase) -> None:
    create(db, two_step())
    with db.write() as tx:
        tx.execute("UPDATE run_queue SET error_code = 'runnerCrashed'")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"), db.write() as tx:
        tx.execute("UPDATE run_queue SET error_code = 'workflowSourceChanged'")


def test_one_open_request_per_run_and_answers_match_status(db: StateDatabase) -> None:
    create(db, two_step())
    with db.write() as tx:
        for attempt in ("a1", "a2"):
            tx.execute(
                "INSERT INTO node_attempts (attempt_id, run_id, node_path, visit, attempt_number,"
                " node_type, status, lease_generation, finished_at, created_at, updated_at)"
                " VALUES (?, 'run-1', 'gate', ?, 1, 'checkpoint', 'completed', 1, 1, 1, 1)",
                (attempt, 1 if attempt == "a1" else 2),
            )
        content = blobs.put_json(tx, {})
        insert = (
            "INSERT INTO interactive_requests (request_id, run_id, attempt_id, kind, content_hash,"
            " status, answer_hash, answered_by, created_at, updated_at)"
            " VALUES (?, 'run-1', ?, 'checkpoint', ?, ?, ?, ?, 1, 1)"
        )
        tx.execute(insert, ("r1", "a1", content, "answered", content, "human"))
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"), db.write() as tx:
        tx.execute(insert, ("r2", "a2", content, "pending", None, None))
    for status, answer, by in (("answered", None, None), ("pending", content, "human")):
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"), db.write() as tx:
            tx.execute("UPDATE interactive_requests SET status = 'settled' WHERE request_id = 'r1'")
            tx.execute(insert, ("r3", "a2", content, status, answer, by))
