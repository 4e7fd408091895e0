"""Runner rows (one live runner per run, recorded before spawn) and runner-message receipts."""

from __future__ import annotations

import sqlite3

import pytest

from piwf import canonical
from piwf.clock import FakeClock
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, Conflict, RecoveryRequired
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.enums import QueueStatus, RunnerMessageOutcome, RunnerStatus
from piwf.workflow import port as p
from piwf.workflow.port_codec import PortCodecError, result_from_json, result_to_json

from .test_execution_support import (
    LEASE_MS,
    create,
    dump,
    launch,
    queue_row,
    revision,
    runner_of,
    takeover,
    two_step,
)

RUN = "run-1"


def claimed(db: StateDatabase) -> ex.RunLaunch:
    create(db, two_step(), RUN, {"who": "ada"})
    with db.write() as tx:
        launched = ex.claim_next_run(tx, owner_id="server-a", lease_ms=LEASE_MS)
    assert launched is not None
    return launched


def record(
    db: StateDatabase, launched: ex.RunLaunch, epoch: str = "runner-1", envelope: object = None
) -> object:
    with db.write() as tx:
        return ex.record_runner_launch(
            tx,
            launched,
            runner_epoch=epoch,
            server_epoch=1,
            envelope=envelope if envelope is not None else {"runId": RUN},
            lease_ms=LEASE_MS,
        )


def test_a_runner_is_recorded_starting_before_spawn_then_ready(db: StateDatabase) -> None:
    launched = claimed(db)
    assert queue_row(db, RUN) == ("starting", None)
    before = revision(db, RUN)
    recorded = record(db, launched)
    assert isinstance(recorded, Applied)
    runner = recorded.value
    assert (runner.status, runner.command.value, runner.generation) == (
        RunnerStatus.STARTING,
        "start",
        launched.generation,
    )
    assert runner.launch_revision == launched.launch_revision == before
    assert isinstance(record(db, launched), Adopted)
    assert isinstance(record(db, launched, envelope={"other": True}), Conflict)
    with db.write() as tx:
        assert isinstance(
            ex.record_runner_process(
                tx, launched.claim, "runner-1", 77, "77:boot", lease_ms=LEASE_MS
            ),
            Applied,
        )
        assert isinstance(
            ex.record_runner_process(
                tx, launched.claim, "runner-1", 77, "77:boot", lease_ms=LEASE_MS
            ),
            Adopted,
        )
        assert isinstance(
            ex.record_runner_process(
                tx, launched.claim, "runner-1", 78, "78:boot", lease_ms=LEASE_MS
            ),
            Conflict,
        )
    # Launch and process records are supervision facts: the run revision did not move.
    assert revision(db, RUN) == before
    with db.write() as tx:
        ready = ex.mark_runner_ready(tx, launched.claim, "runner-1", lease_ms=LEASE_MS)
        again = ex.mark_runner_ready(tx, launched.claim, "runner-1", lease_ms=LEASE_MS)
    assert isinstance(ready, Applied) and isinstance(again, Adopted)
    assert ready.value.ready_revision == before + 1 == revision(db, RUN)
    assert ready.value.progress_baseline == before + 1
    assert queue_row(db, RUN) == ("running", None)


def test_a_launch_record_refuses_a_changed_or_not_starting_run(db: StateDatabase) -> None:
    launched = claimed(db)
    stale = ex.RunLaunch(launched.claim, RUN, launched.command, launched.launch_revision - 1)
    assert isinstance(record(db, stale), Conflict)
    assert isinstance(record(db, launched), Applied)
    with db.write() as tx:
        ex.mark_runner_ready(tx, launched.claim, "runner-1", lease_ms=LEASE_MS)
    relaunch = ex.RunLaunch(launched.claim, RUN, launched.command, revision(db, RUN))
    assert isinstance(record(db, relaunch, "runner-2"), Conflict)


