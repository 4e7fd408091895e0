"""The server's side of a run on the real store: rows, claims, runners and recovery decisions.

What the engine sees through the port (outputs, steps, visits, effects, requests) is tested in
the contract suite, ``tests/contract``, on this store and on the memory port alike. The tests
here drive :func:`piwf.workflow.engine.execute` through :class:`StorePort` too, and check what
only the store has: queue rows and failure codes, claims and generations, runner rows and their
receipts, and what recovery decides after a runner exits.
"""

from __future__ import annotations

from typing import Any

import pytest

from piwf.clock import FakeClock
from piwf.lifecycle import Adopted, Applied, CommandKind, EffectStatus, RecoveryRequired
from piwf.state import StateDatabase
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.enums import RunnerMessageOutcome, RunnerStatus, SubmissionOutcome, SubmissionSource
from piwf.workflow import (
    action,
    checkpoint,
    compute,
    define_workflow,
    idempotent_effect,
    notify,
)
from piwf.workflow import port as p
from piwf.workflow.engine import execute
from tests.contract.workflows import CrashOnFirstCall, single_action

from .test_execution_support import (
    LEASE_MS,
    OPERATOR,
    Crash,
    StorePort,
    attempts,
    claim_is_free,
    command_for,
    compiled,
    create,
    exit_and_recover,
    launch,
    queue_row,
    revision,
    run_once,
    run_status,
    takeover,
    two_step,
    violations,
)


def effect_of(db: StateDatabase, run_id: str) -> fx.Effect:
    with db.read() as tx:
        (effect,) = fx.list_effects(tx, f"run:{run_id}")
    return effect


def effect_attempt_outcomes(db: StateDatabase, effect_id: str) -> list[str | None]:
    with db.read() as tx:
        return [
            None if attempt.outcome is None else attempt.outcome.value
            for attempt in fx.list_attempts(tx, effect_id)
        ]


# conformance: X1
def test_a_finished_run_leaves_its_rows_done_and_its_claim_free(db: StateDatabase) -> None:
    workflow = two_step()
    run_id = create(db, workflow, input={"who": "ada"})
    launched, store, result = run_once(db, workflow)
    assert launched.command is CommandKind.START
    assert result.status is p.RunStatus.COMPLETED
    assert (run_status(db, run_id), queue_row(db, run_id)) == ("completed", ("done", None))
    assert claim_is_free(db, run_id)
    assert attempts(db, run_id) == [("greet", 1, 1, "completed"), ("shout", 1, 1, "completed")]
    with db.read() as tx:
        runner = ex.list_runners(tx, run_id)[0]
    assert runner.status is RunnerStatus.RUNNING
    assert {reply.outcome for reply in store.replies} == {RunnerMessageOutcome.ACCEPTED}
    assert violations(db) == []


def test_the_runner_of_a_finished_run_exits_and_recovery_changes_nothing(
    db: StateDatabase,
) -> None:
    workflow = two_step()
    run_id = create(db, workflow, input={"who": "ada"})
    launched, _, _ = run_once(db, workflow)
    before = revision(db, run_id)
    decided = exit_and_recover(db, launched, RunnerStatus.EXITED)
    assert decided.decision is ex.RecoveryDecision.UNCHANGED
    assert revision(db, run_id) == before
    assert violations(db) == []


def crash_streak(db: StateDatabase, run_id: str) -> int:
    with db.read() as tx:
        count = tx.scalar("SELECT consecutive_errors FROM run_queue WHERE run_id = ?", (run_id,))
    assert isinstance(count, int)
    return count


# conformance: X18
def test_a_crashed_visit_is_requeued_and_retried_by_the_next_generation(
    db: StateDatabase,
) -> None:
    body = CrashOnFirstCall({"done": True})
    workflow = compiled(
        define_workflow(
            name="retry",
            start_at="first",
            nodes={"first": compute(lambda ctx: 1), "work": compute(body)},
            edges=[{"from": "first", "to": "work"}],
        )
    )
    run_id = create(db, workflow)
    launched = launch(db)
    with pytest.raises(Crash):
        execute(command_for(launched), workflow, StorePort(db, launched))
    decided = exit_and_recover(db, launched)
    assert decided.decision is ex.RecoveryDecision.REQUEUED
    assert queue_row(db, run_id) == ("parked", "runnerCrashed")
    assert run_status(db, run_id) == "running"
    assert crash_streak(db, run_id) == 1
    again, _, result = run_once(db, workflow)
    assert crash_streak(db, run_id) == 0, "a finished node ends the crash streak"
    assert again.command is CommandKind.RESUME
    assert again.generation == launched.generation + 1
    assert result.status is p.RunStatus.COMPLETED
    assert attempts(db, run_id) == [
        ("first", 1, 1, "completed"),
        ("work", 1, 1, "interrupted"),
        ("work", 1, 2, "completed"),
    ]
    assert violations(db) == []


