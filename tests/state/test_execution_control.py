"""Scheduling claims, recovery decisions and the control transitions (cancel, pause, resume,
restart), each one transaction that leaves the state free of violations."""

from __future__ import annotations

import pytest

from piwf import canonical
from piwf.clock import FakeClock
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, CommandKind, Conflict, EffectStatus, RecoveryRequired
from piwf.state import StateDatabase
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.enums import EffectOwnerScope, EffectRecovery, RunnerStatus
from piwf.state.execution import runs
from piwf.state.leases import Claim, read_lease
from piwf.workflow import identity
from piwf.workflow import port as p
from piwf.workflow.engine import execute
from piwf.workflow.nodes import Recovery

from .test_execution_support import (
    LEASE_MS,
    OPERATOR,
    SERVER,
    SERVER_ID,
    StorePort,
    attempts,
    claim_is_free,
    command_for,
    create,
    exit_and_recover,
    launch,
    queue_row,
    revision,
    run_once,
    run_status,
    runner_of,
    two_step,
    violations,
)

RUN = "run-1"
CONTROL = "control-1"


def claim_next(db: StateDatabase, exclude: tuple[str, ...] = ()) -> ex.RunLaunch | None:
    with db.write() as tx:
        return ex.claim_next_run(tx, owner_id=SERVER_ID, lease_ms=LEASE_MS, exclude=exclude)


def cancel(
    db: StateDatabase,
    run_id: str = RUN,
    *,
    claim: Claim | None = None,
    expected_revision: int | None = None,
) -> Applied[runs.RunRow] | Adopted[runs.RunRow] | Conflict:
    with db.write() as tx:
        return ex.cancel_run(
            tx,
            run_id,
            actor=OPERATOR,
            control_owner_id=CONTROL,
            lease_ms=LEASE_MS,
            claim=claim,
            expected_revision=expected_revision,
        )


def pause(
    db: StateDatabase,
    run_id: str = RUN,
    *,
    claim: Claim | None = None,
    expected_revision: int | None = None,
) -> Applied[runs.RunRow] | Adopted[runs.RunRow] | Conflict:
    with db.write() as tx:
        return ex.pause_run(
            tx,
            run_id,
            actor=OPERATOR,
            control_owner_id=CONTROL,
            lease_ms=LEASE_MS,
            claim=claim,
            expected_revision=expected_revision,
        )


def resume(
    db: StateDatabase, run_id: str = RUN
) -> Applied[runs.RunRow] | Adopted[runs.RunRow] | Conflict | RecoveryRequired:
    with db.write() as tx:
        return ex.resume_run(tx, run_id, actor=OPERATOR)


def executing_with_effects(db: StateDatabase) -> ex.RunLaunch:
    """A run mid-visit with one applying effect (from the runner) and one pending effect."""
    create(db, two_step(), RUN, {"who": "ada"})
    launched = launch(db)
    claim = launched.claim
    with db.write() as tx:
        ex.apply_node_started(
            tx, claim, p.NodeStarted(RUN, "greet", 1, 1, "action", 1, None, None), lease_ms=LEASE_MS
        )
        request = {"target": "a"}
        ex.apply_reserve_effect(
            tx,
            claim,
            p.EffectReservation(
                RUN,
                "greet",
                1,
                identity.effect_key(RUN, "svc.apply", "greet", 1),
                "svc.apply",
                Recovery.IDEMPOTENT,
                request,
                identity.request_fingerprint(request),
            ),
            lease_ms=LEASE_MS,
        )
        fx.reserve_effect(
            tx,
            source_resource_id=f"run:{RUN}",
            source_revision=1,
            effect_type="svc.later",
            idempotency_key="later",
            payload={},
            recovery=EffectRecovery.MANUAL,
            owner_scope=EffectOwnerScope.RUN,
            actor=SERVER,
            claim=claim,
        )
    return launched


def effect_statuses(db: StateDatabase) -> dict[str, EffectStatus]:
    with db.read() as tx:
        return {effect.effect_type: effect.status for effect in fx.list_effects(tx, f"run:{RUN}")}


# Scheduling ---------------------------------------------------------------------------------


