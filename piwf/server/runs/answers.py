"""Answers to checkpoints and protected decisions, and the timer that keeps their deadlines.

==================  =======  =================================================================
operation           kind     what it does
==================  =======  =================================================================
checkpoint.answer   durable  an authorised client answers a checkpoint (source ``client``); a
                             protected decision refuses it
decision.answer     durable  a person answers (source ``human``): the only answer that settles a
                             protected decision; checkpoints accept it too
requests.list       read     pending requests (checkpoints, decisions, agent steps with
                             their active-time deadline), oldest first
==================  =======  =================================================================

An answer names one exact request id. Its store change (winner, request ``answered``, run made
eligible) commits with the command receipt; the scheduler is then woken and launches ``resume``,
whose engine consumes the answer. The submission id of an answer is the client id and the
idempotency key, so a retried command adopts its own submission.

:class:`DecisionDeadlines` settles decisions whose absolute deadline has passed: once right
after startup (so a restart keeps deadlines exact: due ones expire at once) and then at the next
deadline or the poll interval, whichever comes first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from piwf.errors import (
    AnswerRejectedError,
    NotDecisionRequestError,
    PiwfError,
    RunCommandError,
    RunPausedError,
)
from piwf.lifecycle import Adopted, Conflict
from piwf.protocol.client_v1 import Request
from piwf.protocol.payloads import (
    ActiveTimeInfo,
    AnswerPayload,
    AnswerReceipt,
    DecisionInfo,
    OpenRequestInfo,
    RequestCursor,
    RequestList,
    RequestsListPayload,
    ResolutionInfo,
)
from piwf.server.commands import CommandResult
from piwf.server.content_offer import ContentOffer, within_budget
from piwf.server.loop import EventLoop, Timer
from piwf.server.replies import unknown_request
from piwf.state import StateDatabase, Transaction
from piwf.state import decisions as decision_store
from piwf.state import execution as ex
from piwf.state.enums import ActorType, SubmissionOutcome, SubmissionSource
from piwf.state.execution import messages
from piwf.state.execution import runs as run_store
from piwf.state.execution.submissions import submission_count
from piwf.state.records import Actor

log = logging.getLogger("piwf.server")

#: Encoded bytes of the requests of one ``requests.list`` page (which always holds one); a
#: request carries all of a decision's choices, so a full page of them could pass a frame.
REQUEST_PAGE_BYTES = 256 * 1024


class UnknownRequestError(PiwfError):
    """The answer names a request that does not exist."""

    code = "requestNotFound"


def answer_change(
    request: Request, payload: AnswerPayload, source: SubmissionSource, home: Path
) -> Callable[[Transaction], CommandResult]:
    """Return the durable change of one answer (run inside the command's transaction);
    ``home`` is the state home, named when the request does not exist."""
    actor_type = ActorType.HUMAN if source is SubmissionSource.HUMAN else ActorType.CLIENT
    actor = Actor(actor_type, request.client_id)
    submission_id = f"{request.client_id}:{request.idempotency_key}"

    def change(tx: Transaction) -> CommandResult:
        paused = ex.paused_run_of_request(tx, payload.request_id)
        if paused is not None:
            refusal = RunPausedError(
                f"run {paused} is paused; answers are refused until it is resumed "
                f"(piwf run resume {paused})"
            )
            return CommandResult.failed("rejected", refusal, run_id=paused)
        result = ex.answer_request(
            tx,
            payload.request_id,
            payload.response,
            source=source,
            actor=actor,
            submission_id=submission_id,
        )
        if result is None:
            error = UnknownRequestError(unknown_request(tx, payload.request_id, home))
            return CommandResult.failed("notFound", error)
        if isinstance(result, Conflict):
            if decision_store.get_decision(tx, payload.request_id) is None:  # an agent step's
                return CommandResult.failed("rejected", NotDecisionRequestError(result.evidence))
            return CommandResult.failed("rejected", RunCommandError(result.evidence))
        answer = result.value
        if answer.outcome is SubmissionOutcome.REJECTED or answer.resolution is None:
            reason = answer.reason or "the answer was rejected"
            return CommandResult.failed(
                "rejected", AnswerRejectedError(reason), run_id=answer.run_id
            )
        outcome = answer.outcome.value
        if isinstance(result, Adopted) and answer.outcome is SubmissionOutcome.WON:
            outcome = SubmissionOutcome.WON.value
        receipt = AnswerReceipt.model_validate(
            {
                "requestId": answer.request_id,
                "runId": answer.run_id,
                "outcome": outcome,
                "resolution": resolution_info(answer.resolution),
            }
        )
        return CommandResult.accepted(receipt.to_wire(), run_id=answer.run_id)

    return change


def list_requests(db: StateDatabase, payload: RequestsListPayload) -> RequestList | None:
    """Return a page of the pending requests of every kind for ``requests.list``: at most
    ``limit``, ending early once their encoded size reaches :data:`REQUEST_PAGE_BYTES` (at
    least one); None when the payload names a run that does not exist (an unknown run is not
    a run with no requests)."""
    with db.read() as tx:
        if payload.run_id is not None and run_store.load_run(tx, payload.run_id) is None:
            return None
        after = (
            None if payload.after is None else (payload.after.created_at, payload.after.request_id)
        )
        found = ex.list_open_requests(tx, payload.run_id, after=after, limit=payload.limit + 1)
        offer = ContentOffer(tx)
        shown = within_budget(
            (open_request_info(item, offer) for item in found[: payload.limit]),
            REQUEST_PAGE_BYTES,
        )
        last = shown[-1] if len(shown) < len(found) else None
        return RequestList(
            requests=shown,
            next_cursor=None
            if last is None
            else RequestCursor(created_at=last.created_at, request_id=last.request_id),
        )


def open_request_info(item: ex.OpenRequest, offer: ContentOffer) -> OpenRequestInfo:
    """Return the wire form of one pending request; its content (and an agent request's latest
    rejection) inline or by reference, its submission count, whether its run is paused, and
    for an agent request with a deadline, where its active time stands."""
    content = offer.json("run", item.run_id, item.content_hash)
    rejection = offer.text("run", item.run_id, item.rejection_hash)
    deadline = ex.agent_deadline(offer.tx, item.request_id)
    active_time = None
    if deadline is not None:
        active_time = ActiveTimeInfo(
            timeout_ms=deadline.timeout_ms,
            active_ms=deadline.active_ms,
            remaining_ms=deadline.remaining_ms,
            counting=deadline.counting,
            due_at=deadline.due_at,
        )
    return OpenRequestInfo.model_validate(
        {
            **item.to_json(),
            "content": content.value,
            "contentRef": content.ref,
            "latestRejection": rejection.value,
            "latestRejectionRef": rejection.ref,
            "submissions": submission_count(offer.tx, item.request_id),
            "activeTime": None if active_time is None else active_time.to_wire(),
            "session": messages.session_of(offer.tx, item.run_id),
            "runPaused": _run_paused(offer.tx, item.run_id),
        }
    )


def _run_paused(tx: Transaction, run_id: str) -> bool:
    """Whether the run is paused (its requests take no answer until it is resumed)."""
    run = run_store.load_run(tx, run_id)
    return run is not None and run.paused


def resolution_info(resolution: decision_store.Resolution) -> ResolutionInfo:
    """Return the wire form of a decision's winner (no private actor id), response inline.

    For an answer's durable receipt; reads of the audit use :func:`decision_infos`.
    """
    return ResolutionInfo.model_validate(resolution.to_json())


def decision_infos(
    tx: Transaction,
    run_id: str,
    offer: ContentOffer,
    newest: int,
    budget: int,
    newest_submissions: int,
) -> list[DecisionInfo]:
    """Return the audit of the run's ``newest`` latest checkpoints and decisions that fit in
    ``budget`` encoded bytes (at least the newest one), oldest first, each with its
    ``newest_submissions`` latest submissions and their count; each answer inline or by
    reference as ``offer`` decides, the newest served first."""
    audits = ex.run_decision_audit(tx, run_id, newest, newest_submissions)
    shown = within_budget(
        (_decision_info(audit, run_id, offer) for audit in reversed(audits)), budget
    )
    return shown[::-1]


def _decision_info(audit: ex.DecisionAudit, run_id: str, offer: ContentOffer) -> DecisionInfo:
    resolution = audit.resolution
    resolution_wire = None
    if resolution is not None:
        response = offer.json("run", run_id, resolution.response_hash)
        resolution_wire = {
            **resolution.to_json(),
            "response": response.value,
            "responseRef": response.ref,
        }
    submissions = []
    for submission in audit.submissions:
        response = offer.json("run", run_id, submission.candidate_hash)
        submissions.append(
            {**submission.to_json(), "response": response.value, "responseRef": response.ref}
        )
    return DecisionInfo.model_validate(
        {**audit.to_json(), "resolution": resolution_wire, "submissions": submissions}
    )


def waiting_on(tx: Transaction, run_id: str, offer: ContentOffer) -> OpenRequestInfo | None:
    """Return the pending request the run waits on, or None."""
    found = ex.list_open_requests(tx, run_id)
    return open_request_info(found[0], offer) if found else None


class DecisionDeadlines:
    """Settles due decisions under a control claim and wakes the scheduler afterwards."""

    def __init__(
        self,
        *,
        db: StateDatabase,
        loop: EventLoop,
        owner_id: Callable[[], str],
        lease_ms: int,
        poll_s: float,
        settled: Callable[[list[str]], None],
    ) -> None:
        self.db = db
        self.loop = loop
        self.owner_id = owner_id
        self.lease_ms = lease_ms
        self.poll_s = poll_s
        self.settled = settled
        self._timer: Timer | None = None
        self.nudge()

    def nudge(self) -> None:
        """Run a pass on the next loop turn (after startup, or when a run changed)."""
        self._schedule(0.0)

    def run_pass(self) -> None:
        """Expire every due decision, then schedule the next pass."""
        self._timer = None
        run_ids: list[str] = []
        next_deadline: int | None = None
        now = 0
        try:
            with self.db.read() as tx:
                next_deadline, now = decision_store.next_deadline(tx), tx.now
            if next_deadline is None or next_deadline > now:  # nothing is due: no write
                self._schedule_next(next_deadline, now)
                return
            with self.db.write() as tx:
                owner = self.owner_id()
                settled = ex.expire_due_decisions(
                    tx,
                    actor=Actor(ActorType.POLICY, owner),
                    control_owner_id=owner,
                    lease_ms=self.lease_ms,
                )
                run_ids = [item.run_id for item in settled]
                next_deadline = decision_store.next_deadline(tx)
                now = tx.now
        except PiwfError as error:
            log.warning("decision deadlines: a pass failed: %s", error)
        if run_ids:
            self.settled(run_ids)
        self._schedule_next(next_deadline, now)

    def _schedule_next(self, next_deadline: int | None, now: int) -> None:
        delay = self.poll_s
        if next_deadline is not None and next_deadline > now:
            # A deadline already past is a run that has not parked yet: its runner's exit
            # nudges the next pass, and the poll interval bounds the wait otherwise.
            delay = min(delay, (next_deadline - now) / 1000)
        self._schedule(delay)

    def _schedule(self, delay_s: float) -> None:
        if self.loop.stop_requested:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay_s, self.run_pass)