# conformance: X7
def test_recovery_returns_an_interrupted_idempotent_effect_to_pending(db: StateDatabase) -> None:
    workflow = single_action(CrashOnFirstCall({"deployed": True}))
    run_id = create(db, workflow)
    launched = launch(db)
    with pytest.raises(Crash):
        execute(command_for(launched), workflow, StorePort(db, launched))
    assert effect_of(db, run_id).status is EffectStatus.APPLYING
    decided = exit_and_recover(db, launched)
    assert decided.decision is ex.RecoveryDecision.REQUEUED
    assert effect_of(db, run_id).status is EffectStatus.PENDING
    _, _, result = run_once(db, workflow)
    assert result.status is p.RunStatus.COMPLETED
    effect = effect_of(db, run_id)
    assert (effect.status, effect.attempt_count) == (EffectStatus.APPLIED, 2)
    assert effect_attempt_outcomes(db, effect.effect_id) == ["interrupted", "applied"]
    assert violations(db) == []


# conformance: X7
def test_recovery_parks_a_run_whose_manual_effect_was_interrupted(db: StateDatabase) -> None:
    workflow = single_action(CrashOnFirstCall({"deployed": True}), recovery="manual")
    run_id = create(db, workflow)
    launched = launch(db)
    with pytest.raises(Crash):
        execute(command_for(launched), workflow, StorePort(db, launched))
    decided = exit_and_recover(db, launched)
    assert decided.decision is ex.RecoveryDecision.EFFECT_AMBIGUOUS
    assert queue_row(db, run_id) == ("parked", "effectAmbiguous")
    effect = effect_of(db, run_id)
    assert (effect.status, effect.attempt_count) == (EffectStatus.AMBIGUOUS, 1)
    with db.write() as tx:
        assert ex.claim_next_run(tx, owner_id="server-a", lease_ms=LEASE_MS) is None
        refused = ex.resume_run(tx, run_id, actor=OPERATOR)
    assert refused == RecoveryRequired("effectAmbiguous")
    with db.write() as tx:
        fx.resolve_ambiguous(tx, effect.effect_id, resolution="applied", actor=OPERATOR)
    with db.write() as tx:
        assert isinstance(ex.resume_run(tx, run_id, actor=OPERATOR), Applied)
    assert queue_row(db, run_id) == ("parked", None)
    assert violations(db) == []


def test_a_new_generation_finding_a_manual_effect_applying_parks_it(
    db: StateDatabase, clock: FakeClock
) -> None:
    body = CrashOnFirstCall()
    workflow = single_action(body, recovery="manual")
    run_id = create(db, workflow)
    launched = launch(db)
    with pytest.raises(Crash):
        execute(command_for(launched), workflow, StorePort(db, launched))
    # No recovery ran (the server died with its runner); a newer generation takes over.
    clock.advance(LEASE_MS + 1)
    claim = takeover(db, run_id)
    relaunched = ex.RunLaunch(claim, run_id, CommandKind.RESUME, revision(db, run_id))
    with db.write() as tx:
        epoch = launched_epoch(db, launched)
        ex.record_runner_exit(tx, epoch, RunnerStatus.ORPHANED)
        tx.execute(
            "INSERT INTO run_runners (runner_epoch, run_id, generation, server_epoch, command,"
            " launch_envelope_hash, launch_revision, ready_revision, status, started_at, ready_at)"
            " SELECT 'runner-late', run_id, ?, 2, 'resume', launch_envelope_hash, 0, 0, 'ready',"
            " 1, 1 FROM run_runners WHERE runner_epoch = ?",
            (claim.generation, epoch),
        )
    result = execute(command_for(relaunched), workflow, StorePort(db, relaunched))
    assert (result.status, result.park_reason) == (
        p.RunStatus.PARKED,
        p.ParkReason.EFFECT_AMBIGUOUS,
    )
    assert queue_row(db, run_id) == ("parked", "effectAmbiguous")
    assert effect_of(db, run_id).status is EffectStatus.AMBIGUOUS
    assert claim_is_free(db, run_id)
    assert body.calls == 1
    assert violations(db) == []