def test_runs_are_claimed_in_availability_order_and_skipped_while_ineligible(
    db: StateDatabase, clock: FakeClock
) -> None:
    workflow = two_step()
    for run_id in ("run-a", "run-b", "run-c", "run-d"):
        create(db, workflow, run_id)
        clock.advance(1)
    with db.write() as tx:
        tx.execute(
            "UPDATE run_queue SET available_at = available_at + 60000 WHERE run_id = 'run-a'"
        )
        tx.execute("UPDATE runs SET paused = 1 WHERE run_id = 'run-c'")
        assert ex.count_runnable(tx) == 2
    first = claim_next(db, exclude=("run-b",))
    assert first is not None and first.run_id == "run-d"
    assert claim_next(db) is not None  # run-b
    assert claim_next(db) is None  # run-a not yet available, run-c paused
    clock.advance(60_000)
    later = claim_next(db)
    assert later is not None and later.run_id == "run-a"
    assert (first.command, first.generation, first.launch_revision) == (
        CommandKind.START,
        1,
        revision(db, "run-d"),
    )
    assert (run_status(db, "run-d"), queue_row(db, "run-d")) == ("running", ("starting", None))


@pytest.mark.parametrize("code", ["sourceChanged", "runnerNoProgress", "effectAmbiguous"])
def test_blocking_failure_classes_are_never_claimed_automatically(
    db: StateDatabase, code: str
) -> None:
    create(db, two_step(), RUN)
    with db.write() as tx:
        tx.execute("UPDATE run_queue SET status = 'parked', error_code = ?", (code,))
        tx.execute("UPDATE runs SET status = 'running'")
    assert claim_next(db) is None
    with db.write() as tx:
        tx.execute("UPDATE run_queue SET error_code = 'runnerCrashed'")
    assert claim_next(db) is not None


def test_a_live_claim_keeps_a_run_from_the_scheduler(db: StateDatabase, clock: FakeClock) -> None:
    create(db, two_step(), RUN)
    launched = launch(db)
    assert exit_and_recover(db, launched).decision is ex.RecoveryDecision.NO_PROGRESS
    assert isinstance(resume(db), Applied)
    with db.write() as tx:
        tx.execute(
            "UPDATE leases SET owner_type = 'server', owner_id = 'x', token_hash = zeroblob(32),"
            " acquired_at = ?, heartbeat_at = ?, expires_at = ?",
            (clock.now_ms(), clock.now_ms(), clock.now_ms() + 10),
        )
    assert claim_next(db) is None
    clock.advance(10)
    again = claim_next(db)
    assert again is not None and again.command is CommandKind.START
    assert again.generation == launched.generation + 1


def test_expired_running_runs_are_found_and_recovered_under_a_new_generation(
    db: StateDatabase, clock: FakeClock
) -> None:
    workflow = two_step()
    create(db, workflow, RUN, {"who": "ada"})
    launched = launch(db)
    store = StorePort(db, launched)
    store.begin_run(p.RunBegun(RUN, p.CommandKind.START, workflow.digest, "t"))
    store.node_started(p.NodeStarted(RUN, "greet", 1, 1, "compute", 1, None, None))
    with db.read() as tx:
        assert ex.expired_running_runs(tx) == []
    # The server dies: its claim expires with the runner's row still live.
    clock.advance(LEASE_MS + 1)
    epoch = runner_of(db, launched).runner_epoch
    with db.read() as tx:
        assert ex.expired_running_runs(tx) == [ex.ExpiredRun(RUN, launched.generation, epoch)]
    with db.write() as tx:
        refused = ex.recover_after_runner_exit(
            tx, RUN, runner_epoch=epoch, actor=SERVER, owner_id="server-b", lease_ms=LEASE_MS
        )
    assert isinstance(refused, Conflict) and "still live" in refused.evidence
    with db.write() as tx:
        ex.record_runner_exit(tx, epoch, RunnerStatus.ORPHANED)
        decided = ex.recover_after_runner_exit(
            tx, RUN, runner_epoch=None, actor=SERVER, owner_id="server-b", lease_ms=LEASE_MS
        )
        lease = read_lease(tx, f"run:{RUN}")
    assert isinstance(decided, Applied) and decided.value.decision is ex.RecoveryDecision.REQUEUED
    assert lease is not None and (lease.generation, lease.owner_id) == (
        launched.generation + 1,
        None,
    )
    with pytest.raises(ClaimLostError):
        store.node_finished(p.NodeFinished(RUN, "greet", 1, 1, {}, 2))
    again, _, result = run_once(db, workflow)
    assert again.command is CommandKind.RESUME and result.status is p.RunStatus.COMPLETED
    assert attempts(db, RUN)[:2] == [("greet", 1, 1, "interrupted"), ("greet", 1, 2, "completed")]
    assert violations(db) == []


