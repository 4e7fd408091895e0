"""Checkpoints and protected decisions at the store: one winner among answers, the timeout
policy, no-default expiry and explicit cancel, with the real engine consuming the winner."""

from __future__ import annotations

import itertools

import pytest

from piwf.clock import FakeClock
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.state import StateDatabase, decisions
from piwf.state import execution as ex
from piwf.state.enums import (
    ResolutionOutcome,
    ResolutionProvenance,
    RunnerStatus,
    SubmissionOutcome,
    SubmissionSource,
)
from piwf.state.records import Actor
from piwf.workflow import checkpoint, compute, define_workflow, human_decision
from piwf.workflow import port as p
from piwf.workflow.compiler import CompiledWorkflow

from .test_execution_support import (
    LEASE_MS,
    OPERATOR,
    SERVER,
    SERVER_ID,
    claim_is_free,
    compiled,
    create,
    dump,
    exit_and_recover,
    queue_row,
    run_once,
    run_status,
    violations,
)

HUMAN = Actor(OPERATOR.actor_type, "person-1")
_SUBMISSIONS = itertools.count(1)


def decision_flow(*, default: bool = True, after_ms: int = 1_000) -> CompiledWorkflow:
    timeout: dict[str, object] = {"after_ms": after_ms}
    if default:
        timeout["response"] = {"choice": "hold"}
    return compiled(
        define_workflow(
            name="approve",
            start_at="approve",
            nodes={
                "approve": human_decision(
                    choices={"ship": "Ship it", "hold": "Hold back"}, on_timeout=timeout
                ),
                "ship": compute(lambda ctx: "shipped"),
                "hold": compute(lambda ctx: "held"),
            },
            edges=[
                {
                    "from": "approve",
                    "switch": {"on": "$output.choice", "cases": {"ship": "ship", "hold": "hold"}},
                },
            ],
        )
    )


def expiring_flow() -> CompiledWorkflow:
    """A decision with a deadline and no default; a timed-out visit routes to ``expired``."""
    return compiled(
        define_workflow(
            name="expiring",
            start_at="approve",
            nodes={
                "approve": human_decision(choices=["ship"], on_timeout={"after_ms": 1_000}),
                "ship": compute(lambda ctx: "shipped"),
                "expired": compute(lambda ctx: "expired"),
            },
            edges=[
                {
                    "from": "approve",
                    "switch": {
                        "on": "$result.outcome",
                        "cases": {"ok": "ship", "timed_out": "expired"},
                    },
                }
            ],
        )
    )


