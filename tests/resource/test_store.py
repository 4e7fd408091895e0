"""The managed-resource store on a real SQLite file: apply, claim, result CAS, failure backoff,
fencing, deletion with finalizers, effects with observe recovery, child runs, invariants."""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

import pytest

from piwf import canonical
from piwf.clock import FakeClock
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, Conflict, EffectStatus, RunStatus
from piwf.state import StateDatabase
from piwf.state import effects as fx
from piwf.state import enums as e
from piwf.state.diagnostics import find_violations
from piwf.state.enums import (
    ActorType,
    OwnerType,
    ReconcileOutcome,
    ResourceQueueReason,
    ResourceRunnerStatus,
    SourceType,
)
from piwf.state.execution import runs as run_store
from piwf.state.leases import take_claim
from piwf.state.records import Actor, list_events
from piwf.state.resources import calls as calls
from piwf.state.resources import managed as store
from piwf.state.resources import reconciles as rc
from piwf.state.resources import runners as runners
from piwf.state.resources.status import StatusPatch
from piwf.state.schema import SCHEMA_SQL
from piwf.workflow.sources import ReferenceKind

LEASE_MS = 30_000
CLIENT = Actor(ActorType.CLIENT)
RESOLVED = store.ResolvedManager("/managers/greeting.py", "a" * 64, 5_000, {"phase": "pending"})

MIRRORS: list[tuple[str, str, type[Enum]]] = [
    ("managed_resource_queue", "reason", e.ResourceQueueReason),
    ("managed_resource_runners", "status", e.ResourceRunnerStatus),
    ("managed_resource_runners", "result", e.ReconcileOutcome),
    ("effects", "recovery", e.EffectRecovery),
]


@pytest.mark.parametrize(("table", "column", "enum"), MIRRORS)
def test_each_resource_enum_mirrors_its_check_constraint(
    table: str, column: str, enum: type[Enum]
) -> None:
    body = SCHEMA_SQL.split(f"CREATE TABLE {table} (", 1)[1].split(") STRICT", 1)[0]
    match = re.search(rf"\b{column} [^,]*?CHECK \({column} IN \(([^)]*)\)\)", body, re.S)
    assert match, f"no CHECK list for {table}.{column}"
    assert set(re.findall(r"'([^']*)'", match.group(1))) == {m.value for m in enum}


def apply(db: StateDatabase, spec: dict[str, Any], key: str = "ada", **kwargs: Any) -> Any:
    with db.write() as tx:
        return store.apply_resource(
            tx,
            manager="greeting",
            key=key,
            spec=spec,
            resolved=kwargs.pop("resolved", RESOLVED),
            project_path=None,
            actor=CLIENT,
            **kwargs,
        )


def claim(db: StateDatabase, owner: str = "server-a") -> rc.ReconcileLaunch:
    """Claim the next due resource and record its runner row, as the server does (earlier
    runner processes are recorded as exited first)."""
    with db.write() as tx:
        for (reconcile_id,) in tx.all(
            "SELECT reconcile_id FROM managed_resource_runners WHERE status = 'starting'"
        ):
            runners.record_reconcile_exit(tx, reconcile_id, ResourceRunnerStatus.EXITED)
        launch = rc.claim_next_reconcile(tx, owner_id=owner, lease_ms=LEASE_MS)
        assert launch is not None
        rc.record_reconcile_launch(
            tx,
            launch,
            reconcile_id=f"rec-{launch.claim.generation}-{owner}",
            server_epoch=1,
            lease_ms=LEASE_MS,
        )
    return launch


def rid(launch: rc.ReconcileLaunch, owner: str = "server-a") -> str:
    return f"rec-{launch.claim.generation}-{owner}"


def settled(**patch: Any) -> rc.ResultIn:
    return rc.ResultIn(ReconcileOutcome.SETTLED, StatusPatch(**patch))


def view(db: StateDatabase, key: str = "ada") -> store.ResourceView:
    with db.read() as tx:
        row = store.get_resource(tx, "greeting", key)
        assert row is not None
        return store.read_view(tx, row)