def test_a_runner_exit_after_a_handoff_changes_nothing(db: StateDatabase, clock: FakeClock) -> None:
    create(db, two_step(), RUN)
    launched = launch(db)
    clock.advance(LEASE_MS + 1)
    with db.write() as tx:
        ex.record_runner_exit(tx, runner_of(db, launched).runner_epoch, RunnerStatus.CLAIM_LOST)
        tx.execute("UPDATE leases SET generation = generation + 1")
    before = revision(db, RUN)
    assert (
        exit_and_recover(db, launched, RunnerStatus.CLAIM_LOST).decision
        is ex.RecoveryDecision.UNCHANGED
    )
    assert revision(db, RUN) == before


def test_park_for_source_change_blocks_until_resumed(db: StateDatabase) -> None:
    create(db, two_step(), RUN)
    launched = launch(db)
    epoch = runner_of(db, launched).runner_epoch
    with db.write() as tx:
        parked = ex.park_for_source_change(
            tx,
            RUN,
            runner_epoch=epoch,
            actor=SERVER,
            owner_id=SERVER_ID,
            lease_ms=LEASE_MS,
            claim=launched.claim,
            detail="greet.py changed",
        )
        again = ex.park_for_source_change(
            tx, RUN, runner_epoch=epoch, actor=SERVER, owner_id=SERVER_ID, lease_ms=LEASE_MS
        )
    assert (
        isinstance(parked, Applied) and parked.value.decision is ex.RecoveryDecision.SOURCE_CHANGED
    )
    assert isinstance(again, Adopted)
    assert queue_row(db, RUN) == ("parked", "sourceChanged") and claim_is_free(db, RUN)
    assert claim_next(db) is None
    assert isinstance(resume(db), Applied)
    assert queue_row(db, RUN) == ("parked", None)
    assert claim_next(db) is not None


def test_park_for_no_progress_needs_the_run_executing_under_that_runner(db: StateDatabase) -> None:
    create(db, two_step(), RUN)
    launched = launch(db)
    epoch = runner_of(db, launched).runner_epoch
    with db.write() as tx:
        parked = ex.park_for_no_progress(
            tx,
            RUN,
            runner_epoch=epoch,
            actor=SERVER,
            owner_id=SERVER_ID,
            lease_ms=LEASE_MS,
            claim=launched.claim,
        )
    assert isinstance(parked, Applied)
    assert queue_row(db, RUN) == ("parked", "runnerNoProgress")
    assert run_status(db, RUN) == "running"
    with db.write() as tx:
        refused = ex.park_for_source_change(
            tx, RUN, runner_epoch=epoch, actor=SERVER, owner_id=SERVER_ID, lease_ms=LEASE_MS
        )
    assert isinstance(refused, Conflict)


# Cancel -------------------------------------------------------------------------------------


# conformance: X5
def test_cancel_a_queued_run(db: StateDatabase) -> None:
    create(db, two_step(), RUN)
    result = cancel(db)
    assert isinstance(result, Applied) and result.value.status.value == "cancelled"
    assert isinstance(cancel(db), Adopted)
    assert queue_row(db, RUN) == ("cancelled", None) and claim_is_free(db, RUN)
    assert claim_next(db) is None
    assert violations(db) == []


# conformance: X5
# conformance: X12
def test_cancel_a_running_run_with_the_servers_own_claim(db: StateDatabase) -> None:
    launched = executing_with_effects(db)
    before = revision(db, RUN)
    assert isinstance(cancel(db), Conflict)  # nobody force-cancels a live claim
    assert revision(db, RUN) == before
    assert isinstance(cancel(db, claim=launched.claim, expected_revision=before - 1), Conflict)
    result = cancel(db, claim=launched.claim, expected_revision=before)
    assert isinstance(result, Applied)
    assert (run_status(db, RUN), queue_row(db, RUN)) == ("cancelled", ("cancelled", None))
    assert attempts(db, RUN) == [("greet", 1, 1, "cancelled")]
    assert effect_statuses(db) == {
        "svc.apply": EffectStatus.AMBIGUOUS,
        "svc.later": EffectStatus.CANCELLED,
    }
    assert claim_is_free(db, RUN)
    with pytest.raises(ClaimLostError), db.write() as tx:
        ex.apply_node_finished(
            tx, launched.claim, p.NodeFinished(RUN, "greet", 1, 1, {}, 2), lease_ms=LEASE_MS
        )
    with db.read() as tx:
        (applying,) = [e for e in fx.list_effects(tx, f"run:{RUN}") if e.effect_type == "svc.apply"]
        outcomes = [a.outcome.value for a in fx.list_attempts(tx, applying.effect_id) if a.outcome]
    assert outcomes == ["interrupted"]
    assert violations(db) == []


