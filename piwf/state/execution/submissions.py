"""Agent submissions (``interactive_submissions``): the one module that writes them, and the
transitions that settle an agent request from outside its runner.

A candidate output names one exact agent request. It is recorded ``validating`` and validated
in a supervised child (never here, never in a runner); the child's reply settles it, fenced by
the validation id the server gave that child::

    submit ──▶ validating ──settle_accepted──▶ accepted   request pending → answered (value,
                  │                                        answered_by client); a waiting run is
                  │                                        made eligible (one run change)
                  ├──settle_rejected───────▶ rejected   request stays pending, its latest
                  │                                        rejection = the error
                  └──reject_validation_of──▶ rejected   the child died before it reported

What :func:`submit` answers, by what is already stored (the request's run, kind and status, the
run's pause flag, the key, the payload)::

    same key, same payload           the stored candidate (its receipt once settled)
    same key, other payload          idempotencyConflict
    run paused                       runPaused
    request not pending              requestNotOpen (an accepted equal payload: adopted)
    another candidate validating     same payload: adopted; other payload: validationPending
    otherwise                        a new ``validating`` candidate

Nothing here bumps a run revision except the acceptance of a ``waiting`` run's request: a live
runner (a headless step waiting on its agent command) holds the run and sends the revision it
expects, so a submission changes only the submission and request rows under it. Every function
runs inside the caller's ``BEGIN IMMEDIATE`` transaction and never commits.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import (
    NotAgentRequestError,
    PiwfError,
    RequestNotOpenError,
    RequestRunMismatchError,
    RunPausedError,
    SubmissionKeyConflictError,
    ValidationPendingError,
)
from piwf.lifecycle import AnsweredBy, Conflict, InteractionKind
from piwf.state import blobs, decisions
from piwf.state.database import Transaction
from piwf.state.enums import AgentSubmissionOutcome, AttemptStatus, InteractionStatus
from piwf.state.execution import attempts, requests, runs, updates
from piwf.state.execution.answers import make_waiting_run_eligible
from piwf.state.execution.requests import RequestRow
from piwf.state.execution.visits import read_saved_run
from piwf.state.records import Actor
from piwf.workflow.port import SavedRun

_COLUMNS = """
SELECT s.submission_id, s.request_id, s.idempotency_key, s.payload_hash, s.outcome,
       s.value_hash, s.error_hash, s.receipt_hash, s.validation_id, s.submitted_at,
       s.settled_at, i.run_id
FROM interactive_submissions s JOIN interactive_requests i ON i.request_id = s.request_id
"""

_SELECT_BY_ID = _COLUMNS + " WHERE s.submission_id = ?"
_SELECT_BY_KEY = _COLUMNS + " WHERE s.request_id = ? AND s.idempotency_key = ?"
_SELECT_VALIDATING_OF_REQUEST = _COLUMNS + " WHERE s.request_id = ? AND s.outcome = 'validating'"
_SELECT_ACCEPTED_OF_REQUEST = _COLUMNS + " WHERE s.request_id = ? AND s.outcome = 'accepted'"
_SELECT_VALIDATING = _COLUMNS + " WHERE s.outcome = 'validating' ORDER BY s.submitted_at"
_SELECT_OF_VALIDATION = _COLUMNS + " WHERE s.validation_id = ? AND s.outcome = 'validating'"
_SELECT_OF_RUN = (
    _COLUMNS + " WHERE i.run_id = ? ORDER BY i.created_at, s.submitted_at, s.submission_id"
)

# The run's newest agent requests that received a submission, and their submissions.
_SELECT_OF_NEWEST = """
SELECT s.submission_id, s.request_id, s.idempotency_key, s.payload_hash, s.outcome,
       s.value_hash, s.error_hash, s.receipt_hash, s.validation_id, s.submitted_at,
       s.settled_at, i.run_id
FROM interactive_submissions s JOIN interactive_requests i ON i.request_id = s.request_id
WHERE i.request_id IN (
  SELECT r.request_id FROM interactive_requests r INDEXED BY interactive_requests_run_idx
  WHERE r.run_id = ? AND r.kind = 'agent'
    AND EXISTS (SELECT 1 FROM interactive_submissions x WHERE x.request_id = r.request_id)
  ORDER BY r.created_at DESC, r.request_id DESC LIMIT ?)
ORDER BY i.created_at, s.submitted_at, s.submission_id
"""

_COUNT_SUBMITTED_REQUESTS = """
SELECT count(*) FROM interactive_requests r INDEXED BY interactive_requests_run_idx
WHERE r.run_id = ? AND r.kind = 'agent'
  AND EXISTS (SELECT 1 FROM interactive_submissions x WHERE x.request_id = r.request_id)