def test_apply_creates_then_adopts_an_equal_spec_then_bumps_the_generation(
    db: StateDatabase,
) -> None:
    created = apply(db, {"name": "ada"})
    assert isinstance(created, Applied)
    row = created.value
    assert (row.generation, row.observed_generation, row.resource_version) == (1, 0, 1)
    assert row.uid.startswith("mr-")
    assert view(db).queue is not None
    assert view(db).status == {"phase": "pending"}

    again = apply(db, {"name": "ada"})
    assert isinstance(again, Adopted)
    assert again.value.resource_version == 1

    changed = apply(db, {"name": "bob"})
    assert isinstance(changed, Applied)
    assert (changed.value.generation, changed.value.resource_version) == (2, 2)
    assert view(db).spec == {"name": "bob"}

    stale = apply(db, {"name": "cy"}, expected_version=1)
    assert isinstance(stale, Conflict)
    assert stale.evidence.startswith("resource ")
    assert "is at version 2, not 1: someone changed it since it was read" in stale.evidence
    assert "Read it again (piwf resource get " in stale.evidence
    assert view(db).spec == {"name": "bob"}


def test_a_claim_takes_a_new_generation_without_moving_the_resource_version(
    db: StateDatabase, clock: FakeClock
) -> None:
    apply(db, {"name": "ada"})
    launch = claim(db)
    assert launch.claim.generation == 1
    assert launch.resource_version == 1
    assert launch.snapshot["spec"] == {"name": "ada"}
    assert view(db).row.resource_version == 1
    assert view(db).reconciling
    with db.write() as tx:
        assert rc.claim_next_reconcile(tx, owner_id="server-b", lease_ms=LEASE_MS) is None


def test_a_settled_result_writes_the_patch_once_and_leaves_the_queue(
    db: StateDatabase, clock: FakeClock
) -> None:
    apply(db, {"name": "ada"})
    launch = claim(db)
    condition = {"type": "Ready", "status": "True", "reason": "Done"}
    with db.write() as tx:
        outcome = rc.finish_reconcile(
            tx,
            launch.claim,
            rid(launch),
            settled(status={"phase": "ready"}, conditions=[condition], finalizers=["x/y"]),
            lease_ms=LEASE_MS,
        )
    assert outcome is ReconcileOutcome.SETTLED
    current = view(db)
    assert current.row.resource_version == 2
    assert current.row.observed_generation == 1
    assert current.status == {"phase": "ready"}
    assert current.finalizers == ["x/y"]
    assert current.conditions[0]["observedGeneration"] == 1
    first_transition = current.conditions[0]["lastTransitionTime"]
    assert current.queue is None
    assert not current.reconciling
    assert current.state == "settled"

    # The same status again writes nothing: the resource version stays.
    with db.write() as tx:
        store.request_reconcile(tx, current.row)
    clock.advance(1000)
    launch = claim(db)
    with db.write() as tx:
        rc.finish_reconcile(
            tx,
            launch.claim,
            rid(launch),
            settled(status={"phase": "ready"}, conditions=[condition]),
            lease_ms=LEASE_MS,
        )
    assert view(db).row.resource_version == 2
    assert view(db).conditions[0]["lastTransitionTime"] == first_transition


def test_a_write_during_the_reconcile_makes_its_result_a_conflict_due_now(
    db: StateDatabase, clock: FakeClock
) -> None:
    apply(db, {"name": "ada"})
    launch = claim(db)
    apply(db, {"name": "bob"})  # a spec change while the reconcile runs
    clock.advance(500)
    with db.write() as tx:
        outcome = rc.finish_reconcile(
            tx, launch.claim, rid(launch), settled(status={"phase": "stale"}), lease_ms=LEASE_MS
        )
    assert outcome is ReconcileOutcome.CONFLICT
    current = view(db)
    assert current.status == {"phase": "pending"}
    assert current.row.observed_generation == 0
    assert current.queue is not None
    assert current.queue.reason is ResourceQueueReason.CONFLICT
    assert current.queue.available_at == clock.now_ms()
    assert not current.reconciling


