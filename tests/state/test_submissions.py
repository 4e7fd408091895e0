"""Agent submissions at the store: candidates, their validation fence, and what settles them.

The validation itself runs in a child (``tests/server/test_submissions.py``); here the store is
driven with what such a child reports, and the real engine consumes an accepted value.
"""

from __future__ import annotations

from typing import Any

import pytest

from piwf.clock import FakeClock
from piwf.errors import (
    NotAgentRequestError,
    RequestNotOpenError,
    RequestRunMismatchError,
    RunPausedError,
    SubmissionKeyConflictError,
    ValidationPendingError,
)
from piwf.lifecycle import AnsweredBy, Conflict
from piwf.state import StateDatabase, blobs
from piwf.state import execution as ex
from piwf.state import retention as rt
from piwf.state.enums import AgentSubmissionOutcome, InteractionStatus, RunnerStatus
from piwf.state.execution import requests
from piwf.state.execution import submissions as sub
from piwf.workflow import agent, checkpoint, compute, define_workflow
from piwf.workflow import port as p
from piwf.workflow.compiler import CompiledWorkflow

from .test_decisions import park
from .test_execution_support import (
    LEASE_MS,
    OPERATOR,
    SERVER,
    SERVER_ID,
    compiled,
    dump,
    exit_and_recover,
    queue_row,
    revision,
    run_once,
    run_status,
    violations,
)


def agent_flow() -> CompiledWorkflow:
    return compiled(
        define_workflow(
            name="ask",
            start_at="ask",
            nodes={
                "ask": agent(prompt="Count", expected_output='{"n": int}'),
                "done": compute(lambda ctx: {"got": ctx.outputs["ask"]}),
            },
            edges=[{"from": "ask", "to": "done"}],
        )
    )


def submit(db: StateDatabase, request_id: str, output: Any, key: str, **kw: Any) -> Any:
    with db.write() as tx:
        return sub.submit(tx, request_id, output, idempotency_key=key, **kw)


def begin(db: StateDatabase, submission_id: str, validation_id: str) -> Any:
    with db.write() as tx:
        return sub.begin_validation(tx, submission_id, validation_id)


def accept(db: StateDatabase, submission_id: str, validation_id: str, value: Any) -> Any:
    with db.write() as tx:
        return sub.settle_accepted(tx, submission_id, validation_id, value, actor=SERVER)


def reject(db: StateDatabase, submission_id: str, validation_id: str, error: str) -> Any:
    with db.write() as tx:
        return sub.settle_rejected(tx, submission_id, validation_id, error)


def request_row(db: StateDatabase, request_id: str) -> requests.RequestRow:
    with db.read() as tx:
        row = requests.get_request(tx, request_id)
    assert row is not None
    return row


def text(db: StateDatabase, digest: bytes | None) -> str | None:
    if digest is None:
        return None
    with db.read() as tx:
        return blobs.read_text(tx, digest)


def created(found: Any) -> sub.SubmissionRow:
    assert isinstance(found, sub.SubmissionFound) and found.created, found
    return found.submission


# conformance: I3
def test_a_rejection_keeps_the_request_pending_and_an_acceptance_resumes_the_run(
    db: StateDatabase,
) -> None:
    workflow = agent_flow()
    request_id = park(db, workflow)
    first = created(submit(db, request_id, {"n": "x"}, "k1"))
    assert (first.outcome, first.validation_id) == (AgentSubmissionOutcome.VALIDATING, None)
    before = revision(db, "run-1")
    start = begin(db, first.submission_id, "val-1")
    assert isinstance(start, sub.ValidationStart)
    assert start.submission.validation_id == "val-1"
    assert start.candidate == {"n": "x"}
    assert start.saved is not None and start.saved.pending is not None
    assert start.saved.pending.request_id == request_id
    rejected = reject(db, first.submission_id, "val-1", "n must be a number")
    assert rejected.outcome is AgentSubmissionOutcome.REJECTED
    row = request_row(db, request_id)
    assert row.status is InteractionStatus.PENDING
    assert text(db, row.rejection_hash) == "n must be a number"
    assert run_status(db, "run-1") == "waiting"
    assert revision(db, "run-1") == before  # nothing of the run changed

    second = created(submit(db, request_id, {"n": "3"}, "k2"))
    begin(db, second.submission_id, "val-2")
    settled = accept(db, second.submission_id, "val-2", {"n": 3})
    assert settled.outcome is AgentSubmissionOutcome.ACCEPTED
    row = request_row(db, request_id)
    assert (row.status, row.answered_by) == (InteractionStatus.ANSWERED, AnsweredBy.CLIENT)
    assert run_status(db, "run-1") == "running"
    assert queue_row(db, "run-1") == ("parked", None)
    assert revision(db, "run-1") == before + 1  # one run change made it eligible
    _, _, result = run_once(db, workflow)
    assert (result.status, result.output) == (p.RunStatus.COMPLETED, {"got": {"n": 3}})
    with db.read() as tx:
        receipt = sub.stored_receipt(tx, settled)
        listed = [(s.idempotency_key, s.outcome.value) for s in sub.run_submissions(tx, "run-1")]
    assert receipt is not None
    assert (receipt["outcome"], receipt["requestId"]) == ("accepted", request_id)
    assert listed == [("k1", "rejected"), ("k2", "accepted")]
    assert violations(db) == []


