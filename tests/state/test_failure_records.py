"""Failure records in the state file: stored with the attempt, read back, and the schema change.

Adding ``node_attempts.failure_hash`` changed the DDL in place (the alpha policy of seed 000
and docs/STATE.md: no migrations), and so has every schema change since (the latest: session
capture, then the channel tables). A database the previous code created must therefore be
refused before anything touches it, with the one reset instruction, never half-read.
"""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from piwf.errors import IncompatibleStateError
from piwf.state import StateDatabase
from piwf.state import database as state_database
from piwf.state.enums import RunnerStatus
from piwf.state.execution import attempts
from piwf.state.schema import SCHEMA_DIGEST, STATEMENTS
from piwf.state.schema.channels import CHANNEL_STATEMENTS
from piwf.state.schema.session_capture import CAPTURE_STATEMENTS
from piwf.state.schema.sessions import SESSION_STATEMENTS
from piwf.state.schema.settings import SETTINGS_STATEMENTS
from piwf.workflow import compute, define_workflow
from piwf.workflow.context import Outcome
from piwf.workflow.engine import execute
from piwf.workflow.failure import AttemptFailure, FailureKind

from .test_execution_support import (
    StorePort,
    command_for,
    compiled,
    create,
    exit_and_recover,
    launch_if_runnable,
)

#: The DDL digest of the previous schema (commit badf021: before workflow messages); the
#: reconstruction below must give exactly it, so the test builds the file the previous code
#: built.
PREVIOUS_DIGEST = "e4bb358d231b37cd210a4f54854659cb57e6a5afb0809726848032b4d4e622ea"

_QUEUE_SESSION_INDEX = (
    "CREATE UNIQUE INDEX run_queue_active_session_idx ON run_queue(origin_session_id)\n"
    "  WHERE status IN ('queued', 'starting', 'running') AND origin_session_id IS NOT NULL"
)

_RUN_SOURCES_BY_FILE = """CREATE TABLE run_sources (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  mount_path TEXT NOT NULL,
  source_type TEXT NOT NULL CHECK (source_type IN ('file', 'builtin')),
  source_ref TEXT NOT NULL,
  source_revision TEXT NOT NULL,
  PRIMARY KEY (run_id, mount_path)
) STRICT"""


def previous_statements() -> tuple[str, ...]:
    """The current DDL as it was before workflow messages: no session, capture or channel tables, no
    ``unproductive`` answer, and the queue row's old ``origin_session_id`` column and its
    index back in place; no per-mount source references, no timer wake times, no forks, no
    live settings, no ``inputRejected`` failure class."""
    statements = []
    later = {
        statement.strip()
        for statement in (
            *SESSION_STATEMENTS,
            *CAPTURE_STATEMENTS,
            *SETTINGS_STATEMENTS,
            *CHANNEL_STATEMENTS,
        )
    }
    for statement in STATEMENTS:
        if statement in later:
            continue
        if statement.startswith("CREATE TABLE run_sources ("):
            statement = _RUN_SOURCES_BY_FILE  # before each mount recorded its reference
        statement = statement.replace(", 'session', 'unproductive')", ", 'session')")
        statement = statement.replace("  wake_at INTEGER,\n", "")  # before durable timers
        statement = statement.replace("IN ('restart', 'fork')", "IN ('restart')")  # before forks
        statement = statement.replace(" 'system',\n    'settings'))", " 'system'))")  # settings
        statement = statement.replace("'nodeFailed', 'inputRejected',", "'nodeFailed',")
        # Before the write-amplification cut (issue 18): event ids indexed on their own and
        # events by (resource, sequence); receipts and steps in rowid tables.
        statement = statement.replace(
            "  event_id TEXT NOT NULL,\n", "  event_id TEXT NOT NULL UNIQUE,\n"
        )
        if statement.startswith(("CREATE TABLE runner_messages (", "CREATE TABLE run_steps (")):
            statement = statement.replace(") STRICT, WITHOUT ROWID", ") STRICT")
        if statement.startswith("CREATE TABLE run_steps ("):
            statement = statement.replace(
                "  attempt_id TEXT NOT NULL UNIQUE REFERENCES",
                "  attempt_id TEXT NOT NULL REFERENCES",
            ).replace(
                "  PRIMARY KEY (run_id, step_index)\n",
                "  PRIMARY KEY (run_id, step_index),\n  UNIQUE (run_id, attempt_id)\n",
            )
        if statement.startswith("CREATE TABLE run_queue ("):
            statement = statement.replace(
                "  available_at INTEGER NOT NULL,\n",
                "  available_at INTEGER NOT NULL,\n  origin_session_id TEXT,\n",
            )
        statements.append(statement)
        if statement.startswith("CREATE INDEX run_queue_claim_idx"):
            statements.append(_QUEUE_SESSION_INDEX)
        if statement.startswith("CREATE TABLE events ("):
            statements.append("CREATE INDEX events_resource_idx ON events(resource_id, event_seq)")
        if statement.startswith("CREATE TABLE run_steps ("):
            statements.append("CREATE INDEX run_steps_attempt_idx ON run_steps(attempt_id)")
    assert statements != list(STATEMENTS), "the reconstruction changed nothing"
    return tuple(statements)