# conformance: X5
def test_cancel_a_run_whose_claim_expired_takes_a_control_claim(
    db: StateDatabase, clock: FakeClock
) -> None:
    launched = executing_with_effects(db)
    clock.advance(LEASE_MS + 1)
    result = cancel(db)
    assert isinstance(result, Applied)
    with db.read() as tx:
        lease = read_lease(tx, f"run:{RUN}")
        event = tx.one(
            "SELECT actor_type, lease_generation FROM events WHERE event_type = 'run.cancelled'"
        )
    assert lease is not None and (lease.generation, lease.owner_id) == (
        launched.generation + 1,
        None,
    )
    assert event is not None and tuple(event) == ("human", launched.generation + 1)
    assert effect_statuses(db)["svc.apply"] is EffectStatus.AMBIGUOUS
    assert attempts(db, RUN) == [("greet", 1, 1, "cancelled")]
    assert violations(db) == []


# conformance: X5
def test_cancel_a_parked_and_a_waiting_run(db: StateDatabase) -> None:
    create(db, two_step(), RUN)
    launched = launch(db)
    assert exit_and_recover(db, launched).decision is ex.RecoveryDecision.NO_PROGRESS
    assert isinstance(cancel(db), Applied)
    assert queue_row(db, RUN) == ("cancelled", None)
    create(db, two_step(), "run-2")
    second = launch(db)
    request_id = identity.request_id("run-2", "gate", 1)
    store = StorePort(db, second)
    store.node_started(p.NodeStarted("run-2", "gate", 1, 1, "checkpoint", 1, None, None))
    store.request_interaction(
        p.InteractionRequested("run-2", "gate", 1, request_id, p.InteractionKind.CHECKPOINT, {})
    )
    store.park(p.RunParked("run-2", p.ParkReason.WAITING, "gate", 1, request_id))
    assert run_status(db, "run-2") == "waiting"
    assert isinstance(cancel(db, "run-2"), Applied)
    with db.read() as tx:
        assert tx.scalar("SELECT status FROM interactive_requests") == "cancelled"
    assert attempts(db, "run-2") == [("gate", 1, 1, "cancelled")]
    assert violations(db) == []


def test_a_terminal_run_cannot_be_cancelled(db: StateDatabase) -> None:
    workflow = two_step()
    create(db, workflow, RUN, {"who": "ada"})
    run_once(db, workflow)
    assert isinstance(cancel(db), Conflict)
    with pytest.raises(LookupError):
        cancel(db, "missing")


# Pause and resume ---------------------------------------------------------------------------


def test_pause_releases_the_claim_and_resume_retries_from_the_boundary(db: StateDatabase) -> None:
    workflow = two_step()
    create(db, workflow, RUN, {"who": "ada"})
    launched = launch(db)
    store = StorePort(db, launched)
    store.begin_run(p.RunBegun(RUN, p.CommandKind.START, workflow.digest, "t"))
    store.node_started(p.NodeStarted(RUN, "greet", 1, 1, "compute", 1, None, None))
    assert isinstance(pause(db), Conflict)  # the runner's live claim must be passed
    paused = pause(db, claim=launched.claim)
    assert isinstance(paused, Applied) and paused.value.display_status == "paused"
    assert isinstance(pause(db), Adopted)
    assert queue_row(db, RUN) == ("parked", None) and claim_is_free(db, RUN)
    assert claim_next(db) is None
    assert (
        exit_and_recover(db, launched, RunnerStatus.CANCELLED).decision
        is ex.RecoveryDecision.UNCHANGED
    )
    resumed = resume(db)
    assert isinstance(resumed, Applied) and not resumed.value.paused
    assert isinstance(resume(db), Adopted)
    again, _, result = run_once(db, workflow)
    assert again.command is CommandKind.RESUME and result.status is p.RunStatus.COMPLETED
    assert attempts(db, RUN)[0] == ("greet", 1, 1, "interrupted")
    assert violations(db) == []


