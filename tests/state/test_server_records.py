"""Server epoch, command receipts, runs, backups and diagnostics on real database files."""

from __future__ import annotations

import itertools
import stat
from pathlib import Path
from typing import get_args

import pytest

from piwf import canonical
from piwf.clock import FakeClock
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, Conflict, RunStatus
from piwf.protocol.payloads import RunDisplayStatus
from piwf.state import StateDatabase
from piwf.state.backup import BackupError, backup_database
from piwf.state.commands import Fresh, Replay, Reused, lookup_command, store_command
from piwf.state.diagnostics import find_violations, status_counts
from piwf.state.enums import ActorType, CommandOutcome, QueueStatus, SourceType
from piwf.state.execution import runs as run_store
from piwf.state.records import Actor
from piwf.state.server_epoch import (
    acquire_server_claim,
    read_server_owner,
    release_server_claim,
    renew_server_claim,
    verify_server_claim,
)
from piwf.workflow.sources import ReferenceKind

CLIENT = Actor(ActorType.CLIENT)


def acquire(db: StateDatabase, server_id: str, *, previous_dead: bool = False) -> object:
    with db.write() as tx:
        return acquire_server_claim(
            tx,
            server_id=server_id,
            pid=4242,
            process_start_identity="4242:1.0:boot",
            lease_ms=1000,
            previous_dead=previous_dead,
        )


# conformance: X11
def test_server_epochs_are_fenced_and_an_expired_server_never_revives(
    db: StateDatabase, clock: FakeClock
) -> None:
    clock.set(1000)
    first = acquire(db, "server-a")
    assert isinstance(first, Applied)
    assert first.value.epoch == 1
    clock.set(1500)
    assert isinstance(acquire(db, "server-b"), Conflict)
    clock.set(2001)
    second = acquire(db, "server-b")
    assert isinstance(second, Applied)
    assert second.value.epoch == 2
    with pytest.raises(ClaimLostError) as renew_error, db.write() as tx:
        renew_server_claim(tx, first.value, 1000)
    assert renew_error.value.reason == "generationChanged"
    with pytest.raises(ClaimLostError), db.write() as tx:
        release_server_claim(tx, first.value)
    with db.read() as tx:
        verify_server_claim(tx, second.value)


def test_a_proven_dead_server_can_be_replaced_before_its_lease_ends(
    db: StateDatabase, clock: FakeClock
) -> None:
    first = acquire(db, "server-a")
    assert isinstance(first, Applied)
    successor = acquire(db, "server-b", previous_dead=True)
    assert isinstance(successor, Applied)
    assert successor.value.epoch == 2
    with pytest.raises(ClaimLostError), db.read() as tx:
        verify_server_claim(tx, first.value)


def test_server_renewal_and_release(db: StateDatabase, clock: FakeClock) -> None:
    taken = acquire(db, "server-a")
    assert isinstance(taken, Applied)
    clock.advance(900)
    with db.write() as tx:
        renewed = renew_server_claim(tx, taken.value, 1000)
    assert renewed.expires_at == clock.now_ms() + 1000
    clock.advance(1000)
    with pytest.raises(ClaimLostError) as expired, db.write() as tx:
        renew_server_claim(tx, renewed, 1000)
    assert expired.value.reason == "expired"
    with db.write() as tx:
        assert isinstance(release_server_claim(tx, renewed), Applied)
        assert isinstance(release_server_claim(tx, renewed), Adopted)
        owner = read_server_owner(tx)
    assert (owner.epoch, owner.server_id) == (1, None)


def store(db: StateDatabase, request_id: str, key: str, fingerprint: bytes) -> None:
    with db.write() as tx:
        store_command(
            tx,
            request_id=request_id,
            client_id="client-1",
            operation="state.backup",
            idempotency_key=key,
            fingerprint=fingerprint,
            outcome=CommandOutcome.ACCEPTED,
            server_epoch=1,
            receipt={"destination": "/x"},
        )


def lookup(db: StateDatabase, request_id: str, key: str, fingerprint: bytes) -> object:
    with db.read() as tx:
        return lookup_command(
            tx,
            request_id=request_id,
            client_id="client-1",
            idempotency_key=key,
            fingerprint=fingerprint,
        )


# conformance: X6
def test_receipt_lookup_rules(db: StateDatabase) -> None:
    same, other = b"\1" * 32, b"\2" * 32
    assert isinstance(lookup(db, "r1", "k", same), Fresh)
    store(db, "r1", "k", same)
    replay = lookup(db, "r2", "k", same)
    assert isinstance(replay, Replay)
    assert replay.stored.receipt == {"destination": "/x"}
    assert isinstance(lookup(db, "r1", "k", same), Replay)
    assert isinstance(lookup(db, "r3", "k", other), Reused)
    assert isinstance(lookup(db, "r1", "k2", other), Reused)
    assert isinstance(lookup(db, "r4", "k2", other), Fresh)