def checkpoint_flow() -> CompiledWorkflow:
    return compiled(
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


def park(db: StateDatabase, workflow: CompiledWorkflow, run_id: str = "run-1") -> str:
    """Create the run and execute it until it waits; return its request id."""
    create(db, workflow, run_id)
    launched, _, result = run_once(db, workflow)
    exit_and_recover(db, launched, RunnerStatus.EXITED)
    assert result.status is p.RunStatus.WAITING, result
    assert result.request_id is not None
    return result.request_id


def answer(
    db: StateDatabase,
    request_id: str,
    response: object,
    *,
    source: SubmissionSource = SubmissionSource.HUMAN,
    submission_id: str | None = None,
) -> Applied[ex.AnswerOutcome] | Adopted[ex.AnswerOutcome] | Conflict | None:
    with db.write() as tx:
        return ex.answer_request(
            tx,
            request_id,
            response,  # type: ignore[arg-type]
            source=source,
            actor=HUMAN,
            submission_id=submission_id or f"sub-{next(_SUBMISSIONS)}",
        )


def expire(db: StateDatabase) -> list[ex.AnswerOutcome]:
    with db.write() as tx:
        return ex.expire_due_decisions(
            tx, actor=SERVER, control_owner_id=SERVER_ID, lease_ms=LEASE_MS
        )


def cancel(db: StateDatabase, run_id: str = "run-1") -> None:
    with db.write() as tx:
        result = ex.cancel_run(
            tx, run_id, actor=OPERATOR, control_owner_id="control", lease_ms=LEASE_MS
        )
    assert isinstance(result, (Applied, Adopted)), result


def audit(db: StateDatabase, run_id: str = "run-1") -> ex.DecisionAudit:
    with db.read() as tx:
        audits = ex.run_decision_audit(tx, run_id)
    assert len(audits) == 1
    return audits[0]


def outcome_of(result: object) -> ex.AnswerOutcome:
    assert isinstance(result, (Applied, Adopted)), result
    value = result.value
    assert isinstance(value, ex.AnswerOutcome)
    return value


def test_a_checkpoint_answer_resumes_the_same_run_with_that_answer(db: StateDatabase) -> None:
    workflow = checkpoint_flow()
    request_id = park(db, workflow)
    with db.read() as tx:
        listed = ex.list_open_requests(tx)
    assert [(r.request_id, r.kind, r.path) for r in listed] == [(request_id, "checkpoint", "gate")]
    won = outcome_of(answer(db, request_id, {"go": 1}, source=SubmissionSource.CLIENT))
    assert won.outcome is SubmissionOutcome.WON
    assert won.resolution is not None
    assert won.resolution.provenance is ResolutionProvenance.CLIENT
    assert (run_status(db, "run-1"), queue_row(db, "run-1")) == ("running", ("parked", None))
    _, _, result = run_once(db, workflow)
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"go": 1})
    with db.read() as tx:
        assert ex.list_open_requests(tx) == []
    assert violations(db) == []


def test_a_second_different_answer_gets_the_winner_and_a_retry_adopts(db: StateDatabase) -> None:
    request_id = park(db, decision_flow())
    first = outcome_of(answer(db, request_id, {"choice": "ship"}, submission_id="a"))
    assert first.outcome is SubmissionOutcome.WON
    again = answer(db, request_id, {"choice": "ship"}, submission_id="a")
    assert isinstance(again, Adopted) and again.value.outcome is SubmissionOutcome.WON
    assert isinstance(answer(db, request_id, {"choice": "hold"}, submission_id="a"), Conflict)
    equal = outcome_of(answer(db, request_id, {"choice": "ship"}))
    assert equal.outcome is SubmissionOutcome.ADOPTED
    other = outcome_of(answer(db, request_id, {"choice": "hold"}))
    assert other.outcome is SubmissionOutcome.ALREADY_RESOLVED
    assert other.resolution == first.resolution
    record = audit(db)
    assert [s.outcome for s in record.submissions] == [
        SubmissionOutcome.WON,
        SubmissionOutcome.ADOPTED,
        SubmissionOutcome.ALREADY_RESOLVED,
    ]
    assert violations(db) == []


def test_a_protected_decision_refuses_non_human_and_invalid_answers(db: StateDatabase) -> None:
    workflow = decision_flow()
    request_id = park(db, workflow)
    for source in (SubmissionSource.CLIENT, SubmissionSource.WORKFLOW):
        refused = outcome_of(answer(db, request_id, {"choice": "ship"}, source=source))
        assert refused.outcome is SubmissionOutcome.REJECTED
        assert refused.resolution is None and refused.reason
    invalid = outcome_of(answer(db, request_id, {"choice": "maybe"}))
    assert invalid.outcome is SubmissionOutcome.REJECTED and "not one of" in (invalid.reason or "")
    assert run_status(db, "run-1") == "waiting"
    assert outcome_of(answer(db, request_id, {"choice": "ship"})).outcome is SubmissionOutcome.WON
    _, _, result = run_once(db, workflow)
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, "shipped")
    assert violations(db) == []


def test_an_agent_request_or_an_unknown_id_is_not_answerable(db: StateDatabase) -> None:
    assert answer(db, "no-such-request", {"choice": "ship"}) is None