def test_a_queued_run_pauses_without_a_runner_and_resumes_queued(db: StateDatabase) -> None:
    create(db, two_step(), RUN)
    assert isinstance(pause(db), Applied)
    assert claim_next(db) is None
    assert isinstance(resume(db), Applied)
    assert (run_status(db, RUN), queue_row(db, RUN)) == ("queued", ("queued", None))
    launched = claim_next(db)
    assert launched is not None and launched.command is CommandKind.START


def test_resume_of_an_ambiguous_run_waits_for_the_operator(db: StateDatabase) -> None:
    create(db, two_step(), RUN)
    launched = launch(db)
    request = {"x": 1}
    store = StorePort(db, launched)
    store.node_started(p.NodeStarted(RUN, "greet", 1, 1, "action", 1, None, None))
    key = identity.effect_key(RUN, "svc.apply", "greet", 1)
    store.reserve_effect(
        p.EffectReservation(
            RUN,
            "greet",
            1,
            key,
            "svc.apply",
            Recovery.MANUAL,
            request,
            canonical.digest_hex(request),
        )
    )
    assert exit_and_recover(db, launched).decision is ex.RecoveryDecision.EFFECT_AMBIGUOUS
    assert resume(db) == RecoveryRequired("effectAmbiguous")
    assert queue_row(db, RUN) == ("parked", "effectAmbiguous")
    with db.write() as tx:
        (effect,) = fx.list_effects(tx, f"run:{RUN}")
        fx.resolve_ambiguous(tx, effect.effect_id, resolution="retry", actor=OPERATOR)
    assert isinstance(resume(db), Applied)
    relaunched = claim_next(db)
    assert relaunched is not None and relaunched.command is CommandKind.RESUME


# Restart ------------------------------------------------------------------------------------


# conformance: X17
def test_restart_creates_one_fresh_child_and_a_retry_adopts_it(db: StateDatabase) -> None:
    workflow = two_step()
    create(db, workflow, RUN, {"who": "ada"})
    with db.write() as tx:
        assert isinstance(ex.restart_run(tx, RUN, new_run_id="run-r", actor=OPERATOR), Conflict)
    run_once(db, workflow)
    parent_revision = revision(db, RUN)
    with db.write() as tx:
        created = ex.restart_run(tx, RUN, new_run_id="run-r", actor=OPERATOR)
        retried = ex.restart_run(tx, RUN, new_run_id="run-other", actor=OPERATOR)
    assert isinstance(created, Applied) and isinstance(retried, Adopted)
    assert retried.value.run_id == created.value.run_id == "run-r"
    child = created.value
    assert (child.parent_run_id, child.root_run_id, child.restart_number, child.status.value) == (
        RUN,
        RUN,
        1,
        "queued",
    )
    with db.read() as tx:
        row = tx.one(
            "SELECT lineage_kind, parent_terminal_fingerprint, definition_digest, input_hash"
            " FROM runs WHERE run_id = 'run-r'"
        )
        parent = tx.one("SELECT definition_digest, input_hash FROM runs WHERE run_id = ?", (RUN,))
        assert runs.list_run_sources(tx, "run-r") == runs.list_run_sources(tx, RUN)
        saved = ex.read_saved_run(tx, "run-r")
    assert row is not None and parent is not None
    assert row[0] == "restart"
    assert bytes(row[1]) == canonical.digest([RUN, parent_revision])
    assert (row[2], row[3]) == (parent[0], parent[1])
    assert saved is not None and saved.fresh and saved.steps == () and saved.visits == {}
    assert revision(db, RUN) == parent_revision
    launched = launch(db)
    assert (launched.command, launched.parent_run_id) == (CommandKind.RESTART, RUN)
    result = execute(command_for(launched), workflow, StorePort(db, launched))
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, "HELLO ADA")
    assert violations(db) == []


def test_restart_needs_every_effect_settled(db: StateDatabase) -> None:
    executing_with_effects(db)
    with db.write() as tx:
        tx.execute("UPDATE runs SET status = 'failed', finished_at = 1")
        tx.execute("UPDATE run_queue SET status = 'failed', finished_at = 1")
        tx.execute(
            "UPDATE leases SET owner_type = NULL, owner_id = NULL, token_hash = NULL,"
            " acquired_at = NULL, heartbeat_at = NULL, expires_at = NULL"
        )
        refused = ex.restart_run(tx, RUN, new_run_id="run-r", actor=OPERATOR)
    assert isinstance(refused, Conflict) and "unsettled" in refused.evidence
