"""Retention's selector and exact-tree deletion on a real database (piwf/state/retention.py).

Trees are made by the real engine through the execution store (tests/state support), then aged
with the fake clock. Each protection is planted on an otherwise expired tree: it must block the
deletion (nothing written), and lifting it must let the same tree go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from piwf.clock import FakeClock
from piwf.errors import InvalidTransitionError
from piwf.lifecycle import Adopted, Applied
from piwf.state import StateDatabase, blobs, compaction
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state import retention as rt
from piwf.state.enums import EffectOwnerScope, EffectRecovery, ResourceType, RunnerStatus
from piwf.state.records import ensure_resource
from tests.state.test_execution_support import (
    SERVER,
    create,
    dump,
    exit_and_recover,
    run_once,
    two_step,
    violations,
)

DAY = rt.DAY_MS
WORKFLOW = two_step()


def completed(db: StateDatabase, run_id: str, who: str = "ada") -> str:
    """A root run executed to completion by the real engine, its runner exited."""
    create(db, WORKFLOW, run_id, {"who": who})
    launched, _store, result = run_once(db, WORKFLOW)
    assert result.status.value == "completed"
    exit_and_recover(db, launched, RunnerStatus.EXITED)
    return run_id


def cutoff(clock: FakeClock) -> int:
    return rt.cutoff_for(clock.now_ms())


def reasons(db: StateDatabase, clock: FakeClock, root: str) -> tuple[str, ...]:
    with db.read() as tx:
        verdict = rt.judge_tree(tx, root, tx.now, cutoff(clock))
    assert verdict is not None
    return verdict.reasons


def delete(db: StateDatabase, clock: FakeClock, root: str) -> Any:
    with db.write() as tx:
        return rt.delete_tree(tx, root, tx.now, cutoff(clock))


def sql(db: StateDatabase, statement: str, params: Any = ()) -> None:
    with db.write() as tx:
        tx.execute(statement, params)


def first_attempt(db: StateDatabase, run_id: str) -> str:
    with db.read() as tx:
        return str(
            tx.scalar(
                "SELECT attempt_id FROM node_attempts WHERE run_id = ? ORDER BY created_at",
                (run_id,),
            )
        )


def input_hash(db: StateDatabase, run_id: str) -> bytes:
    with db.read() as tx:
        return bytes(tx.scalar("SELECT input_hash FROM runs WHERE run_id = ?", (run_id,)))


def orphan_blobs(db: StateDatabase) -> int:
    """Blobs that no foreign-key column of the schema references."""
    with db.read() as tx:
        columns = [
            (key.table, key.columns[0]) for key in rt.foreign_keys(tx) if key.parent == "blobs"
        ]
        referenced = " UNION ".join(
            f'SELECT "{c}" FROM "{t}" WHERE "{c}" IS NOT NULL' for t, c in columns
        )
        return int(tx.scalar(f"SELECT count(*) FROM blobs WHERE blob_hash NOT IN ({referenced})"))


# -- selecting ----------------------------------------------------------------------------------


def test_a_tree_expires_once_every_run_finished_before_the_cutoff(
    db: StateDatabase, clock: FakeClock
) -> None:
    completed(db, "run-a")
    with db.read() as tx:
        finished = int(tx.scalar("SELECT finished_at FROM runs WHERE run_id = 'run-a'"))
    assert reasons(db, clock, "run-a") == ("recent",)
    clock.set(finished + 30 * DAY)  # cutoff == finished_at: not older than the cutoff
    assert reasons(db, clock, "run-a") == ("recent",)
    with db.read() as tx:
        assert rt.expired_roots(tx, cutoff(clock)) == []
    clock.advance(1)
    assert reasons(db, clock, "run-a") == ()
    with db.read() as tx:
        assert rt.expired_roots(tx, cutoff(clock)) == ["run-a"]
        assert [v.root_run_id for v in rt.select_trees(tx, tx.now, cutoff(clock))] == ["run-a"]


def test_a_restart_keeps_its_whole_tree_until_the_restart_is_old_too(
    db: StateDatabase, clock: FakeClock
) -> None:
    completed(db, "run-a")
    with db.write() as tx:
        restarted = ex.restart_run(tx, "run-a", new_run_id="run-a2", actor=SERVER)
    assert isinstance(restarted, Applied)
    clock.advance(31 * DAY)
    assert {"notTerminal", "queue"} <= set(reasons(db, clock, "run-a"))
    with db.read() as tx:
        assert rt.expired_roots(tx, cutoff(clock)) == [], "a live restart is not a candidate"
    launched, _store, result = run_once(db, WORKFLOW)
    assert launched.run_id == "run-a2" and result.status.value == "completed"
    exit_and_recover(db, launched, RunnerStatus.EXITED)
    assert reasons(db, clock, "run-a") == ("recent",)
    clock.advance(31 * DAY)
    result = delete(db, clock, "run-a")
    assert isinstance(result, Applied)
    assert result.value.run_ids == ("run-a", "run-a2")
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 0
    assert violations(db) == []


# -- every protection blocks, and lifting it unblocks ------------------------------------------

Plant = Callable[[StateDatabase, FakeClock], None]


def _queue_parked(db: StateDatabase, _clock: FakeClock) -> None:
    sql(db, "UPDATE run_queue SET status = 'parked', finished_at = NULL WHERE run_id = 'run-a'")


def _queue_done(db: StateDatabase, clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE run_queue SET status = 'done', finished_at = ? WHERE run_id = 'run-a'",
        (clock.now_ms(),),
    )


def _attempt_waiting(db: StateDatabase, _clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE node_attempts SET status = 'waiting', finished_at = NULL WHERE attempt_id = ?",
        (first_attempt(db, "run-a"),),
    )


def _attempt_completed(db: StateDatabase, clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE node_attempts SET status = 'completed', finished_at = ? WHERE attempt_id = ?",
        (clock.now_ms(), first_attempt(db, "run-a")),
    )


def _request_pending(db: StateDatabase, clock: FakeClock) -> None:
    sql(
        db,
        "INSERT INTO interactive_requests (request_id, run_id, attempt_id, kind, content_hash,"
        " status, created_at, updated_at) VALUES ('req-a', 'run-a', ?, 'checkpoint', ?,"
        " 'pending', ?, ?)",
        (first_attempt(db, "run-a"), input_hash(db, "run-a"), clock.now_ms(), clock.now_ms()),
    )


def _request_cancelled(db: StateDatabase, _clock: FakeClock) -> None:
    sql(db, "UPDATE interactive_requests SET status = 'cancelled' WHERE request_id = 'req-a'")


def _decision_open(db: StateDatabase, clock: FakeClock) -> None:
    _request_pending(db, clock)
    _request_cancelled(db, clock)
    with db.write() as tx:
        resource = ensure_resource(tx, ResourceType.DECISION, "req-a")
        tx.execute(
            "INSERT INTO human_decisions (decision_id, resource_id, run_id, kind, created_at)"
            " VALUES ('req-a', ?, 'run-a', 'checkpoint', ?)",
            (resource, tx.now),
        )


def _decision_resolved(db: StateDatabase, clock: FakeClock) -> None:
    sql(
        db,
        "INSERT INTO human_decision_resolutions (decision_id, outcome, provenance, reason,"
        " actor_type, resolved_at) VALUES ('req-a', 'cancelled', 'explicit_cancel', 'test',"
        " 'human', ?)",
        (clock.now_ms(),),
    )


def _lease_held(db: StateDatabase, clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE leases SET owner_type = 'server', owner_id = 'elsewhere', token_hash = ?,"
        " acquired_at = ?, heartbeat_at = ?, expires_at = ? WHERE resource_id = 'run:run-a'",
        (bytes(32), clock.now_ms(), clock.now_ms(), clock.now_ms() + 60_000),
    )


def _lease_expired(db: StateDatabase, clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE leases SET expires_at = ? WHERE resource_id = 'run:run-a'",
        (clock.now_ms() - 1,),
    )


def _effect_pending(db: StateDatabase, _clock: FakeClock) -> None:
    with db.write() as tx:
        reserved = fx.reserve_effect(
            tx,
            source_resource_id="run:run-a",
            source_revision=1,
            effect_type="t.deploy",
            idempotency_key="k",
            payload={"target": "a"},
            recovery=EffectRecovery.IDEMPOTENT,
            owner_scope=EffectOwnerScope.RUN,
            actor=SERVER,
        )
    assert isinstance(reserved, Applied)


def _effect_cancelled(db: StateDatabase, clock: FakeClock) -> None:
    sql(db, "UPDATE effects SET status = 'cancelled', settled_at = ?", (clock.now_ms(),))


def _runner_running(db: StateDatabase, _clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE run_runners SET status = 'running', finished_at = NULL WHERE run_id = 'run-a'",
    )


def _runner_exited(db: StateDatabase, clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE run_runners SET status = 'exited', finished_at = ? WHERE run_id = 'run-a'",
        (clock.now_ms(),),
    )


def _restarted_from_another_tree(db: StateDatabase, _clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE runs SET parent_run_id = 'run-a', lineage_kind = 'restart',"
        " parent_terminal_fingerprint = ?, restart_number = 1 WHERE run_id = 'run-b'",
        (bytes(32),),
    )


def _own_root_again(db: StateDatabase, _clock: FakeClock) -> None:
    sql(
        db,
        "UPDATE runs SET parent_run_id = NULL, lineage_kind = NULL,"
        " parent_terminal_fingerprint = NULL, restart_number = 0 WHERE run_id = 'run-b'",
    )


def _unknown_owner(db: StateDatabase, _clock: FakeClock) -> None:
    # A table retention does not know (a resource manager's, a later feature's) that points at
    # the run; with ON DELETE CASCADE a blind delete would take its row along.
    db.connection.execute(
        "CREATE TABLE IF NOT EXISTS later_feature (id INTEGER PRIMARY KEY,"
        " run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE) STRICT"
    )
    sql(db, "INSERT INTO later_feature (id, run_id) VALUES (1, 'run-a')")


def _unknown_owner_gone(db: StateDatabase, _clock: FakeClock) -> None:
    sql(db, "DELETE FROM later_feature")


def _message_pending(db: StateDatabase, clock: FakeClock) -> None:
    with db.write() as tx:
        content = blobs.put_json(tx, {"kind": "terminal"})
        tx.execute(
            "INSERT INTO workflow_messages (message_id, run_id, session_id, kind, source_id,"
            " content_hash, order_number, status, created_at, updated_at)"
            " VALUES ('message-a', 'run-a', 's', 'terminal', 'run-a', ?, 1, 'pending', ?, ?)",
            (content, clock.now_ms(), clock.now_ms()),
        )


def _message_sent(db: StateDatabase, _clock: FakeClock) -> None:
    sql(db, "UPDATE workflow_messages SET status = 'sent', entry_id = 'e-1'")


PROTECTIONS: list[tuple[str, Plant, Plant]] = [
    ("queue", _queue_parked, _queue_done),
    ("attempt", _attempt_waiting, _attempt_completed),
    ("request", _request_pending, _request_cancelled),
    ("decision", _decision_open, _decision_resolved),
    ("lease", _lease_held, _lease_expired),
    ("effect", _effect_pending, _effect_cancelled),
    ("runner", _runner_running, _runner_exited),
    ("message", _message_pending, _message_sent),
    ("crossTree:runs", _restarted_from_another_tree, _own_root_again),
    ("reference:later_feature", _unknown_owner, _unknown_owner_gone),
]


@pytest.mark.parametrize(
    ("reason", "block", "unblock"), PROTECTIONS, ids=[p[0] for p in PROTECTIONS]
)
def test_each_protection_blocks_and_lifting_it_unblocks(
    db: StateDatabase, clock: FakeClock, reason: str, block: Plant, unblock: Plant
) -> None:
    completed(db, "run-a", "a")
    completed(db, "run-b", "b")
    clock.advance(31 * DAY)
    assert reasons(db, clock, "run-a") == ()
    block(db, clock)
    assert reason in reasons(db, clock, "run-a")
    before = dump(db)
    refused = delete(db, clock, "run-a")
    assert isinstance(refused, rt.TreeProtected)
    assert reason in refused.reasons
    assert dump(db) == before, "a protected tree is not touched"
    unblock(db, clock)
    assert reasons(db, clock, "run-a") == ()
    deleted = delete(db, clock, "run-a")
    assert isinstance(deleted, Applied), deleted
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs WHERE root_run_id = 'run-a'") == 0
        # Effect and decision aggregates have their own resource rows; they go with the tree.
        assert tx.scalar("SELECT count(*) FROM resources WHERE aggregate_key LIKE '%run-a%'") == 0
        assert tx.scalar("SELECT count(*) FROM resources WHERE resource_id = 'decision:req-a'") == 0
        assert tx.scalar("SELECT count(*) FROM effects") == 0
        assert tx.scalar("SELECT count(*) FROM runs WHERE run_id = 'run-b'") == 1


def test_a_foreign_key_the_checks_missed_rolls_the_tree_back(
    db: StateDatabase, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    completed(db, "run-a")
    clock.advance(31 * DAY)
    db.connection.execute(
        "CREATE TABLE later_feature (id INTEGER PRIMARY KEY,"
        " attempt_id TEXT REFERENCES node_attempts(attempt_id)) STRICT"
    )
    sql(db, "INSERT INTO later_feature VALUES (1, ?)", (first_attempt(db, "run-a"),))
    assert "reference:later_feature" in reasons(db, clock, "run-a")
    # Blind the checks: the foreign key itself must still refuse, and the savepoint undo.
    monkeypatch.setattr(rt, "_reasons", lambda *_args: ())
    before = dump(db)
    with db.write() as tx:
        result = rt.delete_tree(tx, "run-a", tx.now, cutoff(clock))
        assert isinstance(result, rt.TreeProtected)
        assert result.reasons == ("deleteRefused",)
        tx.execute("UPDATE retention_state SET last_started_at = 1")  # the transaction goes on
    after = dump(db)
    assert after.pop("retention_state") != before.pop("retention_state")
    assert after == before


# -- exactness, blobs, repeats -------------------------------------------------------------------


def test_deleting_one_tree_leaves_every_other_row_as_it_was(
    db: StateDatabase, clock: FakeClock
) -> None:
    completed(db, "run-a", "a")
    completed(db, "run-b", "b")
    clock.advance(31 * DAY)
    completed(db, "run-c", "c")  # recent
    with db.read() as tx:
        tree = rt.load_tree(tx, "run-a")
        assert tree is not None
        owned = {
            table: int(tx.scalar(f"SELECT count(*) FROM {table} WHERE {where}", tree.params()))
            for table, where in rt.TREE_ROWS.items()
        }
    before = dump(db)
    result = delete(db, clock, "run-a")
    assert isinstance(result, Applied)
    after = dump(db)
    for table, rows in after.items():
        assert set(rows) <= set(before[table]), f"{table}: a surviving row changed"
        removed = len(before[table]) - len(rows)
        if table in owned:
            assert removed == owned[table], table
        elif table != "blobs":
            assert removed == 0, table
    assert owned["runs"] == 1 and owned["events"] > 0 and owned["runner_messages"] > 0
    for root in ("run-b", "run-c"):
        with db.read() as tx:
            assert rt.load_tree(tx, root) is not None
    assert violations(db) == []
    assert orphan_blobs(db) == 0


def test_blobs_still_referenced_elsewhere_are_kept(db: StateDatabase, clock: FakeClock) -> None:
    completed(db, "run-a", "same")
    completed(db, "run-b", "same")  # same input and outputs: shared blobs
    shared_input = input_hash(db, "run-a")
    assert shared_input == input_hash(db, "run-b")
    clock.advance(31 * DAY)
    with db.read() as tx:
        blobs_before = tx.scalar("SELECT count(*) FROM blobs")
    result = delete(db, clock, "run-a")
    assert isinstance(result, Applied) and result.value.blobs > 0
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM blobs") == blobs_before - result.value.blobs
        assert tx.scalar("SELECT count(*) FROM workflow_definitions") == 1, "run-b uses it"
    assert violations(db) == [], "every blob run-b references is still there"
    # A row outside any tree (a command receipt) keeps the input blob past the last tree.
    sql(
        db,
        "INSERT INTO server_commands (request_id, client_id, operation, idempotency_key,"
        " request_fingerprint, run_id, outcome, receipt_hash, server_epoch, created_at,"
        " completed_at) VALUES ('r', 'c', 'run.start', 'k', ?, 'run-b', 'accepted', ?, 1, 0, 0)",
        (bytes(32), shared_input),
    )
    assert isinstance(delete(db, clock, "run-b"), Applied)
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM blobs WHERE blob_hash = ?", (shared_input,)) == 1
        assert tx.scalar("SELECT run_id FROM server_commands") is None, "the receipt detaches"
        assert tx.scalar("SELECT count(*) FROM workflow_definitions") == 0
        assert tx.scalar("SELECT count(*) FROM resources") == 0
    assert orphan_blobs(db) == 0
    assert violations(db) == []


def test_a_repeated_deletion_is_adopted_and_changes_nothing(
    db: StateDatabase, clock: FakeClock
) -> None:
    completed(db, "run-a")
    clock.advance(31 * DAY)
    assert isinstance(delete(db, clock, "run-a"), Applied)
    before = dump(db)
    assert delete(db, clock, "run-a") == Adopted(None)
    assert dump(db) == before


def test_deletion_needs_a_write_transaction(db: StateDatabase, clock: FakeClock) -> None:
    completed(db, "run-a")
    clock.advance(31 * DAY)
    with db.read() as tx, pytest.raises(InvalidTransitionError):
        rt.delete_tree(tx, "run-a", tx.now, cutoff(clock))


def test_retention_keeps_at_least_a_day() -> None:
    with pytest.raises(ValueError):
        rt.cutoff_for(0, days=0)
    assert rt.cutoff_for(40 * DAY, days=30) == 10 * DAY


# -- bookkeeping and compaction -----------------------------------------------------------------


def test_sweep_bookkeeping_is_one_bounded_row(db: StateDatabase, clock: FakeClock) -> None:
    with db.read() as tx:
        assert rt.read_status(tx) == rt.RetentionStatus(None, None, 0, 0, 0, 0, None, None)
    with db.write() as tx:
        rt.record_sweep_started(tx)
        rt.record_sweep_failed(tx, "OperationalError: " + "x" * 2000)
    with db.read() as tx:
        status = rt.read_status(tx)
    assert status.last_started_at == clock.now_ms()
    assert status.last_failure is not None and len(status.last_failure) == 512
    clock.advance(1000)
    with db.write() as tx:
        rt.record_trees_deleted(tx, 2)
        rt.record_sweep_completed(tx, trees=2, runs=3, protected=1)
        rt.record_trees_deleted(tx, 1)
        rt.record_sweep_completed(tx, trees=1, runs=1, protected=0)
    with db.read() as tx:
        status = rt.read_status(tx)
    assert (status.last_completed_at, status.last_trees_deleted, status.total_trees_deleted) == (
        clock.now_ms(),
        1,
        3,
    )
    assert status.last_failure is None and status.last_failure_at is None


def _with_large_inputs(db: StateDatabase, count: int) -> None:
    for index in range(count):
        completed(db, f"run-{index}", f"{index}" + "x" * 300_000)


def test_compaction_vacuums_only_past_both_thresholds_and_while_idle(
    db: StateDatabase, clock: FakeClock
) -> None:
    _with_large_inputs(db, 3)
    clock.advance(31 * DAY)
    for index in range(3):
        assert isinstance(delete(db, clock, f"run-{index}"), Applied)
    kept = compaction.compact(db, still_idle=lambda: True)  # the 64 MiB default is far away
    assert kept.wal_truncated and not kept.vacuumed
    assert kept.before.free_pages > 0 and kept.before.free_ratio >= 0.2
    busy = compaction.compact(db, still_idle=lambda: False, min_bytes=1)
    assert not busy.vacuumed
    done = compaction.compact(db, still_idle=lambda: True, min_bytes=1)
    assert done.vacuumed and done.after.free_pages == 0
    assert done.after.page_count < done.before.page_count
    assert db.pragma("temp_store") == 2, "the writer's undo pages are back in memory"
    assert violations(db) == []


def test_compaction_refuses_to_run_inside_a_transaction(db: StateDatabase) -> None:
    with db.write(), pytest.raises(InvalidTransitionError):
        compaction.compact(db, still_idle=lambda: True)


def test_any_constraint_refusal_mid_delete_leaves_the_tree_whole(
    db: StateDatabase, clock: FakeClock
) -> None:
    """A refusal deep in the cascade (a trigger on a child table here) undoes the savepoint:
    no partial tree, and the tree goes once the refusal is lifted."""
    completed(db, "run-a")
    clock.advance(31 * DAY)
    db.connection.execute(
        "CREATE TEMP TRIGGER refuse BEFORE DELETE ON main.run_sources"
        " BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"
    )
    before = dump(db)
    result = delete(db, clock, "run-a")
    assert isinstance(result, rt.TreeProtected) and result.reasons == ("deleteRefused",)
    assert dump(db) == before
    db.connection.execute("DROP TRIGGER temp.refuse")
    assert isinstance(delete(db, clock, "run-a"), Applied)


def test_a_trees_session_capture_goes_with_it_and_its_blobs_too(
    db: StateDatabase, clock: FakeClock
) -> None:
    completed(db, "run-a", "a")
    attempt = first_attempt(db, "run-a")
    now = clock.now_ms()
    with db.write() as tx:
        content = blobs.put_json(tx, {"kind": "step"})
        entry = blobs.put_json(tx, "only the capture holds this")
        payload = blobs.put_json(tx, {"tool": "grep"})
        tx.execute(
            "INSERT INTO workflow_messages (message_id, run_id, session_id, kind, reason,"
            " source_id, content_hash, order_number, status, entry_id, created_at, updated_at)"
            " VALUES ('message-a', 'run-a', 's', 'step', 'initial', 'req-a', ?, 1, 'sent',"
            " 'e-1', ?, ?)",
            (content, now, now),
        )
        tx.execute(
            "INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, state,"
            " stop_reason, started_at, ended_at) VALUES ('turn-a', 'message-a', 'run-a', 's',"
            " 'ended', 'completed', ?, ?)",
            (now, now),
        )
        tx.execute(
            "INSERT INTO session_segments (segment_id, run_id, attempt_id, turn_id, session_id,"
            " status, entry_count, event_count, created_at, finished_at)"
            " VALUES ('segment-a', 'run-a', ?, 'turn-a', 's', 'complete', 1, 1, ?, ?)",
            (attempt, now, now),
        )
        tx.execute(
            "INSERT INTO session_entries (segment_id, run_id, entry_seq, run_seq, entry_id,"
            " entry_kind, content_hash, content_bytes, recorded_at)"
            " VALUES ('segment-a', 'run-a', 1, 1, 'e-1', 'user', ?, 29, ?)",
            (entry, now),
        )
        tx.execute(
            "INSERT INTO attempt_entries (attempt_id, role, segment_id, entry_id)"
            " VALUES (?, 'prompt', 'segment-a', 'e-1')",
            (attempt,),
        )
        tx.execute(
            "INSERT INTO session_events (segment_id, run_id, event_seq, run_seq, event_type,"
            " payload_hash, payload_bytes, recorded_at)"
            " VALUES ('segment-a', 'run-a', 1, 1, 'toolCall', ?, 15, ?)",
            (payload, now),
        )
    clock.advance(31 * DAY)
    assert reasons(db, clock, "run-a") == ()  # a finished capture protects nothing
    assert isinstance(delete(db, clock, "run-a"), Applied)
    with db.read() as tx:
        for table in ("session_segments", "session_entries", "attempt_entries", "session_events"):
            assert tx.scalar(f"SELECT count(*) FROM {table}") == 0, table
        assert tx.scalar("SELECT count(*) FROM blobs WHERE blob_hash = ?", (entry,)) == 0
    assert violations(db) == []
    assert orphan_blobs(db) == 0