def test_the_deadline_records_the_default_and_a_late_answer_gets_it(
    db: StateDatabase, clock: FakeClock
) -> None:
    workflow = decision_flow()
    request_id = park(db, workflow)
    clock.advance(999)
    assert expire(db) == []
    clock.advance(1)
    (settled,) = expire(db)
    assert settled.resolution is not None
    assert settled.resolution.provenance is ResolutionProvenance.TIMEOUT_POLICY
    assert settled.resolution.response == {"choice": "hold"}
    assert claim_is_free(db, "run-1")
    late = outcome_of(answer(db, request_id, {"choice": "ship"}))
    assert late.outcome is SubmissionOutcome.ALREADY_RESOLVED
    assert late.resolution == settled.resolution
    _, _, result = run_once(db, workflow)
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, "held")
    assert expire(db) == []
    assert violations(db) == []


# conformance: S10
def test_a_deadline_without_default_cancels_and_the_run_routes_timed_out(
    db: StateDatabase, clock: FakeClock
) -> None:
    workflow = expiring_flow()
    request_id = park(db, workflow)
    clock.advance(1_000)
    (settled,) = expire(db)
    assert settled.resolution is not None
    assert settled.resolution.outcome is ResolutionOutcome.CANCELLED
    assert settled.resolution.provenance is ResolutionProvenance.EXPIRED_NO_DEFAULT
    _, _, result = run_once(db, workflow)
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, "expired")
    late = outcome_of(answer(db, request_id, {"choice": "ship"}))
    assert late.outcome is SubmissionOutcome.ALREADY_RESOLVED
    assert violations(db) == []


def test_cancel_records_an_explicit_cancel_winner(db: StateDatabase) -> None:
    request_id = park(db, decision_flow())
    cancel(db)
    record = audit(db)
    assert record.resolution is not None
    assert record.resolution.provenance is ResolutionProvenance.EXPLICIT_CANCEL
    late = outcome_of(answer(db, request_id, {"choice": "ship"}))
    assert late.outcome is SubmissionOutcome.ALREADY_RESOLVED
    assert late.resolution == record.resolution
    assert violations(db) == []


def test_pause_and_resume_keep_the_pending_decision(db: StateDatabase) -> None:
    workflow = decision_flow()
    request_id = park(db, workflow)
    with db.write() as tx:
        ex.pause_run(tx, "run-1", actor=OPERATOR, control_owner_id="control", lease_ms=LEASE_MS)
    with db.write() as tx:
        ex.resume_run(tx, "run-1", actor=OPERATOR)
    with db.read() as tx:
        listed = ex.list_open_requests(tx)
    assert [r.request_id for r in listed] == [request_id]
    assert run_status(db, "run-1") == "waiting"
    assert outcome_of(answer(db, request_id, {"choice": "hold"})).outcome is SubmissionOutcome.WON
    _, _, result = run_once(db, workflow)
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, "held")
    assert audit(db).resolution is not None
    assert violations(db) == []


def test_an_answer_while_the_run_is_paused_is_refused_and_nothing_is_written(
    db: StateDatabase,
) -> None:
    request_id = park(db, decision_flow())
    with db.write() as tx:
        ex.pause_run(tx, "run-1", actor=OPERATOR, control_owner_id="control", lease_ms=LEASE_MS)
    before = dump(db)
    refused = answer(db, request_id, {"choice": "ship"})
    assert isinstance(refused, Conflict)
    assert "paused" in refused.evidence
    assert dump(db) == before
    with db.read() as tx:
        assert ex.paused_run_of_request(tx, request_id) == "run-1"
    with db.write() as tx:
        ex.resume_run(tx, "run-1", actor=OPERATOR)
    with db.read() as tx:
        assert ex.paused_run_of_request(tx, request_id) is None
    assert outcome_of(answer(db, request_id, {"choice": "ship"})).outcome is SubmissionOutcome.WON