def test_an_enqueue_during_the_reconcile_survives_a_settled_result(db: StateDatabase) -> None:
    apply(db, {"name": "ada"})
    launch = claim(db)
    with db.write() as tx:
        row = store.get_resource(tx, "greeting", "ada")
        assert row is not None
        store.enqueue(tx, row.uid, ResourceQueueReason.CHILD_FINISHED)
        rc.finish_reconcile(tx, launch.claim, rid(launch), settled(), lease_ms=LEASE_MS)
    assert view(db).queue is not None


def test_an_event_during_the_reconcile_is_not_postponed_by_its_backoff_or_requeue_after(
    db: StateDatabase, clock: FakeClock
) -> None:
    """``piwf resource reconcile`` (or a child run's end) while a reconcile runs is due at once,
    whether that reconcile then fails (its streak still counts) or asks to be requeued later."""
    apply(db, {"name": "ada"})
    for _ in range(3):  # a streak, so that a backoff would be long
        launch = claim(db)
        with db.write() as tx:
            clock.set(rc.fail_reconcile(tx, launch.claim, rid(launch), "boom", lease_ms=LEASE_MS))
    launch = claim(db)
    with db.write() as tx:
        row = store.get_resource(tx, "greeting", "ada")
        assert row is not None
        store.request_reconcile(tx, row)
        due = rc.fail_reconcile(tx, launch.claim, rid(launch), "still boom", lease_ms=LEASE_MS)
    assert due == clock.now_ms()
    queue = view(db).queue
    assert queue is not None
    assert (queue.available_at, queue.reason, queue.consecutive_errors, queue.last_error) == (
        clock.now_ms(),
        ResourceQueueReason.REQUESTED,
        4,
        "still boom",
    )

    launch = claim(db)
    with db.write() as tx:
        row = store.get_resource(tx, "greeting", "ada")
        assert row is not None
        store.enqueue(tx, row.uid, ResourceQueueReason.CHILD_FINISHED)
        rc.finish_reconcile(
            tx,
            launch.claim,
            rid(launch),
            rc.ResultIn(ReconcileOutcome.REQUEUE_AFTER, StatusPatch(), after_ms=60_000),
            lease_ms=LEASE_MS,
        )
    queue = view(db).queue
    assert queue is not None
    assert (queue.available_at, queue.reason, queue.consecutive_errors) == (
        clock.now_ms(),
        ResourceQueueReason.CHILD_FINISHED,
        0,
    )


def test_failures_back_off_exponentially_up_to_a_minute(
    db: StateDatabase, clock: FakeClock
) -> None:
    assert [rc.backoff_ms(n) for n in range(9)] == [
        1000,
        2000,
        4000,
        8000,
        16000,
        32000,
        60000,
        60000,
        60000,
    ]
    apply(db, {"name": "ada"})
    delays = []
    for _ in range(4):
        launch = claim(db)
        with db.write() as tx:
            due = rc.fail_reconcile(tx, launch.claim, rid(launch), "boom", lease_ms=LEASE_MS)
        delays.append(due - clock.now_ms())
        clock.set(due)
    assert delays == [1000, 2000, 4000, 8000]
    queue = view(db).queue
    assert queue is not None
    assert (queue.consecutive_errors, queue.last_error, queue.reason) == (
        4,
        "boom",
        ResourceQueueReason.ERROR,
    )
    launch = claim(db)
    with db.write() as tx:
        rc.finish_reconcile(
            tx,
            launch.claim,
            rid(launch),
            rc.ResultIn(ReconcileOutcome.REQUEUE_AFTER, StatusPatch(), after_ms=5000),
            lease_ms=LEASE_MS,
        )
    queue = view(db).queue
    assert queue is not None
    assert queue.consecutive_errors == 0
    assert queue.available_at == clock.now_ms() + 5000