# conformance: S9
def test_one_live_runner_per_run(db: StateDatabase) -> None:
    launched = claimed(db)
    record(db, launched)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"), db.write() as tx:
        tx.execute(
            "INSERT INTO run_runners (runner_epoch, run_id, generation, server_epoch, command,"
            " launch_envelope_hash, launch_revision, status, started_at)"
            " SELECT 'runner-2', run_id, generation, 1, 'start', launch_envelope_hash, 0,"
            " 'starting', 1 FROM run_runners WHERE runner_epoch = 'runner-1'"
        )
    with db.write() as tx:
        ex.record_runner_exit(tx, "runner-1", RunnerStatus.CRASHED, exit_code=1)
        tx.execute(
            "INSERT INTO run_runners (runner_epoch, run_id, generation, server_epoch, command,"
            " launch_envelope_hash, launch_revision, status, started_at)"
            " SELECT 'runner-2', run_id, generation, 1, 'start', launch_envelope_hash, 0,"
            " 'starting', 1 FROM run_runners WHERE runner_epoch = 'runner-1'"
        )


def test_runner_exit_closes_the_row_once_without_a_claim(db: StateDatabase) -> None:
    launched = claimed(db)
    record(db, launched)
    before = revision(db, RUN)
    with db.write() as tx:
        with pytest.raises(ValueError, match="not a runner outcome"):
            ex.record_runner_exit(tx, "runner-1", RunnerStatus.RUNNING)
        closed = ex.record_runner_exit(
            tx, "runner-1", RunnerStatus.TIMED_OUT, signal="SIGKILL", diagnostic="deadline"
        )
        again = ex.record_runner_exit(tx, "runner-1", RunnerStatus.TIMED_OUT)
        other = ex.record_runner_exit(tx, "runner-1", RunnerStatus.CRASHED)
        with pytest.raises(LookupError):
            ex.record_runner_exit(tx, "runner-9", RunnerStatus.CRASHED)
    assert (
        isinstance(closed, Applied) and isinstance(again, Adopted) and isinstance(other, Conflict)
    )
    assert (closed.value.status, closed.value.signal) == (RunnerStatus.TIMED_OUT, "SIGKILL")
    assert closed.value.finished_at is not None
    assert revision(db, RUN) == before
    with db.write() as tx:
        assert isinstance(
            ex.mark_runner_ready(tx, launched.claim, "runner-1", lease_ms=LEASE_MS), Conflict
        )


def test_runner_writes_need_the_live_claim(db: StateDatabase, clock: FakeClock) -> None:
    launched = claimed(db)
    record(db, launched)
    clock.advance(LEASE_MS + 1)
    takeover(db, RUN)
    before = dump(db)
    with pytest.raises(ClaimLostError), db.write() as tx:
        ex.mark_runner_ready(tx, launched.claim, "runner-1", lease_ms=LEASE_MS)
    assert dump(db) == before


# Receipts -----------------------------------------------------------------------------------


def fingerprint(message: object) -> bytes:
    return canonical.digest(p.message_to_json(message))


def send(
    db: StateDatabase, launched: ex.RunLaunch, epoch: str, message_id: str, message: p.NodeStarted
) -> ex.RunnerReply:
    with db.write() as tx:
        return ex.apply_runner_message(
            tx,
            launched.claim,
            epoch,
            message_id,
            fingerprint(message),
            lambda: ex.apply_node_started(tx, launched.claim, message, lease_ms=LEASE_MS),
        )