def test_a_database_of_the_previous_schema_is_refused_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_statements = previous_statements()
    old_sql = ";\n\n".join(old_statements) + ";\n"
    old_digest = hashlib.sha256(old_sql.encode()).digest()
    assert old_digest.hex() == PREVIOUS_DIGEST
    assert old_digest != SCHEMA_DIGEST

    path = tmp_path / "home" / "state.sqlite"
    # The previous code, as far as creating a database goes: its DDL and its digest (and the
    # schema shape derived from them, which the open check caches).
    state_database.expected_shape.cache_clear()
    try:
        with monkeypatch.context() as patched:
            patched.setattr(state_database, "STATEMENTS", old_statements)
            patched.setattr(state_database, "SCHEMA_DIGEST", old_digest)
            StateDatabase(path).close()
    finally:
        state_database.expected_shape.cache_clear()
    with closing(sqlite3.connect(path)) as raw:
        columns = {row[1] for row in raw.execute("PRAGMA table_info(run_queue)")}
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
    assert "origin_session_id" in columns and "workflow_messages" not in tables

    before = path.read_bytes()
    with pytest.raises(IncompatibleStateError) as refused:
        StateDatabase(path)
    message = str(refused.value)
    assert "Back up and move state.sqlite together with its -wal and -shm files" in message
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.sqlite"]


def _raise_missing(ctx: object) -> object:
    return {}["missing"]


def test_a_failed_attempt_keeps_its_record_and_a_completed_one_none(tmp_path: Path) -> None:
    db = StateDatabase(tmp_path / "home" / "state.sqlite")
    try:
        workflow = compiled(
            define_workflow(
                name="two",
                start_at="ok",
                nodes={"ok": compute(lambda ctx: {"ok": True}), "bad": compute(_raise_missing)},
                edges=[{"from": "ok", "to": "bad"}],
            )
        )
        create(db, workflow, "run-1")
        launched = launch_if_runnable(db)
        assert launched is not None
        execute(command_for(launched), workflow, StorePort(db, launched))
        exit_and_recover(db, launched, RunnerStatus.EXITED)
        with db.read() as tx:
            found = attempts.list_failures(tx, "run-1")
            last = attempts.last_step_failure(tx, "run-1")
            steps = attempts.list_steps(tx, "run-1")
        assert [step.failure_hash is None for step in steps] == [True, False]
        (failure,) = found
        assert last == failure
        assert (failure.path, failure.visit, failure.attempt, failure.outcome) == (
            "bad",
            1,
            1,
            Outcome.FAILED,
        )
        assert (failure.failure.kind, failure.failure.error_type) == (
            FailureKind.EXCEPTION,
            "KeyError",
        )
        assert isinstance(failure, AttemptFailure)
        # The table refuses a record on an attempt that did not fail.
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            with db.write() as tx:
                tx.execute(
                    "UPDATE node_attempts SET failure_hash = ? WHERE node_path = 'ok'",
                    (steps[1].failure_hash,),
                )
    finally:
        db.close()
