"""A runner call is applied only under the claim of the runner that sent it.

``decode_runner_call`` + ``apply_runner_call`` are what the server runs for every runner call
(and what :class:`StorePort` runs in the engine tests); these tests hold them to the fencing
rule with two live runs in one database.
"""

from __future__ import annotations

import pytest

from piwf.lifecycle import Conflict
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.enums import RunnerMessageOutcome
from piwf.workflow import port as p
from piwf.workflow.port_codec import to_json
from tests.state.test_execution_support import (
    LEASE_MS,
    create,
    dump,
    launch,
    runner_of,
    two_step,
    violations,
)


def _node_started(run_id: str) -> p.NodeStarted:
    return p.NodeStarted(
        run_id=run_id,
        path="greet",
        visit=1,
        attempt=1,
        kind="compute",
        started_at_ms=1,
        timeout_ms=None,
        deadline_ms=None,
    )


@pytest.fixture
def two_live_runs(db: StateDatabase) -> tuple[ex.RunLaunch, ex.RunLaunch]:
    workflow = two_step()
    create(db, workflow, "run-a")
    create(db, workflow, "run-b")
    first, second = launch(db), launch(db)
    assert {first.run_id, second.run_id} == {"run-a", "run-b"}
    return first, second


def test_a_call_naming_another_live_run_is_rejected_before_anything_is_read(
    db: StateDatabase, two_live_runs: tuple[ex.RunLaunch, ex.RunLaunch]
) -> None:
    mine, other = two_live_runs
    before = dump(db)
    with pytest.raises(ex.RunnerCallRejectedError, match="names another run") as refused:
        ex.decode_runner_call(mine.claim, "node_started", to_json(_node_started(other.run_id)))
    assert refused.value.code == "protocolRejected"
    assert dump(db) == before


@pytest.mark.parametrize(
    ("operation", "payload"),
    [
        ("drop_tables", {"run_id": "run-a"}),
        (None, {}),
        ("node_started", {"run_id": "run-a"}),
        ("node_started", {**to_json(_node_started("run-a")), "extra": 1}),  # type: ignore[dict-item]
        ("node_started", {**to_json(_node_started("run-a")), "visit": "one"}),  # type: ignore[dict-item]
        ("node_started", ["not", "an", "object"]),
    ],
)
def test_a_call_of_the_wrong_shape_is_rejected(
    db: StateDatabase,
    two_live_runs: tuple[ex.RunLaunch, ex.RunLaunch],
    operation: str | None,
    payload: object,
) -> None:
    mine = next(launched for launched in two_live_runs if launched.run_id == "run-a")
    with pytest.raises(ex.RunnerCallRejectedError):
        ex.decode_runner_call(mine.claim, operation, payload)  # type: ignore[arg-type]


def test_a_call_applies_under_the_senders_claim_only(
    db: StateDatabase, two_live_runs: tuple[ex.RunLaunch, ex.RunLaunch]
) -> None:
    mine, other = two_live_runs
    call = ex.decode_runner_call(mine.claim, "node_started", to_json(_node_started(mine.run_id)))
    with db.write() as tx:
        reply = ex.apply_runner_call(
            tx,
            mine.claim,
            runner_of(db, mine).runner_epoch,
            "m1",
            call,
            expected_revision=None,
            lease_ms=LEASE_MS,
        )
    assert reply.outcome is RunnerMessageOutcome.ACCEPTED
    with db.read() as tx:
        attempts = tx.all("SELECT run_id FROM node_attempts")
    assert [row[0] for row in attempts] == [mine.run_id]
    # The other runner's epoch with this claim is not this runner: claim lost, nothing applied.
    with db.write() as tx:
        crossed = ex.apply_runner_call(
            tx,
            mine.claim,
            runner_of(db, other).runner_epoch,
            "m2",
            call,
            expected_revision=None,
            lease_ms=LEASE_MS,
        )
    assert crossed.outcome is RunnerMessageOutcome.CLAIM_LOST
    assert violations(db) == []


def test_a_call_against_another_revision_is_a_conflict_and_changes_nothing(
    db: StateDatabase, two_live_runs: tuple[ex.RunLaunch, ex.RunLaunch]
) -> None:
    mine, _ = two_live_runs
    call = ex.decode_runner_call(mine.claim, "node_started", to_json(_node_started(mine.run_id)))
    before = dump(db)
    with db.write() as tx:
        reply = ex.apply_runner_call(
            tx,
            mine.claim,
            runner_of(db, mine).runner_epoch,
            "m1",
            call,
            expected_revision=1,
            lease_ms=LEASE_MS,
        )
    assert reply.outcome is RunnerMessageOutcome.REJECTED
    assert isinstance(reply.result, Conflict)
    after = dump(db)
    # Only the stored receipt (and its result blob) and the renewed lease differ.
    changed = {table for table in before if before[table] != after[table]}
    assert changed <= {"runner_messages", "blobs", "leases"}
