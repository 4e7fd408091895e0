"""Answers to interactive requests, decision deadlines, and the read models around them.

The one module that composes the decision aggregate (:mod:`piwf.state.decisions`) with the run
and request rows. Each transition runs in the caller's ``BEGIN IMMEDIATE`` transaction::

    answer_request ──┐  resolution (the winner) + submission ``won``
    expire_due ──────┴─▶ request pending → answered (answer + answered_by)
                         run waiting → running, queue parked and available now (one run change)
                         the scheduler then launches ``resume`` and the engine consumes the answer

A candidate arriving after the winner changes no run or request row: it is kept as ``adopted``
(equal to the winner) or ``already_resolved`` and the caller gets the winner back. A runner that
has committed its request but not parked yet is not disturbed: only the request row changes and
its park sees the answer (``apply_park`` keeps an answered run claimable).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.lifecycle import Adopted, AnsweredBy, Applied, Conflict, RunStatus
from piwf.state import blobs, decisions
from piwf.state.database import Transaction
from piwf.state.decisions import Decision, Resolution
from piwf.state.enums import (
    ACCEPTING_PROVENANCES,
    FailureClass,
    InteractionStatus,
    OwnerType,
    QueueStatus,
    ResolutionOutcome,
    ResolutionProvenance,
    SubmissionOutcome,
    SubmissionSource,
)
from piwf.state.execution import queue, requests, runs
from piwf.state.execution.core import record_run_change, take_run_authority
from piwf.state.leases import Claim, release_claim
from piwf.state.records import Actor

#: How each winning provenance is written on the request row.
_ANSWERED_BY = {
    ResolutionProvenance.HUMAN: AnsweredBy.HUMAN,
    ResolutionProvenance.CLIENT: AnsweredBy.CLIENT,
    ResolutionProvenance.TIMEOUT_POLICY: AnsweredBy.TIMEOUT_POLICY,
    ResolutionProvenance.EXPIRED_NO_DEFAULT: AnsweredBy.EXPIRED,
}

#: The provenance a source's winning answer records.
_PROVENANCE_OF_SOURCE = {
    SubmissionSource.HUMAN: ResolutionProvenance.HUMAN,
    SubmissionSource.CLIENT: ResolutionProvenance.CLIENT,
}


@dataclass(frozen=True)
class AnswerOutcome:
    """What one answer did: ``outcome`` of the candidate and the decision's winner.

    ``resolution`` is None only for a ``rejected`` candidate of an unresolved decision.
    """

    request_id: str
    run_id: str
    outcome: SubmissionOutcome
    resolution: Resolution | None
    reason: str | None = None


@dataclass(frozen=True)
class OpenRequest:
    """A pending request (checkpoint, decision or agent step), as ``requests.list`` and
    ``run.get`` show it.

    The content is named by its digest, not read: a prompt may be far larger than a client
    frame, and the server sends it inline or by reference as its size allows. An agent request
    also has its active-time budget (``timeout_ms``) and its latest rejection (a text blob).
    """

    request_id: str
    run_id: str
    kind: str
    path: str
    visit: int
    content_hash: bytes
    choices: dict[str, str] | None
    deadline_at: int | None
    has_default: bool
    created_at: int
    #: ``{choice: input}`` of the choices that carry a text input (wire form), or None.
    inputs: dict[str, JsonValue] | None = None
    timeout_ms: int | None = None
    rejection_hash: bytes | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """Return the wire form (camelCase keys) without the content."""
        return {
            "requestId": self.request_id,
            "runId": self.run_id,
            "kind": self.kind,
            "path": self.path,
            "visit": self.visit,
            "choices": None if self.choices is None else dict(self.choices),
            "deadlineAt": self.deadline_at,
            "hasDefault": self.has_default,
            "createdAt": self.created_at,
            "inputs": self.inputs,
            "timeoutMs": self.timeout_ms,
        }


@dataclass(frozen=True)
class DecisionAudit:
    """One decision of a run: its winner (if any) and its submissions (every one, or the
    newest; ``submission_count`` counts them all)."""

    decision: Decision
    resolution: Resolution | None
    submissions: list[decisions.Submission]
    submission_count: int

    def to_json(self) -> dict[str, JsonValue]:
        """Return the wire form (camelCase keys); private actor ids are left out."""
        return {
            "decisionId": self.decision.decision_id,
            "kind": self.decision.kind.value,
            "choices": None if self.decision.choices is None else dict(self.decision.choices),
            "inputs": self.decision.inputs_json(),
            "deadlineAt": self.decision.deadline_at,
            "hasDefault": self.decision.has_default,
            "resolution": None if self.resolution is None else self.resolution.to_json(),
            "submissions": [submission.to_json() for submission in self.submissions],
            "submissionCount": self.submission_count,
        }


def answer_request(
    tx: Transaction,
    request_id: str,
    response: JsonValue,
    *,
    source: SubmissionSource,
    actor: Actor,
    submission_id: str,
) -> Applied[AnswerOutcome] | Adopted[AnswerOutcome] | Conflict | None:
    """Submit one candidate answer for the exact request ``request_id``.

    - None: there is no such request (nothing written).
    - ``Conflict``: the request has no decision (an agent request), ``submission_id`` was
      already used for another candidate, or the run is paused while the request is still open
      (seed 001 "Pause and cancellation": answers are refused while paused; nothing written).
    - ``Adopted``: ``submission_id`` was already used for this same candidate; the stored
      outcome and the current winner come back (nothing written).
    - ``Applied``: a new submission was recorded. Its ``outcome`` is ``won`` (this answer is
      the winner: resolution, request ``answered`` and the run made eligible, one transaction),
      ``adopted`` (equal to the existing winner), ``already_resolved`` (another winner exists;
      it comes back) or ``rejected`` (the answer does not fit the declared choices, or a
      non-human source answered a protected decision; ``reason`` says why).
    """
    decision = decisions.get_decision(tx, request_id)
    if decision is None:
        request = requests.get_request(tx, request_id)
        if request is None:
            return None
        host = requests.agent_request_host(tx, request.run_id, request.kind.value)
        return Conflict(
            f"request {request_id} is an agent step's request, not a checkpoint or decision; "
            + requests.command_of_the_other_kind(
                request,
                "piwf submit",
                "submit its output with",
                instead=None if host is None else f"submit its output {host}",
            )
        )
    earlier = decisions.get_submission(tx, request_id, submission_id)
    resolution = decisions.get_resolution(tx, request_id)
    if earlier is not None:
        if not _same(earlier.candidate, response) or earlier.source is not source:
            return Conflict(f"submission {submission_id} was made with another answer")
        return Adopted(_outcome(decision, earlier.outcome, resolution, earlier.reason))
    if resolution is not None:
        same = resolution.outcome is ResolutionOutcome.ACCEPTED and _same(
            resolution.response, response
        )
        outcome = SubmissionOutcome.ADOPTED if same else SubmissionOutcome.ALREADY_RESOLVED
        decisions.record_submission_in(
            tx,
            decision,
            submission_id=submission_id,
            source=source,
            actor=actor,
            candidate=response,
            outcome=outcome,
        )
        return Applied(_outcome(decision, outcome, resolution))
    if paused_run_of_request(tx, request_id) is not None:
        run_id = decision.run_id
        return Conflict(f"run {run_id} is paused; resume it first (piwf run resume {run_id})")
    problem = _refusal(tx, decision, source, response)
    if problem is not None:
        decisions.record_submission_in(
            tx,
            decision,
            submission_id=submission_id,
            source=source,
            actor=actor,
            candidate=response,
            outcome=SubmissionOutcome.REJECTED,
            reason=problem,
        )
        return Applied(_outcome(decision, SubmissionOutcome.REJECTED, None, problem))
    winner = decisions.resolve_in(
        tx,
        decision,
        provenance=_PROVENANCE_OF_SOURCE[source],
        response=response,
        actor=actor,
        submission_id=submission_id,
        source=source,
    )
    _apply_winner(tx, decision, winner, actor, claim=None)
    return Applied(_outcome(decision, SubmissionOutcome.WON, winner))


def paused_run_of_request(tx: Transaction, request_id: str) -> str | None:
    """The id of the request's run when that run is paused, else None (also for no request).

    Every way of settling an open request from outside (answers today; submissions and updates
    of agent requests) is refused while this returns a run id.
    """
    request = requests.get_request(tx, request_id)
    if request is None:
        return None
    run = runs.load_run(tx, request.run_id)
    return None if run is None or not run.paused else run.run_id


def expire_due_decisions(
    tx: Transaction, *, actor: Actor, control_owner_id: str, lease_ms: int
) -> list[AnswerOutcome]:
    """Settle every decision whose absolute deadline has passed by ``tx.now``.

    A decision with a validated default records it with ``timeout_policy`` provenance; one
    without is cancelled as ``expired_no_default`` and its visit ends ``timed_out``. Either way
    the request becomes ``answered`` and the run eligible again, under a ``control`` claim
    (generation + 1) that is released in the same transaction. A decision whose run is not
    ``waiting`` yet (its runner has not parked) or whose claim is live is left for the next
    pass. Returns the decisions settled now.
    """
    settled: list[AnswerOutcome] = []
    for decision in decisions.due_decisions(tx):
        run = runs.load_run(tx, decision.run_id)
        if run is None or run.status is not RunStatus.WAITING:
            continue
        authority = take_run_authority(
            tx,
            run,
            claim=None,
            owner_type=OwnerType.CONTROL,
            owner_id=control_owner_id,
            lease_ms=lease_ms,
        )
        if isinstance(authority, Conflict):
            continue
        if decision.has_default:
            winner = decisions.resolve_in(
                tx,
                decision,
                provenance=ResolutionProvenance.TIMEOUT_POLICY,
                response=decision.default_response,
                actor=actor,
                submission_id="policy:timeout",
                source=SubmissionSource.POLICY,
            )
        else:
            winner = decisions.resolve_in(
                tx,
                decision,
                provenance=ResolutionProvenance.EXPIRED_NO_DEFAULT,
                reason="the deadline passed with no default response",
                actor=actor,
                submission_id="policy:expired",
                source=SubmissionSource.POLICY,
            )
        _apply_winner(tx, decision, winner, actor, claim=authority)
        release_claim(tx, authority)
        settled.append(_outcome(decision, SubmissionOutcome.WON, winner))
    return settled


def list_open_requests(
    tx: Transaction,
    run_id: str | None = None,
    *,
    after: tuple[int, str] | None = None,
    limit: int = -1,
) -> list[OpenRequest]:
    """Return the pending requests of every kind (of one run, or of all), oldest first; those
    after ``after`` (``(created_at, request_id)``), at most ``limit`` (-1: all)."""
    found = []
    for request in requests.pending_requests(tx, run_id, after=after, limit=limit):
        decision = decisions.get_decision(tx, request.request_id)
        found.append(
            OpenRequest(
                request_id=request.request_id,
                run_id=request.run_id,
                kind=request.kind.value,
                path=request.path,
                visit=request.visit,
                content_hash=request.content_hash,
                choices=None if decision is None else decision.choices,
                deadline_at=None if decision is None else decision.deadline_at,
                has_default=False if decision is None else decision.has_default,
                created_at=request.created_at,
                inputs=None if decision is None else decision.inputs_json(),
                timeout_ms=request.timeout_ms,
                rejection_hash=request.rejection_hash,
            )
        )
    return found


def run_decision_audit(
    tx: Transaction, run_id: str, newest: int | None = None, newest_submissions: int | None = None
) -> list[DecisionAudit]:
    """Return every decision of the run (or its ``newest`` latest ones) with its winner and
    submissions (or each one's ``newest_submissions`` latest), oldest first."""
    audits = []
    for decision in decisions.list_run_decisions(tx, run_id, newest):
        shown = decisions.list_submissions(tx, decision.decision_id, newest_submissions)
        count = len(shown)
        if newest_submissions is not None and count >= newest_submissions:
            count = decisions.count_submissions(tx, decision.decision_id)
        audits.append(
            DecisionAudit(
                decision=decision,
                resolution=decisions.get_resolution(tx, decision.decision_id),
                submissions=shown,
                submission_count=count,
            )
        )
    return audits


def _refusal(
    tx: Transaction, decision: Decision, source: SubmissionSource, response: JsonValue
) -> str | None:
    if source not in _PROVENANCE_OF_SOURCE:
        return f"a {source.value} answer cannot settle a request"
    if decision.protected and source is not SubmissionSource.HUMAN:
        return (
            "a protected decision accepts only a human answer: ask a person to run "
            f"`piwf answer {decision.decision_id} VALUE`"
        )
    request = requests.get_request(tx, decision.decision_id)
    status = None if request is None else request.status
    if status is not InteractionStatus.PENDING:
        return f"request {decision.decision_id} is {status}"
    return decisions.check_candidate(decision, response)


def _apply_winner(
    tx: Transaction, decision: Decision, winner: Resolution, actor: Actor, *, claim: Claim | None
) -> None:
    """Write the winner onto the request and make a waiting run eligible (one run change)."""
    answer = winner.response if winner.provenance in ACCEPTING_PROVENANCES else None
    answered_by = _ANSWERED_BY[winner.provenance]
    requests.answer(
        tx, decision.decision_id, answer_hash=blobs.put_json(tx, answer), answered_by=answered_by
    )
    payload = {"requestId": decision.decision_id, "provenance": winner.provenance.value}
    make_waiting_run_eligible(tx, decision.run_id, payload, actor, claim)


def make_waiting_run_eligible(
    tx: Transaction,
    run_id: str,
    payload: Mapping[str, JsonValue],
    actor: Actor,
    claim: Claim | None,
) -> bool:
    """After its request was answered, a ``waiting`` run becomes ``running`` with its queue row
    parked and available now, in one run change (event ``interaction.answered`` with
    ``payload``); the scheduler then launches ``resume``. Returns False and changes nothing when
    the run is not ``waiting``: a runner that has not parked yet sees the answered request in
    its park, and a live runner that waits on the request itself learns it from the server.
    """
    run = runs.load_run(tx, run_id)
    if run is None or run.status is not RunStatus.WAITING:
        return False
    record_run_change(tx, run, "interaction.answered", actor, claim, payload)
    runs.resume_waiting(tx, run.run_id)
    error_code = None if run.error_code is None else FailureClass(run.error_code)
    queue.set_queue(tx, run.run_id, QueueStatus.PARKED, error_code=error_code, available_now=True)
    return True


def _same(left: JsonValue, right: JsonValue) -> bool:
    return canonical.encode(left) == canonical.encode(right)


def _outcome(
    decision: Decision,
    outcome: SubmissionOutcome,
    resolution: Resolution | None,
    reason: str | None = None,
) -> AnswerOutcome:
    return AnswerOutcome(
        request_id=decision.decision_id,
        run_id=decision.run_id,
        outcome=outcome,
        resolution=resolution,
        reason=reason,
    )