def new_run(definition: dict[str, object] | None = None) -> run_store.NewRun:
    snapshot = definition or {"schema": "test", "workflow": {"name": "hello"}}
    return run_store.NewRun(
        workflow_ref="hello",
        workflow_name="hello",
        definition_digest=canonical.digest(snapshot),
        definition_snapshot=snapshot,  # type: ignore[arg-type]
        input={"who": "world"},
        sources=[
            run_store.SourceFile(
                "", SourceType.FILE, "/w/hello.py", "ab" * 32, ReferenceKind.PATH, "/w/hello.py"
            )
        ],
        project_path="/w",
    )


def test_every_display_status_is_one_of_the_protocols_closed_set() -> None:
    """The one derivation gives exactly the seed's closed set, which clients filter on."""
    derived = set()
    for status, paused, ambiguous, pending, queue in itertools.product(
        RunStatus, (False, True), (False, True), (False, True), (None, *QueueStatus)
    ):
        derived.add(
            run_store.display_status(
                status,
                paused=paused,
                has_ambiguous_effect=ambiguous,
                has_pending_request=pending,
                queue_status=queue,
            )
        )
    assert derived == set(get_args(RunDisplayStatus))
    assert derived == {
        "queued",
        "running",
        "waiting",
        "paused",
        "completed",
        "failed",
        "timed_out",
        "cancelled",
        "ambiguous",
    }


def test_a_created_run_is_queued_with_its_queue_row_and_event(db: StateDatabase) -> None:
    with db.write() as tx:
        view = run_store.create_run(tx, "run-1", new_run(), CLIENT)
    assert view.status is RunStatus.QUEUED
    assert view.queue_status is QueueStatus.QUEUED
    assert view.display_status == "queued"
    assert view.revision == 1
    with db.read() as tx:
        assert run_store.read_run_input(tx, "run-1") == {"who": "world"}
        assert run_store.read_run_error(tx, "run-1") is None
        assert run_store.list_run_sources(tx, "run-1")[0].source_ref == "/w/hello.py"
        assert find_violations(tx) == []


def test_a_snapshot_must_match_its_digest(db: StateDatabase) -> None:
    bad = new_run()
    bad = run_store.NewRun(**{**bad.__dict__, "definition_digest": b"\0" * 32})
    with pytest.raises(Exception, match="digest"), db.write() as tx:
        run_store.create_run(tx, "run-1", bad, CLIENT)
    with db.read() as tx:
        assert run_store.load_run(tx, "run-1") is None


def test_runs_list_newest_first_with_a_cursor(db: StateDatabase, clock: FakeClock) -> None:
    for index in range(5):
        clock.advance(10)
        with db.write() as tx:
            run_store.create_run(tx, f"run-{index}", new_run(), CLIENT)
    with db.read() as tx:
        first = run_store.list_runs(tx, limit=2)
        rest = run_store.list_runs(tx, limit=10, before=(first[-1].created_at, first[-1].run_id))
    assert [v.run_id for v in first] == ["run-4", "run-3"]
    assert [v.run_id for v in rest] == ["run-2", "run-1", "run-0"]


def test_display_status_precedence() -> None:
    show = run_store.display_status
    assert (
        show(
            RunStatus.COMPLETED,
            paused=True,
            has_ambiguous_effect=True,
            has_pending_request=True,
            queue_status=None,
        )
        == "completed"
    )
    assert (
        show(
            RunStatus.RUNNING,
            paused=True,
            has_ambiguous_effect=True,
            has_pending_request=True,
            queue_status=QueueStatus.RUNNING,
        )
        == "ambiguous"
    )
    assert (
        show(
            RunStatus.RUNNING,
            paused=True,
            has_ambiguous_effect=False,
            has_pending_request=True,
            queue_status=QueueStatus.PARKED,
        )
        == "paused"
    )
    assert (
        show(
            RunStatus.WAITING,
            paused=False,
            has_ambiguous_effect=False,
            has_pending_request=True,
            queue_status=QueueStatus.PARKED,
        )
        == "waiting"
    )
    assert (
        show(
            RunStatus.RUNNING,
            paused=False,
            has_ambiguous_effect=False,
            has_pending_request=False,
            queue_status=QueueStatus.RUNNING,
        )
        == "running"
    )
    assert (
        show(
            RunStatus.RUNNING,
            paused=False,
            has_ambiguous_effect=False,
            has_pending_request=False,
            queue_status=QueueStatus.PARKED,
        )
        == "queued"
    )