def launched_epoch(db: StateDatabase, launched: ex.RunLaunch) -> str:
    with db.read() as tx:
        return ex.list_runners(tx, launched.run_id)[-1].runner_epoch


# conformance: X9
def test_a_runner_that_exits_before_progress_is_never_relaunched(db: StateDatabase) -> None:
    workflow = two_step()
    run_id = create(db, workflow, input={"who": "ada"})
    launched = launch(db)
    decided = exit_and_recover(db, launched)
    assert decided.decision is ex.RecoveryDecision.NO_PROGRESS
    assert (run_status(db, run_id), queue_row(db, run_id)) == (
        "running",
        ("parked", "runnerNoProgress"),
    )
    assert claim_is_free(db, run_id)
    with db.write() as tx:
        assert ex.count_runnable(tx) == 0
        assert ex.claim_next_run(tx, owner_id="server-a", lease_ms=LEASE_MS) is None
    with db.write() as tx:
        assert isinstance(ex.resume_run(tx, run_id, actor=OPERATOR), Applied)
    again, _, result = run_once(db, workflow)
    assert again.command is CommandKind.START
    assert result.status is p.RunStatus.COMPLETED
    assert violations(db) == []


def test_a_runner_orphaned_by_its_server_is_requeued_even_without_progress(
    db: StateDatabase, clock: FakeClock
) -> None:
    run_id = create(db, two_step(), input={"who": "ada"})
    launched = launch(db)
    clock.advance(LEASE_MS)  # the server died; its claim expired, the next server recovers
    decided = exit_and_recover(db, launched, RunnerStatus.ORPHANED, pass_claim=False)
    assert decided.decision is ex.RecoveryDecision.REQUEUED
    assert queue_row(db, run_id) == ("parked", None)
    again = launch(db)
    assert (again.command, again.generation) == (CommandKind.START, launched.generation + 2)


# conformance: X9
def test_a_runner_that_dies_before_ready_made_no_progress(db: StateDatabase) -> None:
    run_id = create(db, two_step(), input={"who": "ada"})
    launched = launch(db, ready=False)
    assert exit_and_recover(db, launched).decision is ex.RecoveryDecision.NO_PROGRESS
    assert queue_row(db, run_id) == ("parked", "runnerNoProgress")


def test_a_runner_that_only_begins_again_makes_no_progress(db: StateDatabase) -> None:
    workflow = two_step()
    run_id = create(db, workflow, input={"who": "ada"})
    first = launch(db)
    StorePort(db, first).begin_run(
        p.RunBegun(run_id, p.CommandKind.START, workflow.digest, "two-step")
    )
    assert exit_and_recover(db, first).decision is ex.RecoveryDecision.REQUEUED
    second = launch(db)
    result = StorePort(db, second).begin_run(
        p.RunBegun(run_id, p.CommandKind.START, workflow.digest, "two-step")
    )
    assert isinstance(result, Adopted)
    assert exit_and_recover(db, second).decision is ex.RecoveryDecision.NO_PROGRESS


def test_a_checkpoint_parks_the_run_waiting_and_releases_the_claim(db: StateDatabase) -> None:
    workflow = compiled(
        define_workflow(
            name="gate",
            start_at="note",
            nodes={
                "note": notify(message="starting", kind="progress"),
                "gate": checkpoint(summary="ready?"),
            },
            edges=[{"from": "note", "to": "gate"}],
        )
    )
    run_id = create(db, workflow)
    launched, _, result = run_once(db, workflow)
    assert result.status is p.RunStatus.WAITING
    assert (run_status(db, run_id), queue_row(db, run_id)) == ("waiting", ("parked", None))
    assert claim_is_free(db, run_id)
    assert attempts(db, run_id) == [("note", 1, 1, "completed"), ("gate", 1, 1, "waiting")]
    assert (
        exit_and_recover(db, launched, RunnerStatus.EXITED).decision
        is ex.RecoveryDecision.UNCHANGED
    )
    with db.write() as tx:
        assert ex.claim_next_run(tx, owner_id="server-a", lease_ms=LEASE_MS) is None
    assert violations(db) == []


