"""Agent requests from outside their runner: submissions, progress updates, and how run views
show them.

==================  =======  =================================================================
operation           kind     what it does
==================  =======  =================================================================
interaction.submit  durable  record the candidate ``validating`` and start its validation
                             child; answered only once its outcome is committed
interaction.update  durable  keep a non-completing progress update on the request's attempt
==================  =======  =================================================================

A submission's receipt is the submission row itself (keyed by request id and idempotency key),
not a ``server_commands`` row: the outcome is known only after a child reports, and a
reconnect that repeats the key must wait for that same outcome::

    submit ──fenced write: submissions.submit──▶ refused          answered at once, nothing stored
                                             ──▶ settled earlier   its stored receipt (adopted)
                                             ──▶ validating        wait; a new candidate starts
                                                                   its validation child
    validation settled ──▶ every waiting submit of that submission is answered:
                           accepted → outcome accepted (adopted for joiners) + receipt
                           rejected → outcome rejected, code submissionRejected, the stored error

An update goes through the durable command path like other commands (its receipt commits with
the update).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from piwf.errors import ClaimLostError, PiwfError, SubmissionRejectedError
from piwf.lifecycle import AnsweredBy, InteractionKind
from piwf.protocol.agent_payloads import (
    SubmissionReceipt,
    SubmitPayload,
    UpdatePayload,
    UpdateReceipt,
)
from piwf.protocol.client_v1 import ErrorInfo, Outcome, Request, Response
from piwf.protocol.payloads import AgentRequestInfo, AgentSubmissionInfo
from piwf.server.commands import CommandResult
from piwf.server.content_offer import ContentOffer, within_budget
from piwf.server.context import ServerContext
from piwf.server.failures import failure_response
from piwf.server.loop import Reply
from piwf.server.replies import error_response, payload_of, unknown_request
from piwf.server.runs.answers import UnknownRequestError
from piwf.server.sessions import refuse_without_authority
from piwf.state import Transaction
from piwf.state.enums import AgentSubmissionOutcome
from piwf.state.execution import requests
from piwf.state.execution import submissions as sub
from piwf.state.server_epoch import SERVER_RESOURCE

#: The outcome of each kind of refusal (anything else is ``rejected``).
_REFUSAL_OUTCOMES: dict[str, Outcome] = {"idempotencyConflict": "conflict"}


class InteractionHandlers:
    """``interaction.submit`` and ``interaction.update``; submits wait here for their outcome."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context
        #: Submission id → the submits waiting for its outcome (``True``: a joiner, answered
        #: ``adopted`` when accepted).
        self.waiting: dict[str, list[tuple[Request, Reply, bool]]] = {}

    def interaction_submit(self, request: Request, reply: Reply) -> None:
        """Submit one agent output; the answer waits until its outcome is durable."""
        payload = payload_of(request, SubmitPayload)
        unauthorized = refuse_without_authority(
            self.context, request, payload.request_id, payload.coordinator_epoch
        )
        if unauthorized is not None:
            reply(unauthorized)
            return
        key = request.idempotency_key
        assert key is not None, "durable requests carry a key (protocol rule)"
        answer: Response | None = None
        with self._fenced() as tx:
            found = sub.submit(
                tx, payload.request_id, payload.output, idempotency_key=key, run_id=request.run_id
            )
            if found is None:
                message = unknown_request(tx, payload.request_id, self.context.home)
                answer = error_response(request, "notFound", "requestNotFound", message)
            elif isinstance(found, sub.SubmitRefused):
                answer = refusal(request, found.error)
            elif found.submission.settled:
                answer = settled_response(tx, request, found.submission, adopted=True)
        if answer is not None:  # answered only after the transaction committed
            reply(answer)
            return
        assert isinstance(found, sub.SubmissionFound)
        submission = found.submission
        self.waiting.setdefault(submission.submission_id, []).append(
            (request, reply, not found.created)
        )
        if found.created:
            self.context.request_validation(submission.submission_id, submission.run_id)
            self.context.wake_scheduler()

    def submission_settled(self, submission: sub.SubmissionRow) -> None:
        """Answer every submit waiting for ``submission`` (its outcome is committed now)."""
        waiting = self.waiting.pop(submission.submission_id, [])
        if submission.outcome is AgentSubmissionOutcome.ACCEPTED:
            self.context.wake_scheduler()  # a waiting run was made eligible
        self.context.run_changed(submission.run_id)
        if not waiting:
            return
        for request, reply, joined in waiting:
            try:
                with self.context.db.read() as tx:
                    response = settled_response(tx, request, submission, adopted=joined)
            except Exception as error:  # a database that cannot serve: answer that, typed
                response = failure_response(request, error)
            reply(response)

    def interaction_update(self, request: Request, reply: Reply) -> None:
        """Record a progress update of an agent request (durable, non-completing)."""
        payload = payload_of(request, UpdatePayload)
        unauthorized = refuse_without_authority(
            self.context, request, payload.request_id, payload.coordinator_epoch
        )
        if unauthorized is not None:
            reply(unauthorized)
            return

        def change(tx: Transaction) -> CommandResult:
            found = sub.update_request(tx, payload.request_id, payload.data, run_id=request.run_id)
            if found is None:
                message = unknown_request(tx, payload.request_id, self.context.home)
                return CommandResult.failed("notFound", UnknownRequestError(message))
            if isinstance(found, sub.SubmitRefused):
                outcome = _REFUSAL_OUTCOMES.get(found.error.code, "rejected")
                return CommandResult.failed(outcome, found.error, run_id=None)
            receipt = UpdateReceipt(
                request_id=found.request_id, run_id=found.run_id, recorded_at=tx.now
            )
            return CommandResult.accepted(receipt.to_wire(), run_id=found.run_id)

        reply(self.context.commands.execute(request, change))

    @contextmanager
    def _fenced(self) -> Iterator[Transaction]:
        """A write under this server's epoch; a lost epoch stops the server (as commands do)."""
        try:
            with self.context.commands.fenced_write() as tx:
                yield tx
        except ClaimLostError as error:
            if error.resource_id == SERVER_RESOURCE:
                self.context.commands.on_epoch_lost(error)
            raise