def test_a_decision_deadline_is_scheduled_work_until_it_is_settled(
    db: StateDatabase, clock: FakeClock
) -> None:
    with db.read() as tx:
        assert not ex.has_scheduled_work(tx)
    park(db, decision_flow())
    with db.read() as tx:
        assert ex.has_scheduled_work(tx), "the deadline must keep an idle server up"
    clock.advance(1_000)
    expire(db)
    cancel(db)
    with db.read() as tx:
        assert not ex.has_scheduled_work(tx)


def test_a_checkpoint_without_deadline_is_not_scheduled_work(db: StateDatabase) -> None:
    park(db, checkpoint_flow())
    with db.read() as tx:
        assert not ex.has_scheduled_work(tx)


ORDERS = list(itertools.permutations(("answer", "expire", "cancel")))


# conformance: S10
@pytest.mark.parametrize("iteration", range(20))
def test_answer_timeout_and_cancel_race_to_exactly_one_winner(
    db: StateDatabase, clock: FakeClock, iteration: int
) -> None:
    """Each order of the three competitors leaves one winner and a consistent run."""
    order = ORDERS[iteration % len(ORDERS)]
    run_id = f"run-{iteration}"
    request_id = park(db, decision_flow(), run_id)
    clock.advance(1_000)  # the deadline has passed: the policy competes from now on
    answers: list[ex.AnswerOutcome] = []
    for step in order[: 2 + iteration % 2]:
        if step == "answer":
            answers.append(outcome_of(answer(db, request_id, {"choice": "ship"})))
        elif step == "expire":
            expire(db)
        else:
            cancel(db, run_id)
    record = audit(db, run_id)
    assert record.resolution is not None
    won = [s for s in record.submissions if s.outcome is SubmissionOutcome.WON]
    assert len(won) == 1
    first = next(step for step in order if step in order[: 2 + iteration % 2])
    expected = {
        "answer": ResolutionProvenance.HUMAN,
        "expire": ResolutionProvenance.TIMEOUT_POLICY,
        "cancel": ResolutionProvenance.EXPLICIT_CANCEL,
    }[first]
    assert record.resolution.provenance is expected
    for seen in answers:
        assert seen.resolution == record.resolution
    status = run_status(db, run_id)
    if "cancel" in order[: 2 + iteration % 2]:
        assert status == "cancelled"
    else:
        assert (status, queue_row(db, run_id)) == ("running", ("parked", None))
    assert violations(db) == []


def test_the_audit_of_a_long_loop_reads_its_newest_decisions_and_counts_them_all(
    db: StateDatabase, clock: FakeClock
) -> None:
    """A checkpoint asked again on every visit: the bounded audit (what ``run.get`` shows)
    holds the newest ones, oldest first, the pending one last; the count holds them all."""
    workflow = compiled(
        define_workflow(
            name="asks",
            start_at="ask",
            nodes={"ask": checkpoint(summary="again?"), "done": compute(lambda ctx: 1)},
            edges=[
                {
                    "from": "ask",
                    "switch": {"on": "$output.again", "cases": {"true": "ask", "false": "done"}},
                }
            ],
        )
    )
    asked = [park(db, workflow)]
    for _ in range(4):
        clock.advance(1)
        outcome_of(answer(db, asked[-1], {"again": True}, source=SubmissionSource.CLIENT))
        launched, _, result = run_once(db, workflow)
        exit_and_recover(db, launched, RunnerStatus.EXITED)
        assert result.request_id is not None and result.request_id not in asked
        asked.append(result.request_id)
    with db.read() as tx:
        newest = ex.run_decision_audit(tx, "run-1", 3)
        everything = ex.run_decision_audit(tx, "run-1")
        count = decisions.count_run_decisions(tx, "run-1")
    assert [a.decision.decision_id for a in newest] == asked[-3:]
    assert [a.decision.decision_id for a in everything] == asked
    assert newest[-1].resolution is None and all(a.resolution for a in newest[:-1])
    assert count == 5