# conformance: S12
def test_backup_is_verified_private_and_never_overwrites(db: StateDatabase, tmp_path: Path) -> None:
    with db.write() as tx:
        run_store.create_run(tx, "run-1", new_run(), CLIENT)
    (tmp_path / "backups").mkdir()
    destination = tmp_path / "backups" / "backup.sqlite"
    report = backup_database(db, destination)
    assert report.destination == destination
    assert stat.S_IMODE(destination.stat().st_mode) == 0o600
    assert sorted(p.name for p in destination.parent.iterdir()) == ["backup.sqlite"]
    with StateDatabase(destination, mode="read-only") as copy, copy.read() as tx:
        assert run_store.load_run(tx, "run-1") is not None
        assert find_violations(tx) == []
    with pytest.raises(BackupError, match="already exists"):
        backup_database(db, destination)
    with pytest.raises(BackupError, match="absolute"):
        backup_database(db, Path("relative.sqlite"))
    with pytest.raises(BackupError, match="live database"):
        backup_database(db, db.path)


# conformance: S12
def test_status_counts_are_numbers_only(db: StateDatabase) -> None:
    with db.write() as tx:
        run_store.create_run(tx, "run-secret-id", new_run(), CLIENT)
    with db.read() as tx:
        counts = status_counts(tx)
    text = canonical.encode_text(counts)
    assert "run-secret-id" not in text
    assert "world" not in text
    assert "/w" not in text
    assert counts["runs"] == {**{s.value: 0 for s in RunStatus}, "queued": 1}


def test_verify_reports_planted_violations(db: StateDatabase) -> None:
    with db.write() as tx:
        run_store.create_run(tx, "run-1", new_run(), CLIENT)
        tx.execute("UPDATE run_queue SET status = 'done', finished_at = 5 WHERE run_id = 'run-1'")
        tx.execute("UPDATE resources SET revision = 9 WHERE resource_id = 'run:run-1'")
    with db.read() as tx:
        codes = sorted({v.code for v in find_violations(tx)})
    assert codes == ["eventRevisions", "queueState"]


def test_savepoint_undoes_only_its_step(db: StateDatabase) -> None:
    with db.write() as tx:
        tx.execute("INSERT INTO projects VALUES ('a', '/a', 1)")
        with pytest.raises(RuntimeError), tx.savepoint():
            tx.execute("INSERT INTO projects VALUES ('b', '/b', 1)")
            raise RuntimeError("undo b")
        tx.execute("INSERT INTO projects VALUES ('c', '/c', 1)")
    with db.read() as tx:
        names = [row[0] for row in tx.all("SELECT project_id FROM projects ORDER BY 1")]
    assert names == ["a", "c"]


def test_nested_savepoints_undo_their_own_steps_and_reuse_a_few_statements(
    db: StateDatabase,
) -> None:
    statements: list[str] = []
    db.connection.set_trace_callback(statements.append)
    try:
        for round_number in range(50):
            with db.write() as tx, tx.savepoint() as outer:
                outer.execute(
                    "INSERT INTO projects VALUES (?, ?, 1)",
                    (f"o{round_number}", f"/o{round_number}"),
                )
                with pytest.raises(RuntimeError), outer.savepoint() as inner:
                    inner.execute(
                        "INSERT INTO projects VALUES (?, ?, 1)",
                        (f"i{round_number}", f"/i{round_number}"),
                    )
                    with inner.savepoint() as innermost:
                        innermost.execute(
                            "INSERT INTO projects VALUES (?, ?, 1)",
                            (f"n{round_number}", f"/n{round_number}"),
                        )
                    raise RuntimeError("undo the inner step and what it holds")
                with outer.savepoint() as again:  # the same depth again, after a rollback
                    again.execute(
                        "INSERT INTO projects VALUES (?, ?, 1)",
                        (f"a{round_number}", f"/a{round_number}"),
                    )
    finally:
        db.connection.set_trace_callback(None)
    with db.read() as tx:
        kept = {row[0][0] for row in tx.all("SELECT project_id FROM projects")}
    assert kept == {"o", "a"}
    # 50 rounds of nested savepoints take the same handful of statements, which stay in the
    # connection's statement cache (names by depth, not one new name per savepoint).
    savepoint_statements = {s for s in statements if s.split()[0] in ("SAVEPOINT", "RELEASE")}
    savepoint_statements |= {s for s in statements if s.startswith("ROLLBACK TO")}
    assert len(savepoint_statements) <= 8, sorted(savepoint_statements)


def test_verify_reports_a_waiting_run_without_a_request(db: StateDatabase) -> None:
    with db.write() as tx:
        run_store.create_run(tx, "run-1", new_run(), CLIENT)
        tx.execute("UPDATE runs SET status = 'waiting' WHERE run_id = 'run-1'")
        tx.execute("UPDATE run_queue SET status = 'parked' WHERE run_id = 'run-1'")
    with db.read() as tx:
        codes = {v.code for v in find_violations(tx)}
    assert codes == {"waitingRequest"}