# conformance: X6
def test_repeats_adopt_and_a_different_output_waits_for_the_one_being_validated(
    db: StateDatabase,
) -> None:
    request_id = park(db, agent_flow())
    first = created(submit(db, request_id, {"n": 1}, "k1"))
    again = submit(db, request_id, {"n": 1}, "k1")
    other_key = submit(db, request_id, {"n": 1}, "k2")
    for found in (again, other_key):
        assert isinstance(found, sub.SubmissionFound) and not found.created
        assert found.submission.submission_id == first.submission_id
    before = dump(db)
    refusals = [
        submit(db, request_id, {"n": 2}, "k1"),
        submit(db, request_id, {"n": 2}, "k3"),
    ]
    assert [type(r.error) for r in refusals] == [SubmissionKeyConflictError, ValidationPendingError]
    assert "wait for its outcome" in str(refusals[1].error)
    assert dump(db) == before
    begin(db, first.submission_id, "val-1")
    accepted = accept(db, first.submission_id, "val-1", {"n": 1})
    # After acceptance: the same output under any key adopts it; another output is refused.
    late = submit(db, request_id, {"n": 1}, "k9")
    assert isinstance(late, sub.SubmissionFound) and late.submission == accepted
    refused = submit(db, request_id, {"n": 5}, "k10")
    assert isinstance(refused, sub.SubmitRefused)
    assert isinstance(refused.error, RequestNotOpenError)
    assert "already completed" in str(refused.error)


def test_a_reply_of_another_validation_settles_nothing(db: StateDatabase) -> None:
    request_id = park(db, agent_flow())
    first = created(submit(db, request_id, {"n": 1}, "k1"))
    begin(db, first.submission_id, "val-old")
    begin(db, first.submission_id, "val-new")  # recovery gave it to a new child
    before = dump(db)
    assert isinstance(accept(db, first.submission_id, "val-old", {"n": 1}), Conflict)
    assert isinstance(reject(db, first.submission_id, "val-old", "late"), Conflict)
    assert dump(db) == before
    settled = accept(db, first.submission_id, "val-new", {"n": 1})
    assert settled.outcome is AgentSubmissionOutcome.ACCEPTED
    assert isinstance(accept(db, first.submission_id, "val-new", {"n": 1}), Conflict)


def test_a_dead_child_rejects_its_candidate_and_a_retry_is_a_new_candidate(
    db: StateDatabase,
) -> None:
    request_id = park(db, agent_flow())
    first = created(submit(db, request_id, {"n": 1}, "k1"))
    begin(db, first.submission_id, "val-1")
    with db.read() as tx:
        assert [s.submission_id for s in sub.validating_left_by_crash(tx)] == [first.submission_id]
    with db.write() as tx:
        rejected = sub.reject_validation_of(tx, "val-1", "validation stopped; submit again")
    assert [(s.submission_id, s.outcome.value) for s in rejected] == [
        (first.submission_id, "rejected")
    ]
    with db.read() as tx:
        assert sub.validating_left_by_crash(tx) == []
    # The same output again, under a new key, is a new candidate (the first never finished).
    retry = created(submit(db, request_id, {"n": 1}, "k2"))
    assert retry.submission_id != first.submission_id
    # The first key still answers with its stored rejection.
    found = submit(db, request_id, {"n": 1}, "k1")
    assert found.submission.outcome is AgentSubmissionOutcome.REJECTED


def test_refusals_name_what_to_do_and_write_nothing(db: StateDatabase) -> None:
    request_id = park(db, agent_flow())
    gate = park(
        db,
        compiled(
            define_workflow(
                name="gate",
                start_at="gate",
                nodes={"gate": checkpoint(summary="ok?")},
                edges=[],
            )
        ),
        "run-2",
    )
    before = dump(db)
    assert submit(db, "request-nope", {}, "k") is None
    wrong_kind = submit(db, gate, {}, "k")
    assert isinstance(wrong_kind.error, NotAgentRequestError)
    assert f"piwf answer {gate}" in str(wrong_kind.error)
    mismatch = submit(db, request_id, {}, "k", run_id="run-2")
    assert isinstance(mismatch.error, RequestRunMismatchError)
    assert dump(db) == before
    with db.write() as tx:
        ex.pause_run(tx, "run-1", actor=OPERATOR, control_owner_id=SERVER_ID, lease_ms=LEASE_MS)
    paused = submit(db, request_id, {"n": 1}, "k")
    assert isinstance(paused.error, RunPausedError)
    assert "piwf run resume run-1" in str(paused.error)
    with db.write() as tx:
        ex.resume_run(tx, "run-1", actor=OPERATOR)
    assert isinstance(submit(db, request_id, {"n": 1}, "k"), sub.SubmissionFound)


