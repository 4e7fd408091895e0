"""The port messages applied by the execution store, one call at a time: what only it has.

The typed result of every message is tested through the runner's path on this store and on the
memory port alike (``tests/contract/test_port_results.py``). Here: rows only the store keeps
(attempt statuses, update sequence numbers, queue rows), an agent request that waits until it
is answered (its submissions: ``tests/state/test_submissions.py``), and claims: every
``apply_*`` function renews the exact live claim first; a stale claim raises
:class:`ClaimLostError` and leaves every table byte-for-byte as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from piwf.clock import FakeClock
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, CommandKind, Conflict, EffectStatus
from piwf.state import StateDatabase, blobs
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.leases import Claim
from piwf.workflow import identity
from piwf.workflow import port as p
from piwf.workflow.context import Outcome
from piwf.workflow.nodes import NotifyKind, Recovery

from .test_execution_support import (
    LEASE_MS,
    attempts,
    claim_is_free,
    create,
    dump,
    launch,
    queue_row,
    revision,
    run_status,
    takeover,
    two_step,
    violations,
)

RUN = "run-1"


def apply(
    db: StateDatabase, function: Callable[..., p.PortResult], claim: Claim, message: Any
) -> p.PortResult:
    with db.write() as tx:
        return function(tx, claim, message, lease_ms=LEASE_MS)


def started(
    kind: str = "action", path: str = "work", visit: int = 1, attempt: int = 1
) -> p.NodeStarted:
    return p.NodeStarted(RUN, path, visit, attempt, kind, 1_000, None, None)


def reservation(
    request: Any,
    *,
    visit: int = 1,
    key_type: str = "svc.apply",
    recovery: Recovery = Recovery.IDEMPOTENT,
) -> p.EffectReservation:
    return p.EffectReservation(
        run_id=RUN,
        path="work",
        visit=visit,
        effect_key=identity.effect_key(RUN, key_type, "work", visit),
        effect_type=key_type,
        recovery=recovery,
        request=request,
        request_fingerprint=identity.request_fingerprint(request),
    )


@pytest.fixture
def running(db: StateDatabase) -> ex.RunLaunch:
    """A claimed, ready run (revision after ready) with nothing executed yet."""
    workflow = two_step()
    create(db, workflow, RUN, {"who": "ada"})
    return launch(db)


def begun(db: StateDatabase, launched: ex.RunLaunch) -> None:
    digest = two_step().digest
    apply(db, ex.apply_begin_run, launched.claim, p.RunBegun(RUN, p.CommandKind.START, digest, "t"))


def answer(db: StateDatabase, value: Any = "yes") -> None:
    """Write an answer the way the later decision feature will (not part of this store)."""
    with db.write() as tx:
        tx.execute(
            "UPDATE interactive_requests SET status = 'answered', answer_hash = ?,"
            " answered_by = 'human' WHERE run_id = ? AND status = 'pending'",
            (blobs.put_json(tx, value), RUN),
        )


# Visits ------------------------------------------------------------------------------------


def test_a_fresh_claimed_run_reads_queued_so_start_fits(
    db: StateDatabase, running: ex.RunLaunch
) -> None:
    assert running.command is CommandKind.START
    with db.read() as tx:
        saved = ex.read_saved_run(tx, RUN)
        assert ex.read_saved_run(tx, "missing") is None
    assert saved is not None
    assert saved.fresh and saved.input == {"who": "ada"}
    assert saved.lineage is p.Lineage.ROOT and saved.definition_digest == two_step().digest


def test_a_retry_attempt_closes_the_one_before_it_as_interrupted(
    db: StateDatabase, running: ex.RunLaunch
) -> None:
    claim = running.claim
    assert isinstance(apply(db, ex.apply_node_started, claim, started()), p.Applied)
    assert isinstance(apply(db, ex.apply_node_started, claim, started(attempt=2)), p.Applied)
    assert attempts(db, RUN) == [("work", 1, 1, "interrupted"), ("work", 1, 2, "running")]


def test_updates_keep_the_latest_record_per_key(db: StateDatabase, running: ex.RunLaunch) -> None:
    claim = running.claim
    apply(db, ex.apply_node_started, claim, started())
    for data in ({"pct": 10}, {"pct": 50}, {"pct": 50}):
        apply(
            db,
            ex.apply_publish_update,
            claim,
            p.UpdatePublished(RUN, "work", 1, "progress", "build", data),
        )
    apply(
        db,
        ex.apply_publish_update,
        claim,
        p.UpdatePublished(RUN, "work", 1, "progress", "test", {"pct": 1}),
    )
    wrong = p.UpdatePublished(RUN, "work", 2, "progress", "build", {})
    assert isinstance(apply(db, ex.apply_publish_update, claim, wrong), Conflict)
    with db.read() as tx:
        rows = tx.all(
            "SELECT update_key, update_seq, data_hash FROM workflow_updates ORDER BY update_seq"
        )
        latest = [(row[0], row[1], blobs.read_json(tx, bytes(row[2]))) for row in rows]
    assert latest == [("build", 2, {"pct": 50}), ("test", 3, {"pct": 1})]


def test_an_agent_request_keeps_its_visit_waiting_until_it_is_answered(
    db: StateDatabase, running: ex.RunLaunch
) -> None:
    claim = running.claim
    apply(db, ex.apply_node_started, claim, started("agent"))
    request_id = identity.request_id(RUN, "work", 1)
    request = p.InteractionRequested(
        RUN, "work", 1, request_id, p.InteractionKind.AGENT, {"prompt": "p"}, None, 60_000
    )
    assert isinstance(apply(db, ex.apply_request_interaction, claim, request), Applied)
    assert isinstance(apply(db, ex.apply_request_interaction, claim, request), Adopted)
    assert attempts(db, RUN) == [("work", 1, 1, "waiting")]
    assert isinstance(
        apply(db, ex.apply_node_started, claim, started("agent", attempt=2)), Conflict
    )
    with db.read() as tx:
        saved = ex.read_saved_run(tx, RUN)
    assert saved is not None and saved.pending is not None
    assert (saved.pending.request_id, saved.pending.answered, saved.pending.answer) == (
        request_id,
        False,
        None,
    )
    finished = p.NodeFinished(RUN, "work", 1, 1, {"value": 1}, 2_000, request_id)
    assert isinstance(apply(db, ex.apply_node_finished, claim, finished), Conflict)
    answer(db, {"value": 1})
    without_request = p.NodeFinished(RUN, "work", 1, 1, {"value": 1}, 2_000)
    assert isinstance(apply(db, ex.apply_node_finished, claim, without_request), Conflict)
    assert isinstance(apply(db, ex.apply_node_finished, claim, finished), Applied)
    with db.read() as tx:
        assert tx.scalar("SELECT status FROM interactive_requests") == "settled"


def test_park_waiting_on_an_answered_request_leaves_the_run_claimable(
    db: StateDatabase, running: ex.RunLaunch
) -> None:
    claim = running.claim
    apply(db, ex.apply_node_started, claim, started("checkpoint"))
    request_id = identity.request_id(RUN, "work", 1)
    request = p.InteractionRequested(RUN, "work", 1, request_id, p.InteractionKind.CHECKPOINT, {})
    apply(db, ex.apply_request_interaction, claim, request)
    answer(db)
    parked = p.RunParked(RUN, p.ParkReason.WAITING, "work", 1, request_id)
    assert isinstance(apply(db, ex.apply_park, claim, parked), Applied)
    assert (run_status(db, RUN), queue_row(db, RUN)) == ("running", ("parked", None))
    assert claim_is_free(db, RUN)
    with db.write() as tx:
        again = ex.claim_next_run(tx, owner_id="server-a", lease_ms=LEASE_MS)
    assert again is not None and again.command is CommandKind.RESUME


def test_finish_closes_the_queue_and_attempt_and_ends_the_claim(
    db: StateDatabase, running: ex.RunLaunch
) -> None:
    claim = running.claim
    apply(db, ex.apply_node_started, claim, started())
    failed = p.RunFinished(RUN, p.RunStatus.FAILED, None, "boom", "work")
    assert isinstance(apply(db, ex.apply_finish, claim, failed), Applied)
    assert (run_status(db, RUN), queue_row(db, RUN)) == ("failed", ("failed", "nodeFailed"))
    assert attempts(db, RUN) == [("work", 1, 1, "failed")]
    assert claim_is_free(db, RUN)
    # The claim ended with the run: the runner that finished it can propose nothing more.
    with pytest.raises(ClaimLostError):
        apply(db, ex.apply_finish, claim, failed)
    assert violations(db) == []


# Effects -------------------------------------------------------------------------------------


def test_a_new_generation_retries_an_idempotent_effect_left_applying(
    db: StateDatabase, running: ex.RunLaunch, clock: FakeClock
) -> None:
    apply(db, ex.apply_node_started, running.claim, started())
    apply(db, ex.apply_reserve_effect, running.claim, reservation({"a": 1}))
    clock.advance(LEASE_MS + 1)
    claim = takeover(db, RUN)
    assert isinstance(apply(db, ex.apply_node_started, claim, started(attempt=2)), Applied)
    result = apply(db, ex.apply_reserve_effect, claim, reservation({"a": 1}))
    assert result == Adopted(p.Committed(revision(db, RUN)))
    with db.read() as tx:
        (effect,) = fx.list_effects(tx, f"run:{RUN}")
        generations = [
            (a.attempt_number, a.lease_generation) for a in fx.list_attempts(tx, effect.effect_id)
        ]
    assert (effect.status, effect.attempt_count) == (EffectStatus.APPLYING, 2)
    assert generations == [(1, running.generation), (2, claim.generation)]
    assert violations(db) == []


# Stale claims --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    function: Callable[..., p.PortResult]
    message: Any
    answered: bool = False


REQUEST_ID = identity.request_id(RUN, "work", 1)
EFFECT_KEY = identity.effect_key(RUN, "svc.apply", "work", 1)

CASES = {
    "begin_run": Case(
        ex.apply_begin_run, p.RunBegun(RUN, p.CommandKind.RESUME, two_step().digest, "new title")
    ),
    "node_started": Case(ex.apply_node_started, started(attempt=2)),
    "node_finished": Case(ex.apply_node_finished, p.NodeFinished(RUN, "work", 1, 1, {"x": 1}, 9)),
    "node_failed": Case(
        ex.apply_node_failed, p.NodeFailed(RUN, "work", 1, 1, Outcome.FAILED, "e", 9)
    ),
    "reserve_effect": Case(ex.apply_reserve_effect, reservation({"a": 1}, key_type="svc.new")),
    "settle_effect": Case(
        ex.apply_settle_effect, p.EffectSettlement(RUN, EFFECT_KEY, p.EffectOutcome.APPLIED, 1)
    ),
    "publish_update": Case(ex.apply_publish_update, p.UpdatePublished(RUN, "work", 1, "t", "k", 1)),
    "notify": Case(
        ex.apply_notify, p.NotificationRequested(RUN, "work", 1, "n-1", NotifyKind.PROGRESS, "hi")
    ),
    "request_interaction": Case(
        ex.apply_request_interaction,
        p.InteractionRequested(RUN, "work", 1, REQUEST_ID, p.InteractionKind.CHECKPOINT, {}),
    ),
    "park": Case(
        ex.apply_park, p.RunParked(RUN, p.ParkReason.WAITING, "work", 1, REQUEST_ID), answered=True
    ),
    "finish": Case(ex.apply_finish, p.RunFinished(RUN, p.RunStatus.FAILED, None, "boom", "work")),
}


# conformance: X1
# conformance: X13
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_stale_claim_is_refused_by_every_message_and_writes_nothing(
    db: StateDatabase, running: ex.RunLaunch, clock: FakeClock, name: str
) -> None:
    case = CASES[name]
    begun(db, running)
    apply(db, ex.apply_node_started, running.claim, started())
    if case.answered:
        request = p.InteractionRequested(
            RUN, "work", 1, REQUEST_ID, p.InteractionKind.CHECKPOINT, {}
        )
        apply(db, ex.apply_request_interaction, running.claim, request)
        answer(db)
    else:
        apply(db, ex.apply_reserve_effect, running.claim, reservation({"a": 1}))
    if name == "begin_run":  # a resolved title is written only into a run without one
        with db.write() as tx:
            tx.execute("UPDATE runs SET title = NULL WHERE run_id = ?", (RUN,))
    clock.advance(LEASE_MS + 1)
    newer = takeover(db, RUN)
    before = dump(db)
    with pytest.raises(ClaimLostError) as raised:
        apply(db, case.function, running.claim, case.message)
    assert raised.value.reason == "generationChanged"
    assert dump(db) == before
    # The same message is valid for the current owner: the refusal was about authority only.
    assert isinstance(apply(db, case.function, newer, case.message), Applied)


def test_an_expired_claim_cannot_renew_itself(
    db: StateDatabase, running: ex.RunLaunch, clock: FakeClock
) -> None:
    clock.advance(LEASE_MS)
    before = dump(db)
    with pytest.raises(ClaimLostError) as raised:
        apply(db, ex.apply_node_started, running.claim, started())
    assert raised.value.reason == "expired"
    assert dump(db) == before


def test_a_claim_on_another_run_is_no_authority(db: StateDatabase, running: ex.RunLaunch) -> None:
    create(db, two_step(), "run-2", {"who": "bob"})
    other = launch(db)
    before = dump(db)
    with pytest.raises(ClaimLostError) as raised:
        apply(db, ex.apply_node_started, other.claim, started())
    assert raised.value.reason == "missingAuthority"
    assert dump(db) == before