"""

_COUNT_OF_REQUEST = "SELECT count(*) FROM interactive_submissions WHERE request_id = ?"

_INSERT = """
INSERT INTO interactive_submissions (submission_id, request_id, idempotency_key, payload_hash,
                                     outcome, submitted_at)
VALUES (?, ?, ?, ?, 'validating', ?)
"""

_BEGIN_VALIDATION = """
UPDATE interactive_submissions SET validation_id = ?
WHERE submission_id = ? AND outcome = 'validating'
"""

_SETTLE = """
UPDATE interactive_submissions
SET outcome = :outcome, value_hash = :value_hash, error_hash = :error_hash,
    receipt_hash = :receipt_hash, settled_at = :now
WHERE submission_id = :submission_id AND outcome = 'validating'
  AND validation_id IS :validation_id
"""


#: The type and key under which an agent's progress update is kept (the latest one per attempt).
AGENT_UPDATE_TYPE = "piwf.agent.update"
AGENT_UPDATE_KEY = "latest"


@dataclass(frozen=True)
class SubmissionRow:
    """One candidate output of an agent request (``run_id`` is its request's run)."""

    submission_id: str
    request_id: str
    run_id: str
    idempotency_key: str
    payload_hash: bytes
    outcome: AgentSubmissionOutcome
    value_hash: bytes | None
    error_hash: bytes | None
    receipt_hash: bytes | None
    validation_id: str | None
    submitted_at: int
    settled_at: int | None

    @property
    def settled(self) -> bool:
        """Whether its outcome is final (``accepted`` or ``rejected``)."""
        return self.outcome is not AgentSubmissionOutcome.VALIDATING


@dataclass(frozen=True)
class SubmitRefused:
    """Nothing was recorded; ``error`` (typed, with its wire code) says why and what to do."""

    error: PiwfError


@dataclass(frozen=True)
class SubmissionFound:
    """The candidate this submission is: ``created`` when it was recorded now (the caller
    starts its validation), else an earlier one whose outcome it adopts."""

    submission: SubmissionRow
    created: bool


@dataclass(frozen=True)
class ValidationStart:
    """What a validation child of ``submission`` needs (its ``validation_id`` is now set)."""

    submission: SubmissionRow
    request: RequestRow
    project_path: str | None
    definition_digest: str
    saved: SavedRun | None
    candidate: JsonValue


def submission_id_for(request_id: str, idempotency_key: str) -> str:
    """The id of the candidate submitted for ``request_id`` under ``idempotency_key``."""
    digest = canonical.digest_hex(["piwf.submission.v1", request_id, idempotency_key])
    return f"submission-{digest[:40]}"


# Reads -------------------------------------------------------------------------------------


def get_submission(tx: Transaction, submission_id: str) -> SubmissionRow | None:
    """Return one submission, or None."""
    row = tx.one(_SELECT_BY_ID, (submission_id,))
    return None if row is None else _submission(row)


def validating_left_by_crash(tx: Transaction) -> list[SubmissionRow]:
    """Every ``validating`` candidate, oldest first: at startup, what a killed server left
    (recovery step 9 validates each again, once, in a new child)."""
    return [_submission(row) for row in tx.all(_SELECT_VALIDATING)]


def run_submissions(tx: Transaction, run_id: str, newest: int | None = None) -> list[SubmissionRow]:
    """Every submission to the run's agent requests (or to the ``newest`` latest requests
    that received any), by request, then oldest first."""
    if newest is None:
        return [_submission(row) for row in tx.all(_SELECT_OF_RUN, (run_id,))]
    return [_submission(row) for row in tx.all(_SELECT_OF_NEWEST, (run_id, newest))]


def count_submitted_requests(tx: Transaction, run_id: str) -> int:
    """How many of the run's agent requests received a submission."""
    return int(tx.scalar(_COUNT_SUBMITTED_REQUESTS, (run_id,)))


def is_validating(tx: Transaction, request_id: str) -> bool:
    """Whether a candidate of ``request_id`` is being validated now (its outcome is to come)."""
    return _one(tx, _SELECT_VALIDATING_OF_REQUEST, (request_id,)) is not None


def submission_count(tx: Transaction, request_id: str) -> int:
    """How many candidates were submitted for the request."""
    return int(tx.scalar(_COUNT_OF_REQUEST, (request_id,)))


def stored_receipt(tx: Transaction, submission: SubmissionRow) -> dict[str, JsonValue] | None:
    """The receipt stored when ``submission`` settled (None while it is validating)."""
    if submission.receipt_hash is None:
        return None
    receipt = blobs.read_json(tx, submission.receipt_hash)
    assert isinstance(receipt, dict)
    return receipt


# Transitions (inside the caller's one change) ------------------------------------------------


def submit(
    tx: Transaction,
    request_id: str,
    candidate: JsonValue,
    *,
    idempotency_key: str,
    run_id: str | None = None,
) -> SubmissionFound | SubmitRefused | None:
    """Submit ``candidate`` for the exact agent request ``request_id`` (see the module table).

    None: there is no such request (nothing written). ``run_id``, when the frame names one,
    must be the request's run (``requestRunMismatch`` otherwise). A refusal writes nothing.
    """
    request = requests.get_request(tx, request_id)
    if request is None:
        return None
    wrong = _wrong_request(tx, request, run_id)
    if wrong is not None:
        return wrong
    payload_hash = canonical.digest(candidate)
    earlier = _one(tx, _SELECT_BY_KEY, (request_id, idempotency_key))
    if earlier is not None:
        if earlier.payload_hash != payload_hash:
            return SubmitRefused(
                SubmissionKeyConflictError(
                    f"idempotency key {idempotency_key} was already used for another output "
                    f"of request {request_id}; submit a new output under a new key"
                )
            )
        return SubmissionFound(earlier, created=False)
    if request.status is not InteractionStatus.PENDING:
        accepted = _one(tx, _SELECT_ACCEPTED_OF_REQUEST, (request_id,))
        if accepted is not None and accepted.payload_hash == payload_hash:
            return SubmissionFound(accepted, created=False)
    refusal = _refusal(tx, request, run_id)
    if refusal is not None:
        return refusal
    validating = _one(tx, _SELECT_VALIDATING_OF_REQUEST, (request_id,))
    if validating is not None:
        if validating.payload_hash == payload_hash:
            return SubmissionFound(validating, created=False)
        return SubmitRefused(
            ValidationPendingError(
                f"another output for request {request_id} is being validated "
                f"({validating.submission_id}); wait for its outcome, then submit again if it "
                "is rejected"
            )
        )
    submission_id = submission_id_for(request_id, idempotency_key)
    stored_hash = blobs.put_json(tx, candidate)
    tx.execute(_INSERT, (submission_id, request_id, idempotency_key, stored_hash, tx.now))
    created = get_submission(tx, submission_id)
    assert created is not None
    return SubmissionFound(created, created=True)


def update_request(
    tx: Transaction, request_id: str, data: JsonValue, *, run_id: str | None = None
) -> RequestRow | SubmitRefused | None:
    """Record ``data`` as the latest progress update of the agent request's attempt.

    Non-completing: the request stays pending. Refused as :func:`submit` refuses (another run,
    not an agent request, paused, not open, a stale attempt); None for no such request. Like a
    submission it bumps no run revision (a live runner may hold the run); the update keeps the
    run revision it was recorded at.
    """
    request = requests.get_request(tx, request_id)
    if request is None:
        return None
    refusal = _refusal(tx, request, run_id)
    if refusal is not None:
        return refusal
    run = runs.require_run(tx, request.run_id)
    data_hash = blobs.put_json(tx, data)
    updates.publish_update(
        tx,
        attempt_id=request.attempt_id,
        update_type=AGENT_UPDATE_TYPE,
        key=AGENT_UPDATE_KEY,
        data_hash=data_hash,
        run_revision=run.revision,
        replaces=updates.latest_update(tx, request.attempt_id, AGENT_UPDATE_TYPE, AGENT_UPDATE_KEY),
    )
    return request


def begin_validation(
    tx: Transaction, submission_id: str, validation_id: str
) -> ValidationStart | SubmissionRow | None:
    """Give the ``validating`` candidate to a new validation child ``validation_id``.

    Returns what the child needs (:class:`ValidationStart`), or the settled row when there is
    nothing to validate: it settled already, or its request closed meanwhile (then it is
    rejected now, saying so). None: no such submission.
    """
    submission = get_submission(tx, submission_id)
    if submission is None or submission.settled:
        return submission
    request = requests.get_request(tx, submission.request_id)
    assert request is not None  # a submission cascades away with its request
    if request.status is not InteractionStatus.PENDING:
        return _settle(
            tx, submission, AgentSubmissionOutcome.REJECTED, error=_closed_while_validating(request)
        )
    run = runs.require_run(tx, request.run_id)
    saved = read_saved_run(tx, request.run_id)
    tx.execute(_BEGIN_VALIDATION, (validation_id, submission_id))
    started = get_submission(tx, submission_id)
    assert started is not None
    return ValidationStart(
        submission=started,
        request=request,
        project_path=run.project_path,
        definition_digest=run.definition_digest.hex(),
        saved=saved,
        candidate=blobs.read_json(tx, submission.payload_hash),
    )


def settle_accepted(
    tx: Transaction, submission_id: str, validation_id: str, value: JsonValue, *, actor: Actor
) -> SubmissionRow | Conflict:
    """The child ``validation_id`` accepted the candidate with (normalised) ``value``.

    The submission becomes ``accepted`` and its request ``answered`` (value, ``client``) in
    this one change; a ``waiting`` run is made eligible so the scheduler resumes it
    (:func:`~piwf.state.execution.answers.make_waiting_run_eligible`). A request that closed
    meanwhile rejects the candidate instead, saying so. ``Conflict``: the candidate is not
    ``validating`` under this validation id (a stale or duplicate reply); nothing is written.
    """
    submission = _fenced(tx, submission_id, validation_id)
    if isinstance(submission, Conflict):
        return submission
    request = requests.get_request(tx, submission.request_id)
    assert request is not None
    if request.status is not InteractionStatus.PENDING:
        error = _closed_while_validating(request)
        return _settle(tx, submission, AgentSubmissionOutcome.REJECTED, error=error)
    settled = _settle(tx, submission, AgentSubmissionOutcome.ACCEPTED, value=value)
    assert settled.value_hash is not None
    requests.answer(
        tx, request.request_id, answer_hash=settled.value_hash, answered_by=AnsweredBy.CLIENT
    )
    payload: dict[str, JsonValue] = {
        "requestId": request.request_id,
        "submissionId": submission_id,
    }
    make_waiting_run_eligible(tx, request.run_id, payload, actor, None)
    return settled


def settle_rejected(
    tx: Transaction, submission_id: str, validation_id: str | None, error: str
) -> SubmissionRow | Conflict:
    """The candidate is rejected with ``error`` (what ``validate`` raised, or why its
    validation stopped); the request stays ``pending`` with ``error`` as its latest rejection.
    ``Conflict`` as for :func:`settle_accepted`."""
    submission = _fenced(tx, submission_id, validation_id)
    if isinstance(submission, Conflict):
        return submission
    return _settle(tx, submission, AgentSubmissionOutcome.REJECTED, error=error)


def reject_validation_of(tx: Transaction, validation_id: str, error: str) -> list[SubmissionRow]:
    """Reject every ``validating`` candidate of the validation child ``validation_id`` (it died
    or overran before it reported) with ``error``; return them settled."""
    rejected = []
    for row in tx.all(_SELECT_OF_VALIDATION, (validation_id,)):
        settled = settle_rejected(tx, row["submission_id"], validation_id, error)
        if not isinstance(settled, Conflict):
            rejected.append(settled)
    return rejected


# Internals -----------------------------------------------------------------------------------


def _settle(
    tx: Transaction,
    submission: SubmissionRow,
    outcome: AgentSubmissionOutcome,
    *,
    value: JsonValue = None,
    error: str | None = None,
) -> SubmissionRow:
    value_hash = blobs.put_json(tx, value) if outcome is AgentSubmissionOutcome.ACCEPTED else None
    error_hash = None if error is None else blobs.put_text(tx, error)
    receipt: dict[str, JsonValue] = {
        "submissionId": submission.submission_id,
        "requestId": submission.request_id,
        "runId": submission.run_id,
        "outcome": outcome.value,
        "submittedAt": submission.submitted_at,
        "settledAt": tx.now,
    }
    if error is not None:
        receipt["error"] = error
    tx.execute(
        _SETTLE,
        {
            "outcome": outcome.value,
            "value_hash": value_hash,
            "error_hash": error_hash,
            "receipt_hash": blobs.put_json(tx, receipt),
            "now": tx.now,
            "submission_id": submission.submission_id,
            "validation_id": submission.validation_id,
        },
    )
    if error_hash is not None:
        requests.record_rejection(tx, submission.request_id, error_hash)
    settled = get_submission(tx, submission.submission_id)
    assert settled is not None
    return settled


def _fenced(
    tx: Transaction, submission_id: str, validation_id: str | None
) -> SubmissionRow | Conflict:
    submission = get_submission(tx, submission_id)
    if submission is None or submission.settled or submission.validation_id != validation_id:
        return Conflict(f"submission {submission_id} is not validating under {validation_id}")
    return submission


def _wrong_request(
    tx: Transaction, request: RequestRow, run_id: str | None
) -> SubmitRefused | None:
    """Why no agent output fits ``request`` whatever its state (another run, another kind)."""
    if run_id is not None and run_id != request.run_id:
        return SubmitRefused(
            RequestRunMismatchError(
                f"request {request.request_id} is not a request of run {run_id}"
            )
        )
    if request.kind is not InteractionKind.AGENT:
        return SubmitRefused(
            NotAgentRequestError(
                f"request {request.request_id} is a {request.kind.value}, not an agent request; "
                + requests.command_of_the_other_kind(
                    request, "piwf answer", "answer it with", instead=_decision_answer(tx, request)
                )
            )
        )
    return None


def _decision_answer(tx: Transaction, request: RequestRow) -> str | None:
    """How a protected decision is answered (a choice, and which there are); None for a
    checkpoint, which takes any JSON."""
    if request.kind is not InteractionKind.HUMAN_DECISION:
        return None
    decision = decisions.get_decision(tx, request.request_id)
    if decision is None:
        return None
    answer = '{"choice": "<choice>"}'
    shown = f" (choices: {', '.join(decision.choices)})" if decision.choices else ""
    return f"answer it with: piwf answer {request.request_id} '{answer}'{shown}"


def _refusal(tx: Transaction, request: RequestRow, run_id: str | None) -> SubmitRefused | None:
    """Why the agent request takes no new output now, or None when it is open for one."""
    wrong = _wrong_request(tx, request, run_id)
    if wrong is not None:
        return wrong
    run = runs.load_run(tx, request.run_id)
    if run is not None and run.paused:
        return SubmitRefused(
            RunPausedError(
                f"run {run.run_id} is paused; submissions and updates are refused until it is "
                f"resumed (piwf run resume {run.run_id})"
            )
        )
    if request.status is not InteractionStatus.PENDING:
        return SubmitRefused(RequestNotOpenError(_not_open(tx, request)))
    active = attempts.active_attempt(tx, request.run_id)
    if active is None or active.attempt_id != request.attempt_id:
        return SubmitRefused(
            RequestNotOpenError(
                f"request {request.request_id} belongs to an attempt that is no longer active; "
                f"list the open requests with: piwf requests --run {request.run_id}"
            )
        )
    return None


def _not_open(tx: Transaction, request: RequestRow) -> str:
    """Why a closed agent request takes no output, in the words of how it closed: its
    active-time deadline (``answered_by = expired``, whatever its status became since), an
    accepted submission, or its step's end without one (its attempt failed, for instance after
    its agent command's turns ended with no submission, or was cancelled with its run)."""
    show = f"piwf run show {request.run_id}"
    if request.answered_by is AnsweredBy.EXPIRED:
        return (
            f"request {request.request_id} reached its active-time deadline before an output "
            f"was accepted; its step ended timed_out and takes no output ({show})"
        )
    if request.status is InteractionStatus.ANSWERED or request.status is InteractionStatus.SETTLED:
        return (
            f"request {request.request_id} was already completed by an accepted submission; "
            f"its step took that output ({show})"
        )
    attempt = attempts.get_attempt(tx, request.attempt_id)
    if attempt is not None and attempt.status is AttemptStatus.CANCELLED:
        how = "its step was cancelled with its run"
    elif attempt is not None and attempt.status in (AttemptStatus.FAILED, AttemptStatus.TIMED_OUT):
        how = f"its step ended {attempt.status.value} before an output was accepted"
    else:
        how = f"it is {request.status.value} and its step no longer waits for output"
    return f"request {request.request_id} is closed: {how}; it takes no output ({show})"


def _closed_while_validating(request: RequestRow) -> str:
    return (
        f"request {request.request_id} closed ({request.status.value}) while this output was "
        "being validated; there is nothing left to submit to"
    )


def _one(tx: Transaction, sql: str, params: tuple[object, ...]) -> SubmissionRow | None:
    row = tx.one(sql, params)
    return None if row is None else _submission(row)


def _submission(row: sqlite3.Row) -> SubmissionRow:
    return SubmissionRow(
        submission_id=row["submission_id"],
        request_id=row["request_id"],
        run_id=row["run_id"],
        idempotency_key=row["idempotency_key"],
        payload_hash=bytes(row["payload_hash"]),
        outcome=AgentSubmissionOutcome(row["outcome"]),
        value_hash=_optional_bytes(row["value_hash"]),
        error_hash=_optional_bytes(row["error_hash"]),
        receipt_hash=_optional_bytes(row["receipt_hash"]),
        validation_id=row["validation_id"],
        submitted_at=row["submitted_at"],
        settled_at=row["settled_at"],
    )


def _optional_bytes(value: bytes | None) -> bytes | None:
    return None if value is None else bytes(value)