# conformance: I8
def test_a_candidate_of_a_closed_request_is_rejected_and_protects_its_tree_until_then(
    db: StateDatabase, clock: FakeClock
) -> None:
    request_id = park(db, agent_flow())
    first = created(submit(db, request_id, {"n": 1}, "k1"))
    with db.write() as tx:
        ex.cancel_run(tx, "run-1", actor=OPERATOR, control_owner_id=SERVER_ID, lease_ms=LEASE_MS)
    clock.advance(31 * rt.DAY_MS)
    with db.read() as tx:
        verdict = rt.judge_tree(tx, "run-1", tx.now, rt.cutoff_for(tx.now))
    assert verdict is not None and "submission" in verdict.reasons
    settled = begin(db, first.submission_id, "val-1")
    assert isinstance(settled, sub.SubmissionRow)
    assert settled.outcome is AgentSubmissionOutcome.REJECTED
    assert "closed (cancelled)" in (text(db, settled.error_hash) or "")
    with db.read() as tx:
        verdict = rt.judge_tree(tx, "run-1", tx.now, rt.cutoff_for(tx.now))
    assert verdict is not None and verdict.reasons == ()


@pytest.mark.parametrize("accepted", [True, False])
def test_a_request_closed_while_validating_rejects_the_reply(
    db: StateDatabase, accepted: bool
) -> None:
    request_id = park(db, agent_flow())
    first = created(submit(db, request_id, {"n": 1}, "k1"))
    begin(db, first.submission_id, "val-1")
    with db.write() as tx:
        ex.cancel_run(tx, "run-1", actor=OPERATOR, control_owner_id=SERVER_ID, lease_ms=LEASE_MS)
    if accepted:
        settled = accept(db, first.submission_id, "val-1", {"n": 1})
    else:
        settled = reject(db, first.submission_id, "val-1", "bad")
    assert settled.outcome is AgentSubmissionOutcome.REJECTED
    assert request_row(db, request_id).status is InteractionStatus.CANCELLED
    assert run_status(db, "run-1") == "cancelled"
    assert violations(db) == []


def test_a_long_loops_submissions_are_read_for_its_newest_requests_with_their_count(
    db: StateDatabase, clock: FakeClock
) -> None:
    """An agent step asked again on every visit: the bounded read (what ``run.get`` shows)
    holds every submission of the newest requests that received any, and the count all."""
    workflow = compiled(
        define_workflow(
            name="counts",
            start_at="ask",
            nodes={
                "ask": agent(prompt="Count", expected_output='{"n": int}'),
                "done": compute(lambda ctx: ctx.outputs["ask"]),
            },
            edges=[
                {
                    "from": "ask",
                    "switch": {
                        "on": "$output.n",
                        "cases": {"0": "done", "1": "ask", "2": "ask", "3": "ask"},
                    },
                }
            ],
            max_steps=20,
        )
    )
    asked = [park(db, workflow)]
    for n in (3, 2, 1):
        clock.advance(1)
        rejected = created(submit(db, asked[-1], {"n": "no"}, f"bad-{n}"))
        begin(db, rejected.submission_id, f"val-bad-{n}")
        reject(db, rejected.submission_id, f"val-bad-{n}", "n must be a number")
        clock.advance(1)
        good = created(submit(db, asked[-1], {"n": n}, f"good-{n}"))
        begin(db, good.submission_id, f"val-{n}")
        accept(db, good.submission_id, f"val-{n}", {"n": n})
        launched, _, result = run_once(db, workflow)
        exit_and_recover(db, launched, RunnerStatus.EXITED)
        assert result.request_id is not None
        asked.append(result.request_id)
    with db.read() as tx:
        newest = [(s.request_id, s.idempotency_key) for s in sub.run_submissions(tx, "run-1", 2)]
        every = sub.run_submissions(tx, "run-1")
        count = sub.count_submitted_requests(tx, "run-1")
    assert newest == [
        (asked[1], "bad-2"),
        (asked[1], "good-2"),
        (asked[2], "bad-1"),
        (asked[2], "good-1"),
    ]
    assert len(every) == 6 and count == 3  # the fourth request has none yet