def test_recovery_makes_a_run_that_died_before_parking_wait_for_its_answer(
    db: StateDatabase,
) -> None:
    workflow = compiled(
        define_workflow(
            name="gate",
            start_at="gate",
            nodes={
                "gate": checkpoint(summary="ready?"),
                "done": compute(lambda ctx: ctx.outputs["gate"]),
            },
            edges=[{"from": "gate", "to": "done"}],
        )
    )
    run_id = create(db, workflow)
    launched = launch(db)
    store = StorePort(db, launched)
    store.crash_after = p.InteractionRequested
    with pytest.raises(Crash):
        execute(command_for(launched), workflow, store)
    # The request committed but the run never parked: recovery makes it wait for its answer.
    assert exit_and_recover(db, launched).decision is ex.RecoveryDecision.WAITING
    assert (run_status(db, run_id), queue_row(db, run_id)) == ("waiting", ("parked", None))
    assert claim_is_free(db, run_id)
    # The answer makes the run claimable again (running, parked, available now).
    with db.write() as tx:
        request_id = tx.scalar(
            "SELECT request_id FROM interactive_requests WHERE run_id = ?", (run_id,)
        )
        answered = ex.answer_request(
            tx,
            request_id,
            {"ok": True},
            source=SubmissionSource.CLIENT,
            actor=OPERATOR,
            submission_id="client:1",
        )
    assert isinstance(answered, Applied) and answered.value.outcome is SubmissionOutcome.WON
    assert (run_status(db, run_id), queue_row(db, run_id)) == ("running", ("parked", None))
    _, _, result = run_once(db, workflow)
    assert result.status is p.RunStatus.COMPLETED
    with db.read() as tx:
        status = tx.scalar("SELECT status FROM interactive_requests WHERE run_id = ?", (run_id,))
    assert status == "settled"
    assert violations(db) == []


def test_a_crash_loop_backs_off_then_parks_until_an_explicit_resume(
    db: StateDatabase, clock: FakeClock
) -> None:
    crashing = {"on": True}

    def body(ctx: Any) -> Any:
        if crashing["on"]:
            raise Crash("the action kills its runner every time, after its effect began")
        return {"done": True}

    workflow = compiled(
        define_workflow(
            name="loop",
            start_at="work",
            nodes={"work": action(effect=idempotent_effect("t.loop"), run=body)},
            edges=[],
        )
    )
    run_id = create(db, workflow)
    delays = []
    for crash in range(1, ex.CRASH_LOOP_LIMIT + 1):
        launched = launch(db)
        with pytest.raises(Crash):
            execute(command_for(launched), workflow, StorePort(db, launched))
        assert exit_and_recover(db, launched).decision is ex.RecoveryDecision.REQUEUED
        with db.read() as tx:
            available_at = tx.scalar(
                "SELECT available_at FROM run_queue WHERE run_id = ?", (run_id,)
            )
        delays.append(available_at - clock.now_ms())
        if crash < ex.CRASH_LOOP_LIMIT:
            assert queue_row(db, run_id) == ("parked", "runnerCrashed")
            with db.read() as tx:  # not claimable before its back-off ends
                assert ex.count_runnable(tx) == (1 if delays[-1] == 0 else 0)
                # ... but the back-off is a scheduled wake: an idle server stays up for it.
                assert ex.has_scheduled_work(tx)
            clock.advance(delays[-1] + LEASE_MS + 1)
    assert delays[:-1] == [ex.crash_backoff_ms(n) for n in range(1, ex.CRASH_LOOP_LIMIT)]
    assert delays[:3] == [0, 1_000, 2_000]
    # The class stays runnerCrashed (a closed set); the count and the way out are its detail.
    assert queue_row(db, run_id) == ("parked", "runnerCrashed")
    with db.read() as tx:
        detail = tx.one(
            "SELECT b.content FROM run_queue q JOIN blobs b ON b.blob_hash = q.error_hash"
            " WHERE q.run_id = ?",
            (run_id,),
        )
    assert detail is not None
    assert f"crashed {ex.CRASH_LOOP_LIMIT} times in a row" in bytes(detail[0]).decode()
    assert f"piwf run resume {run_id}" in bytes(detail[0]).decode()
    clock.advance(3_600_000)
    with db.write() as tx:
        assert ex.count_runnable(tx) == 0, "a crash loop waits for an operator"
        assert not ex.has_scheduled_work(tx), "nothing will start by itself"
        assert isinstance(ex.resume_run(tx, run_id, actor=OPERATOR), Applied)
        assert (
            tx.scalar("SELECT consecutive_errors FROM run_queue WHERE run_id = ?", (run_id,)) == 0
        )
    crashing["on"] = False
    _, _, result = run_once(db, workflow)
    assert result.status is p.RunStatus.COMPLETED
    assert violations(db) == []