# conformance: X13
def test_a_worker_that_lost_its_claim_records_no_failure_and_no_result(
    db: StateDatabase, clock: FakeClock
) -> None:
    apply(db, {"name": "ada"})
    stale = claim(db)
    clock.advance(LEASE_MS + 1)  # the claim expires; another owner takes the resource
    with db.write() as tx:
        taken = take_claim(tx, stale.resource_id, OwnerType.RESOURCE_MANAGER, "server-b", LEASE_MS)
        assert isinstance(taken, Applied)
    before = view(db)
    with pytest.raises(ClaimLostError) as lost, db.write() as tx:
        rc.fail_reconcile(tx, stale.claim, rid(stale), "late failure", lease_ms=LEASE_MS)
    assert lost.value.reason == "generationChanged"
    with pytest.raises(ClaimLostError), db.write() as tx:
        rc.finish_reconcile(
            tx, stale.claim, rid(stale), settled(status={"phase": "x"}), lease_ms=LEASE_MS
        )
    after = view(db)
    assert after.queue == before.queue
    assert after.status == before.status
    assert after.row.resource_version == before.row.resource_version


def test_deletion_waits_for_finalizers_and_never_reuses_the_uid(db: StateDatabase) -> None:
    plain = apply(db, {"name": "no-finalizer"}, key="plain").value
    with db.write() as tx:
        removed = store.request_deletion(tx, plain, CLIENT)
    assert isinstance(removed, Applied)
    assert removed.value is None

    row = apply(db, {"name": "ada"}).value
    launch = claim(db)
    with db.write() as tx:
        rc.finish_reconcile(
            tx, launch.claim, rid(launch), settled(finalizers=["cleanup"]), lease_ms=LEASE_MS
        )
        marked = store.request_deletion(tx, store.get_resource(tx, "greeting", "ada"), CLIENT)  # type: ignore[arg-type]
    assert isinstance(marked, Applied)
    assert marked.value is not None
    assert view(db).state == "deleting"
    with db.write() as tx:
        again = store.request_deletion(tx, store.get_resource(tx, "greeting", "ada"), CLIENT)  # type: ignore[arg-type]
    assert isinstance(again, Adopted)
    assert isinstance(apply(db, {"name": "bob"}), Conflict)  # no spec change while deleting

    launch = claim(db)
    assert launch.snapshot["deletionTimestamp"] is not None
    with db.write() as tx:
        outcome = rc.finish_reconcile(
            tx, launch.claim, rid(launch), settled(finalizers=[]), lease_ms=LEASE_MS
        )
        assert store.get_resource(tx, "greeting", "ada") is None
        audit = [event.event_type for event in list_events(tx, row.resource_id)]
    assert outcome is ReconcileOutcome.DELETED
    assert audit[0] == "resource.created"
    assert audit[-1] == "resource.deleted"

    reborn = apply(db, {"name": "ada"}).value
    assert reborn.uid != row.uid
    assert reborn.generation == 1
    with db.read() as tx:
        assert find_violations(tx) == []