# conformance: X6
def test_a_repeated_runner_message_gets_its_stored_answer(db: StateDatabase) -> None:
    create(db, two_step(), RUN, {"who": "ada"})
    launched = launch(db)
    epoch = runner_of(db, launched).runner_epoch
    started = p.NodeStarted(RUN, "greet", 1, 1, "compute", 5, None, None)
    first = send(db, launched, epoch, "m1", started)
    assert (first.outcome, first.replayed) == (RunnerMessageOutcome.ACCEPTED, False)
    assert first.result == Applied(p.Committed(first.revision))
    assert runner_of(db, launched).status is RunnerStatus.RUNNING
    before = dump(db)
    replay = send(db, launched, epoch, "m1", started)
    assert (replay.outcome, replay.result, replay.revision, replay.replayed) == (
        first.outcome,
        first.result,
        first.revision,
        True,
    )
    assert dump(db) == before
    reused = send(
        db, launched, epoch, "m1", p.NodeStarted(RUN, "other", 1, 1, "compute", 5, None, None)
    )
    assert (reused.outcome, reused.result) == (RunnerMessageOutcome.REJECTED, None)
    assert dump(db) == before
    # A new message id for the same change is applied again and adopted by the store itself.
    adopted = send(db, launched, epoch, "m2", started)
    assert adopted.outcome is RunnerMessageOutcome.ADOPTED
    conflict = send(
        db, launched, epoch, "m3", p.NodeStarted(RUN, "greet", 3, 1, "compute", 5, None, None)
    )
    assert conflict.outcome is RunnerMessageOutcome.REJECTED and isinstance(
        conflict.result, Conflict
    )
    assert (
        send(db, launched, "runner-unknown", "m4", started).outcome is RunnerMessageOutcome.REJECTED
    )


def test_a_receipt_keeps_a_result_blob_only_when_the_result_says_more_than_its_revision(
    db: StateDatabase,
) -> None:
    create(db, two_step(), RUN, {"who": "ada"})
    launched = launch(db)
    epoch = runner_of(db, launched).runner_epoch
    current = revision(db, RUN)
    settled = p.SettledEffect(p.EffectOutcome.REJECTED, {"code": 1}, "no")
    results: dict[str, p.PortResult] = {
        "m-plain": Applied(p.Committed(current)),
        "m-settled": Applied(p.Committed(current, settled=settled)),
        "m-adopted": Adopted(p.Committed(current)),
    }
    for message_id, result in results.items():
        for replayed in (False, True):
            with db.write() as tx:
                reply = ex.apply_runner_message(
                    tx,
                    launched.claim,
                    epoch,
                    message_id,
                    canonical.digest({"message": message_id}),
                    lambda result=result: result,
                )
            assert (reply.result, reply.revision, reply.replayed) == (result, current, replayed)
    with db.read() as tx:
        kept = {
            row["message_id"]: row["result_hash"] is not None
            for row in tx.all("SELECT message_id, result_hash FROM runner_messages")
        }
    assert kept == {"m-plain": False, "m-settled": True, "m-adopted": True}


# conformance: X13
def test_a_runner_that_lost_its_claim_gets_a_stored_claim_lost(
    db: StateDatabase, clock: FakeClock
) -> None:
    create(db, two_step(), RUN, {"who": "ada"})
    launched = launch(db)
    epoch = runner_of(db, launched).runner_epoch
    clock.advance(LEASE_MS + 1)
    takeover(db, RUN)
    started = p.NodeStarted(RUN, "greet", 1, 1, "compute", 5, None, None)
    before = revision(db, RUN)
    lost = send(db, launched, epoch, "m1", started)
    assert (lost.outcome, lost.result) == (RunnerMessageOutcome.CLAIM_LOST, None)
    assert lost.error is not None and "generationChanged" in lost.error
    replay = send(db, launched, epoch, "m1", started)
    assert (replay.outcome, replay.error, replay.replayed) == (lost.outcome, lost.error, True)
    assert revision(db, RUN) == before
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM node_attempts") == 0
        assert tx.scalar("SELECT status FROM run_queue") == QueueStatus.RUNNING.value


def test_port_results_round_trip_through_their_stored_form() -> None:
    results: list[p.PortResult] = [
        Applied(p.Committed(3)),
        Adopted(p.Committed(None)),
        Adopted(
            p.Committed(4, settled=p.SettledEffect(p.EffectOutcome.REJECTED, {"code": 1}, "no"))
        ),
        Conflict("why"),
        RecoveryRequired("effectAmbiguous"),
    ]
    for result in results:
        assert result_from_json(result_to_json(result)) == result
    with pytest.raises(PortCodecError, match="unknown"):
        result_from_json({"kind": "other", "value": {}})
