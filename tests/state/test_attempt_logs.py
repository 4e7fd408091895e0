"""The attempt-log store (``attempt_logs``) on a real state database.

Runs are executed by the real engine through :class:`StorePort` (the server's decode/apply
path); the log rows are opened and counted by the store functions the server calls.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from piwf.state import StateDatabase
from piwf.state.execution import attempt_logs
from piwf.state.execution.attempt_logs import LogCounts

from .test_execution_support import create, run_once, two_step


def executed(db: StateDatabase, run_id: str) -> list[tuple[str, str]]:
    """Run ``run_id`` (a two-step workflow) and return its attempts (id, path) in order."""
    create(db, two_step(), run_id, input={"who": "Ada"})
    run_once(db, two_step())
    with db.read() as tx:
        rows = tx.all(
            "SELECT attempt_id, node_path FROM node_attempts WHERE run_id = ? "
            "ORDER BY started_at, visit",
            (run_id,),
        )
    return [(str(row[0]), str(row[1])) for row in rows]


def test_logs_are_numbered_in_start_order_and_keep_their_counts(db: StateDatabase) -> None:
    (greet, _), (shout, _) = executed(db, "run-logs1")
    with db.write() as tx:
        first = attempt_logs.open_log(tx, greet, "run-logs1")
        second = attempt_logs.open_log(tx, shout, "run-logs1")
        again = attempt_logs.open_log(tx, greet, "run-logs1")  # a repeated node_started
        attempt_logs.record_counts(tx, greet, LogCounts(stdout=5, stderr=2, kept=6, dropped=1))
    assert (first.log_number, second.log_number, again.log_number) == (1, 2, 1)
    assert first.log_file == f"logs/run-logs1/{greet}.log"
    with db.read() as tx:
        listed = attempt_logs.list_logs(tx, "run-logs1")
        only_shout = attempt_logs.list_logs(tx, "run-logs1", path="shout")
        assert attempt_logs.has_log(tx, "run-logs1", 2)
        assert not attempt_logs.has_log(tx, "run-logs1", 2, path="greet")
    assert [(row.path, row.log_number) for row in listed] == [("greet", 1), ("shout", 2)]
    assert listed[0].counts == LogCounts(stdout=5, stderr=2, kept=6, dropped=1)
    assert listed[0].counts.streams == ("stdout", "stderr")
    assert [row.attempt_id for row in only_shout] == [shout]


def test_the_schema_refuses_an_absolute_or_escaping_file_and_inconsistent_counts(
    db: StateDatabase,
) -> None:
    ((greet, _), _) = executed(db, "run-logs2")
    insert = (
        "INSERT INTO attempt_logs (attempt_id, run_id, log_number, log_file, created_at,"
        " updated_at) VALUES (?, 'run-logs2', 1, ?, 0, 0)"
    )
    for name in ("/etc/passwd", "logs/../../x.log"):
        with pytest.raises(sqlite3.IntegrityError), db.write() as tx:
            tx.execute(insert, (greet, name))
    with db.write() as tx:
        attempt_logs.open_log(tx, greet, "run-logs2")
    with pytest.raises(sqlite3.IntegrityError), db.write() as tx:
        attempt_logs.record_counts(tx, greet, LogCounts(stdout=5, kept=1, dropped=1))


def test_ids_that_piwf_does_not_generate_never_name_a_file() -> None:
    with pytest.raises(ValueError):
        attempt_logs.log_file_for("../run", "attempt-1")
    with pytest.raises(ValueError):
        attempt_logs.run_logs_dir(Path("/nowhere"), "run/../../x")


def test_orphaned_log_directories_are_removed_and_live_runs_keep_theirs(
    db: StateDatabase, home: Path
) -> None:
    executed(db, "run-live1")
    for run_id in ("run-live1", "run-gone1"):
        directory = home / "logs" / run_id
        directory.mkdir(parents=True)
        (directory / "attempt-x.log").write_bytes(b"printed")
    outside = home / "logs" / "not an id"
    outside.mkdir()
    with db.read() as tx:
        removed = attempt_logs.remove_orphaned_logs(tx, home)
    assert removed == 1
    assert (home / "logs" / "run-live1" / "attempt-x.log").read_bytes() == b"printed"
    assert not (home / "logs" / "run-gone1").exists()
    assert outside.exists(), "only directories named like a run id are piwf's"
    assert attempt_logs.remove_run_logs(home, ["run-live1", "run-never1"]) == 1
    assert not (home / "logs" / "run-live1").exists()