def refusal(request: Request, error: PiwfError) -> Response:
    """The answer to a submission refused before validation (nothing was recorded)."""
    outcome = _REFUSAL_OUTCOMES.get(error.code, "rejected")
    return Response(request_id=request.request_id, outcome=outcome, error=ErrorInfo.of(error))


def settled_response(
    tx: Transaction, request: Request, submission: sub.SubmissionRow, *, adopted: bool
) -> Response:
    """The answer carrying ``submission``'s stored receipt (its value inline or by reference);
    a rejection is outcome ``rejected`` with code ``submissionRejected`` and the stored error."""
    stored = sub.stored_receipt(tx, submission)
    assert stored is not None
    value = ContentOffer(tx).json("run", submission.run_id, submission.value_hash)
    receipt = SubmissionReceipt.model_validate(
        {**stored, "value": value.value, "valueRef": value.ref}
    ).to_wire()
    if submission.outcome is AgentSubmissionOutcome.REJECTED:
        error = SubmissionRejectedError(receipt.get("error") or "the output was rejected")
        return Response(
            request_id=request.request_id,
            outcome="rejected",
            receipt=receipt,
            error=ErrorInfo.of(error),
        )
    outcome: Outcome = "adopted" if adopted else "accepted"
    return Response(request_id=request.request_id, outcome=outcome, receipt=receipt)


def agent_request_infos(
    tx: Transaction,
    run_id: str,
    offer: ContentOffer,
    newest: int,
    budget: int,
    newest_submissions: int,
) -> list[AgentRequestInfo]:
    """The run's ``newest`` latest agent requests that received submissions and fit in
    ``budget`` encoded bytes (at least the newest one), oldest first, each with its
    ``newest_submissions`` latest submissions (as sent, as accepted, why refused) and their
    count; values inline or by reference, the newest request served first."""
    by_request: dict[str, list[sub.SubmissionRow]] = {}
    for submission in sub.run_submissions(tx, run_id, newest):
        by_request.setdefault(submission.request_id, []).append(submission)
    infos = (
        _agent_request_info(tx, offer, run_id, request_id, submissions, newest_submissions)
        for request_id, submissions in reversed(by_request.items())
    )
    return within_budget((info for info in infos if info is not None), budget)[::-1]


def _agent_request_info(
    tx: Transaction,
    offer: ContentOffer,
    run_id: str,
    request_id: str,
    submissions: list[sub.SubmissionRow],
    newest_submissions: int,
) -> AgentRequestInfo | None:
    row = requests.get_request(tx, request_id)
    if row is None or row.kind is not InteractionKind.AGENT:
        return None
    return AgentRequestInfo(
        request_id=request_id,
        path=row.path,
        visit=row.visit,
        # An expired request (answered, later maybe cancelled with its run) says so.
        status="expired" if row.answered_by is AnsweredBy.EXPIRED else row.status.value,
        submissions=[
            _agent_submission_info(offer, run_id, item)
            for item in submissions[-newest_submissions:]
        ],
        submission_count=len(submissions),
    )


def _agent_submission_info(
    offer: ContentOffer, run_id: str, submission: sub.SubmissionRow
) -> AgentSubmissionInfo:
    output = offer.json("run", run_id, submission.payload_hash)
    value = offer.json("run", run_id, submission.value_hash)
    error = offer.text("run", run_id, submission.error_hash)
    return AgentSubmissionInfo.model_validate(
        {
            "submissionId": submission.submission_id,
            "outcome": submission.outcome.value,
            "output": output.value,
            "outputRef": output.ref,
            "value": value.value,
            "valueRef": value.ref,
            "error": error.value,
            "errorRef": error.ref,
            "submittedAt": submission.submitted_at,
            "settledAt": submission.settled_at,
        }
    )