# conformance: S7
def test_effects_observe_before_an_uncertain_apply_is_repeated(
    db: StateDatabase, clock: FakeClock
) -> None:
    apply(db, {"name": "ada"})
    first = claim(db)
    request = {"path": "/x"}
    with db.write() as tx:
        state = calls.reserve_effect(
            tx, first.claim, key="write:1", kind="file.write", request=request, lease_ms=LEASE_MS
        )
        assert not isinstance(state, Conflict)
        assert state.status is EffectStatus.PENDING
        begun = calls.begin_effect(tx, first.claim, state.effect_id, lease_ms=LEASE_MS)
        assert not isinstance(begun, Conflict)
        assert (begun.status, begun.attempt) == (EffectStatus.APPLYING, 1)
        # This reconcile is applying it now: a second reserve must not hand it out again.
        assert isinstance(
            calls.reserve_effect(
                tx,
                first.claim,
                key="write:1",
                kind="file.write",
                request=request,
                lease_ms=LEASE_MS,
            ),
            Conflict,
        )
        assert isinstance(
            calls.reserve_effect(
                tx,
                first.claim,
                key="write:1",
                kind="file.write",
                request={"path": "/y"},
                lease_ms=LEASE_MS,
            ),
            Conflict,
        )
    effect_id = state.effect_id
    # The runner dies mid-apply; its claim expires and the next reconcile takes over.
    clock.advance(LEASE_MS + 1)
    second = claim(db, owner="server-b")
    with db.write() as tx:
        found = calls.reserve_effect(
            tx, second.claim, key="write:1", kind="file.write", request=request, lease_ms=LEASE_MS
        )
        assert not isinstance(found, Conflict)
        assert found.status is EffectStatus.AMBIGUOUS  # never pending: it may have happened
        begun = calls.begin_effect(tx, second.claim, effect_id, lease_ms=LEASE_MS)
        assert not isinstance(begun, Conflict)
        assert begun.attempt == 2
        settled_state = calls.settle_effect(
            tx,
            second.claim,
            effect_id,
            attempt=2,
            outcome="applied",
            result={"seen": True},
            lease_ms=LEASE_MS,
        )
        assert not isinstance(settled_state, Conflict)
        assert settled_state.status is EffectStatus.APPLIED
        attempts = fx.list_attempts(tx, effect_id)
    assert [a.outcome.value if a.outcome else None for a in attempts] == [
        "interrupted",
        "applied",
    ]
    assert [a.lease_generation for a in attempts] == [1, 2]
    # A later reserve adopts the stored outcome; nothing runs again.
    with db.write() as tx:
        adopted = calls.reserve_effect(
            tx, second.claim, key="write:1", kind="file.write", request=request, lease_ms=LEASE_MS
        )
        assert not isinstance(adopted, Conflict)
        assert (adopted.status, adopted.result) == (EffectStatus.APPLIED, {"seen": True})
        indeterminate = calls.reserve_effect(
            tx, second.claim, key="write:2", kind="file.write", request=request, lease_ms=LEASE_MS
        )
        assert not isinstance(indeterminate, Conflict)
        calls.begin_effect(tx, second.claim, indeterminate.effect_id, lease_ms=LEASE_MS)
        ambiguous = calls.settle_effect(
            tx,
            second.claim,
            indeterminate.effect_id,
            attempt=1,
            outcome="indeterminate",
            error="timeout",
            lease_ms=LEASE_MS,
        )
        assert not isinstance(ambiguous, Conflict)
        assert ambiguous.status is EffectStatus.AMBIGUOUS
    with db.read() as tx:
        assert find_violations(tx) == []


def test_a_failure_turns_applying_effects_ambiguous(db: StateDatabase) -> None:
    apply(db, {"name": "ada"})
    launch = claim(db)
    with db.write() as tx:
        state = calls.reserve_effect(
            tx, launch.claim, key="k", kind="file.write", request=1, lease_ms=LEASE_MS
        )
        assert not isinstance(state, Conflict)
        calls.begin_effect(tx, launch.claim, state.effect_id, lease_ms=LEASE_MS)
        rc.fail_reconcile(tx, launch.claim, rid(launch), "crashed", lease_ms=LEASE_MS)
        effect = fx.get_effect(tx, state.effect_id)
    assert effect is not None
    assert effect.status is EffectStatus.AMBIGUOUS


def new_run() -> run_store.NewRun:
    snapshot = {"name": "child"}
    return run_store.NewRun(
        workflow_ref="child",
        workflow_name="child",
        definition_digest=canonical.digest(snapshot),
        definition_snapshot=snapshot,
        input={"who": "ada"},
        sources=[
            run_store.SourceFile(
                "", SourceType.FILE, "/child.py", "b" * 64, ReferenceKind.PATH, "/child.py"
            )
        ],
    )


