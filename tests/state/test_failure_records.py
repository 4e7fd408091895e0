"""Failure records in the state file: stored with the attempt, read back, and the schema change.

Adding ``node_attempts.failure_hash`` changed the DDL in place (the alpha policy of seed 000
and docs/STATE.md: no migrations). A database the previous code created must therefore be
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
from piwf.state.schema.logs import LOG_STATEMENTS
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

#: The DDL digest of the schema before failure records (commit b7c2c43); the reconstruction
#: below must give exactly it, so the test builds the file the previous code built.
PREVIOUS_DIGEST = "81762fd475ca1e4645a3aff71211ed637ff51b05fb58e11092fdc155471fdebe"


def previous_statements() -> tuple[str, ...]:
    """The current DDL without what failure records added to ``node_attempts`` (and without
    the tables added after them: attempt logs)."""
    added = (
        "  failure_hash BLOB REFERENCES blobs(blob_hash),\n",
        ",\n  CHECK (failure_hash IS NULL OR status IN ('failed', 'timed_out', 'cancelled'))",
    )
    statements = []
    later = {statement.strip() for statement in LOG_STATEMENTS}
    for statement in STATEMENTS:
        if statement in later:
            continue
        for text in added:
            statement = statement.replace(text, "")
        statements.append(statement)
    assert statements != list(STATEMENTS), "the reconstruction removed nothing"
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
        columns = {row[1] for row in raw.execute("PRAGMA table_info(node_attempts)")}
    assert "error_hash" in columns and "failure_hash" not in columns

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