def test_child_runs_are_found_by_key_and_their_end_enqueues_the_parent(
    db: StateDatabase,
) -> None:
    apply(db, {"name": "ada"})
    launch = claim(db)
    fingerprint = canonical.digest({"workflow": "child", "input": {"who": "ada"}})
    with db.write() as tx:
        assert (
            calls.find_child_run(
                tx,
                launch.claim,
                uid=launch.uid,
                request_key="render:1",
                fingerprint=fingerprint,
                lease_ms=LEASE_MS,
            )
            is None
        )
        created = calls.create_child_run(
            tx,
            launch.claim,
            uid=launch.uid,
            request_key="render:1",
            workflow_ref="child",
            fingerprint=fingerprint,
            new_run=new_run(),
            lease_ms=LEASE_MS,
        )
        assert not isinstance(created, Conflict)
        assert created.state == "pending"
        again = calls.find_child_run(
            tx,
            launch.claim,
            uid=launch.uid,
            request_key="render:1",
            fingerprint=fingerprint,
            lease_ms=LEASE_MS,
        )
        assert again is not None
        assert not isinstance(again, Conflict)
        assert again.run_id == created.run_id
        other = calls.find_child_run(
            tx,
            launch.claim,
            uid=launch.uid,
            request_key="render:1",
            fingerprint=canonical.digest({"workflow": "child", "input": {"who": "bob"}}),
            lease_ms=LEASE_MS,
        )
        assert isinstance(other, Conflict)
        rc.finish_reconcile(tx, launch.claim, rid(launch), settled(), lease_ms=LEASE_MS)
    assert view(db).queue is None
    with db.write() as tx:
        assert calls.notify_finished_children(tx) == []  # still running
        tx.execute(
            "UPDATE runs SET status = 'completed', finished_at = 1 WHERE run_id = ?",
            (created.run_id,),
        )
        tx.execute(
            "UPDATE run_queue SET status = 'done', finished_at = 1 WHERE run_id = ?",
            (created.run_id,),
        )
        assert calls.notify_finished_children(tx) == [launch.uid]
        assert calls.notify_finished_children(tx) == []  # once per child
        assert run_store.load_run(tx, created.run_id).status is RunStatus.COMPLETED  # type: ignore[union-attr]
    queue = view(db).queue
    assert queue is not None
    assert queue.reason is ResourceQueueReason.CHILD_FINISHED


def test_recovery_of_an_orphaned_reconcile_fences_it_and_requeues_at_once(
    db: StateDatabase, clock: FakeClock
) -> None:
    apply(db, {"name": "ada"})
    launch = claim(db)
    with db.write() as tx:
        state = calls.reserve_effect(
            tx, launch.claim, key="k", kind="file.write", request=1, lease_ms=LEASE_MS
        )
        assert not isinstance(state, Conflict)
        calls.begin_effect(tx, launch.claim, state.effect_id, lease_ms=LEASE_MS)
        rc.fail_reconcile(tx, launch.claim, rid(launch), "first", lease_ms=LEASE_MS)
    clock.advance(1000)
    launch = claim(db)
    with db.write() as tx:
        tx.execute("UPDATE leases SET expires_at = ?", (tx.now,))  # its server died
        orphans = runners.orphaned_runners(tx, epoch=2)
        assert [r.reconcile_id for r in orphans] == [rid(launch)]
        assert rc.recover_orphaned_reconcile(tx, orphans[0], owner_id="server-b", lease_ms=LEASE_MS)
        runner = runners.get_runner(tx, rid(launch))
    assert runner is not None
    assert runner.status is ResourceRunnerStatus.ORPHANED
    queue = view(db).queue
    assert queue is not None
    assert (queue.reason, queue.consecutive_errors, queue.available_at) == (
        ResourceQueueReason.INTERRUPTED,
        1,
        clock.now_ms(),
    )
    with pytest.raises(ClaimLostError), db.write() as tx:  # the old generation is fenced
        rc.finish_reconcile(tx, launch.claim, rid(launch), settled(), lease_ms=LEASE_MS)


def test_verify_reports_resource_invariants(db: StateDatabase) -> None:
    apply(db, {"name": "ada"})
    launch = claim(db)
    with db.write() as tx:
        tx.execute("DELETE FROM managed_resource_queue")
    with db.read() as tx:
        assert [v.code for v in find_violations(tx)] == ["resourceQueue"]
    with db.write() as tx:
        tx.execute("UPDATE leases SET expires_at = ?", (tx.now,))
        tx.execute("UPDATE managed_resources SET deletion_requested_at = 1")
    with db.read() as tx:
        assert [v.code for v in find_violations(tx)] == ["resourceDeletion"]
    assert launch.uid
