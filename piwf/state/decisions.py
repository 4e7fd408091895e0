"""The decision aggregate: ``human_decisions``, their one winner and every submission.

Every checkpoint and protected human decision request gets a decision row (its id is the
request id) in the transaction that commits the request. Competing outcomes race for one row::

    human answer ─────────┐
    client answer ────────┤  (checkpoints only)
    timeout policy ───────┼──▶ INSERT human_decision_resolutions (PK decision_id) = the winner
    explicit cancel ──────┤
    no-default expiry ────┘

A decision's choices are stored as one blob mapping each choice name to its label, or to
``{"label", "input"}`` for a choice that carries a text input (:mod:`piwf.decision_answers`).

The resolution is immutable (a trigger refuses updates). Every candidate is kept in
``human_decision_submissions`` with its outcome: ``won`` (it made the resolution), ``adopted``
(equal to the winner), ``already_resolved`` (another winner exists) or ``rejected`` (invalid,
or a non-human answer to a protected decision).

This module owns the SQL of the three tables and runs inside the caller's write transaction;
it never touches runs or requests. :mod:`piwf.state.execution.answers` composes it with the run
and request rows into the answer, expiry and cancel transitions.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field

from piwf.canonical import JsonValue
from piwf.decision_answers import TextInput, check_decision_answer
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import (
    ACCEPTING_PROVENANCES,
    DecisionKind,
    ResolutionOutcome,
    ResolutionProvenance,
    ResourceType,
    SubmissionOutcome,
    SubmissionSource,
)
from piwf.state.leases import Claim
from piwf.state.records import Actor, ensure_resource, read_revision, record_change

_INSERT_DECISION = """
INSERT INTO human_decisions (decision_id, resource_id, run_id, kind, choices_hash,
                             default_response_hash, deadline_at, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

_SELECT_DECISION = """
SELECT decision_id, resource_id, run_id, kind, choices_hash, default_response_hash, deadline_at,
       created_at
FROM human_decisions
"""

_SELECT_NEWEST_DECISIONS = (
    _SELECT_DECISION + " WHERE run_id = ? ORDER BY created_at DESC, decision_id DESC LIMIT ?"
)

_SELECT_RESOLUTION = """
SELECT decision_id, outcome, provenance, response_hash, reason, actor_type, actor_id, resolved_at
FROM human_decision_resolutions WHERE decision_id = ?
"""

_INSERT_RESOLUTION = """
INSERT INTO human_decision_resolutions (decision_id, outcome, provenance, response_hash, reason,
                                        actor_type, actor_id, resolved_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

_SELECT_SUBMISSIONS = """
SELECT decision_id, submission_id, source, actor_id, candidate_hash, outcome, reason, submitted_at
FROM human_decision_submissions WHERE decision_id = ?
"""

_COUNT_SUBMISSIONS = "SELECT count(*) FROM human_decision_submissions WHERE decision_id = ?"

_INSERT_SUBMISSION = """
INSERT INTO human_decision_submissions (decision_id, submission_id, source, actor_id,
                                        candidate_hash, outcome, reason, submitted_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

# Unresolved decisions whose absolute deadline has passed, oldest deadline first.
_SELECT_DUE = """
SELECT decision_id, resource_id, run_id, kind, choices_hash, default_response_hash, deadline_at,
       created_at
FROM human_decisions
WHERE deadline_at IS NOT NULL AND deadline_at <= ?
  AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r
                  WHERE r.decision_id = human_decisions.decision_id)
ORDER BY deadline_at, decision_id
"""

_SELECT_NEXT_DEADLINE = """
SELECT min(d.deadline_at) FROM human_decisions d
WHERE d.deadline_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)
"""

# Decisions of a run still open (request pending or answered) that nobody has resolved.
_SELECT_UNRESOLVED_OPEN = """
SELECT decision_id, resource_id, run_id, kind, choices_hash, default_response_hash, deadline_at,
       created_at
FROM human_decisions
WHERE run_id = ?
  AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r
                  WHERE r.decision_id = human_decisions.decision_id)
  AND EXISTS (SELECT 1 FROM interactive_requests i
              WHERE i.request_id = human_decisions.decision_id
                AND i.status IN ('pending', 'answered'))
"""

#: The submission id of the one explicit-cancel candidate of a decision.
CANCEL_SUBMISSION_ID = "control:explicit-cancel"


@dataclass(frozen=True)
class Decision:
    """One audited request: its declared choices, saved default and absolute deadline."""

    decision_id: str
    resource_id: str
    run_id: str
    kind: DecisionKind
    choices: dict[str, str] | None
    has_default: bool
    default_response: JsonValue
    deadline_at: int | None
    created_at: int
    #: The choices that carry a text input, each with it (empty for most decisions).
    inputs: Mapping[str, TextInput] = field(default_factory=dict)

    def inputs_json(self) -> dict[str, JsonValue] | None:
        """Return ``{choice: input}`` in wire form, or None when no choice carries one."""
        return {name: item.to_json() for name, item in self.inputs.items()} or None

    @property
    def protected(self) -> bool:
        """True for a protected human decision: only a person or its policy settles it."""
        return self.kind is DecisionKind.HUMAN_DECISION


@dataclass(frozen=True)
class Resolution:
    """The single winner of a decision; ``response_hash`` is the digest of ``response``."""

    decision_id: str
    outcome: ResolutionOutcome
    provenance: ResolutionProvenance
    response: JsonValue
    reason: str | None
    actor_type: str
    actor_id: str | None
    resolved_at: int
    response_hash: bytes | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """Return the wire form (camelCase keys); the actor id is private and left out."""
        return {
            "decisionId": self.decision_id,
            "outcome": self.outcome.value,
            "provenance": self.provenance.value,
            "response": self.response,
            "reason": self.reason,
            "actorType": self.actor_type,
            "resolvedAt": self.resolved_at,
        }


@dataclass(frozen=True)
class Submission:
    """One candidate answer and what became of it; ``candidate_hash`` is its digest."""

    decision_id: str
    submission_id: str
    source: SubmissionSource
    candidate: JsonValue
    outcome: SubmissionOutcome
    reason: str | None
    submitted_at: int
    candidate_hash: bytes | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """Return the wire form (camelCase keys); ids of actors are left out."""
        return {
            "source": self.source.value,
            "outcome": self.outcome.value,
            "response": self.candidate,
            "reason": self.reason,
            "submittedAt": self.submitted_at,
        }


def open_decision_in(
    tx: Transaction,
    *,
    request_id: str,
    run_id: str,
    kind: DecisionKind,
    content: JsonValue,
    on_timeout: JsonValue,
    actor: Actor,
    claim: Claim | None,
) -> Decision:
    """Create the decision of a just-committed request (event ``decision.opened``).

    ``content`` is the request content the engine stored (a decision's ``choices`` map and its
    optional ``inputs`` map are read from it); ``on_timeout`` is ``{"afterMs", "response"?}``
    or None. The deadline is absolute: ``tx.now + afterMs``, so a restart keeps it exact. Runs
    inside the request's transaction.
    """
    resource_id = ensure_resource(tx, ResourceType.DECISION, request_id)
    choices = _stored_choices(content) if kind is DecisionKind.HUMAN_DECISION else None
    deadline_at: int | None = None
    default_hash: bytes | None = None
    if kind is DecisionKind.HUMAN_DECISION and isinstance(on_timeout, Mapping):
        after_ms = on_timeout.get("afterMs")
        if isinstance(after_ms, int) and not isinstance(after_ms, bool) and after_ms > 0:
            deadline_at = tx.now + after_ms
            if "response" in on_timeout:
                default_hash = blobs.put_json(tx, on_timeout["response"])
    choices_hash = None if choices is None else blobs.put_json(tx, choices)
    record_change(
        tx,
        resource_id,
        0,
        "decision.opened",
        actor,
        claim=claim,
        payload={"runId": run_id, "kind": kind.value, "deadlineAt": deadline_at},
    )
    tx.execute(
        _INSERT_DECISION,
        (
            request_id,
            resource_id,
            run_id,
            kind.value,
            choices_hash,
            default_hash,
            deadline_at,
            tx.now,
        ),
    )
    decision = get_decision(tx, request_id)
    assert decision is not None
    return decision


def get_decision(tx: Transaction, decision_id: str) -> Decision | None:
    """Return the decision, or None when the request has none (an agent request)."""
    row = tx.one(_SELECT_DECISION + " WHERE decision_id = ?", (decision_id,))
    return None if row is None else _decision(tx, row)


def list_run_decisions(tx: Transaction, run_id: str, newest: int | None = None) -> list[Decision]:
    """Return every decision of the run, or its ``newest`` latest ones, oldest first."""
    if newest is None:
        rows = tx.all(
            _SELECT_DECISION + " WHERE run_id = ? ORDER BY created_at, decision_id", (run_id,)
        )
    else:
        rows = tx.all(_SELECT_NEWEST_DECISIONS, (run_id, newest))[::-1]
    return [_decision(tx, row) for row in rows]


def count_run_decisions(tx: Transaction, run_id: str) -> int:
    """How many checkpoints and decisions the run has had."""
    return int(tx.scalar("SELECT count(*) FROM human_decisions WHERE run_id = ?", (run_id,)))


def get_resolution(tx: Transaction, decision_id: str) -> Resolution | None:
    """Return the winner of the decision, or None while it is unresolved."""
    row = tx.one(_SELECT_RESOLUTION, (decision_id,))
    if row is None:
        return None
    response_hash = row["response_hash"]
    return Resolution(
        decision_id=row["decision_id"],
        outcome=ResolutionOutcome(row["outcome"]),
        provenance=ResolutionProvenance(row["provenance"]),
        response=None if response_hash is None else blobs.read_json(tx, bytes(response_hash)),
        reason=row["reason"],
        actor_type=row["actor_type"],
        actor_id=row["actor_id"],
        resolved_at=row["resolved_at"],
        response_hash=None if response_hash is None else bytes(response_hash),
    )


def list_submissions(
    tx: Transaction, decision_id: str, newest: int | None = None
) -> list[Submission]:
    """Return every candidate of the decision (or its ``newest`` latest) in submission order."""
    if newest is None:
        rows = tx.all(_SELECT_SUBMISSIONS + " ORDER BY submitted_at, rowid", (decision_id,))
    else:
        latest = " ORDER BY submitted_at DESC, rowid DESC LIMIT ?"
        rows = tx.all(_SELECT_SUBMISSIONS + latest, (decision_id, newest))[::-1]
    return [_submission(tx, row) for row in rows]


def count_submissions(tx: Transaction, decision_id: str) -> int:
    """How many candidates the decision received."""
    return int(tx.scalar(_COUNT_SUBMISSIONS, (decision_id,)))


def get_submission(tx: Transaction, decision_id: str, submission_id: str) -> Submission | None:
    """Return one earlier candidate by its submission id, or None."""
    row = tx.one(_SELECT_SUBMISSIONS + " AND submission_id = ?", (decision_id, submission_id))
    return None if row is None else _submission(tx, row)


def due_decisions(tx: Transaction) -> list[Decision]:
    """Return unresolved decisions whose absolute deadline is at or before ``tx.now``."""
    return [_decision(tx, row) for row in tx.all(_SELECT_DUE, (tx.now,))]


def next_deadline(tx: Transaction) -> int | None:
    """Return the earliest deadline of an unresolved decision, or None when there is none."""
    value = tx.scalar(_SELECT_NEXT_DEADLINE)
    return None if value is None else int(value)


def check_candidate(decision: Decision, response: JsonValue) -> str | None:
    """Return why ``response`` does not fit the declared choices, or None when it does.

    A checkpoint takes any JSON value. A decision's answer is an object whose ``choice`` is one
    of the declared choice names, with the text input that choice carries, if any
    (:func:`piwf.decision_answers.check_decision_answer`, the rule the engine applies too).
    """
    if decision.kind is DecisionKind.CHECKPOINT:
        return None
    return check_decision_answer(tuple(decision.choices or {}), decision.inputs, response)


def resolve_in(
    tx: Transaction,
    decision: Decision,
    *,
    provenance: ResolutionProvenance,
    response: JsonValue = None,
    reason: str | None = None,
    actor: Actor,
    submission_id: str,
    source: SubmissionSource,
) -> Resolution:
    """Insert the winner and its ``won`` submission (event ``decision.resolved``).

    The caller has checked there is no resolution yet in this transaction; the primary key
    refuses a second winner anyway (``sqlite3.IntegrityError`` rolls the caller back). An
    accepting provenance needs ``response``; a cancelling one needs ``reason``.
    """
    accepted = provenance in ACCEPTING_PROVENANCES
    outcome = ResolutionOutcome.ACCEPTED if accepted else ResolutionOutcome.CANCELLED
    response_hash = blobs.put_json(tx, response) if accepted else None
    _record(tx, decision, "decision.resolved", actor, {"provenance": provenance.value})
    tx.execute(
        _INSERT_RESOLUTION,
        (
            decision.decision_id,
            outcome.value,
            provenance.value,
            response_hash,
            None if accepted else reason,
            actor.actor_type.value,
            actor.actor_id,
            tx.now,
        ),
    )
    _insert_submission(
        tx,
        decision,
        submission_id=submission_id,
        source=source,
        actor=actor,
        candidate_hash=response_hash,
        outcome=SubmissionOutcome.WON,
        reason=None,
    )
    resolution = get_resolution(tx, decision.decision_id)
    assert resolution is not None
    return resolution


def record_submission_in(
    tx: Transaction,
    decision: Decision,
    *,
    submission_id: str,
    source: SubmissionSource,
    actor: Actor,
    candidate: JsonValue,
    outcome: SubmissionOutcome,
    reason: str | None = None,
) -> Submission:
    """Keep a candidate that did not win (event ``decision.submission``).

    ``outcome`` is ``adopted``, ``already_resolved`` or ``rejected`` (which needs ``reason``).
    """
    if outcome is SubmissionOutcome.WON:
        raise ValueError("a winning submission is recorded by resolve_in")
    _record(tx, decision, "decision.submission", actor, {"outcome": outcome.value})
    _insert_submission(
        tx,
        decision,
        submission_id=submission_id,
        source=source,
        actor=actor,
        candidate_hash=blobs.put_json(tx, candidate),
        outcome=outcome,
        reason=reason,
    )
    found = get_submission(tx, decision.decision_id, submission_id)
    assert found is not None
    return found


def cancel_unresolved_in(
    tx: Transaction, run_id: str, *, reason: str, actor: Actor
) -> list[Resolution]:
    """Resolve every open, unresolved decision of the run as ``explicit_cancel``.

    Called by the change that closes the run's requests (cancel, terminal finish, a failed
    visit) before it closes them; a decision that already has a winner keeps it.
    """
    return [
        resolve_in(
            tx,
            _decision(tx, row),
            provenance=ResolutionProvenance.EXPLICIT_CANCEL,
            reason=reason,
            actor=actor,
            submission_id=CANCEL_SUBMISSION_ID,
            source=SubmissionSource.CONTROL,
        )
        for row in tx.all(_SELECT_UNRESOLVED_OPEN, (run_id,))
    ]


def _record(
    tx: Transaction, decision: Decision, event_type: str, actor: Actor, payload: object
) -> None:
    revision = read_revision(tx, decision.resource_id)
    assert revision is not None
    record_change(tx, decision.resource_id, revision, event_type, actor, payload=payload)


def _insert_submission(
    tx: Transaction,
    decision: Decision,
    *,
    submission_id: str,
    source: SubmissionSource,
    actor: Actor,
    candidate_hash: bytes | None,
    outcome: SubmissionOutcome,
    reason: str | None,
) -> None:
    tx.execute(
        _INSERT_SUBMISSION,
        (
            decision.decision_id,
            submission_id,
            source.value,
            actor.actor_id,
            candidate_hash,
            outcome.value,
            reason,
            tx.now,
        ),
    )


def _stored_choices(content: JsonValue) -> dict[str, JsonValue]:
    """The choices blob of a request's content: each label, or ``{label, input}``."""
    if not isinstance(content, Mapping):
        return {}
    choices, inputs = content.get("choices"), content.get("inputs")
    if not isinstance(choices, Mapping):
        return {}
    stored: dict[str, JsonValue] = {}
    for name, label in choices.items():
        declared = TextInput.from_json(inputs.get(name)) if isinstance(inputs, Mapping) else None
        stored[str(name)] = (
            str(label) if declared is None else {"label": str(label), "input": declared.to_json()}
        )
    return stored


def _read_choices(stored: JsonValue) -> tuple[dict[str, str], dict[str, TextInput]]:
    """Split a choices blob into labels and the inputs of the choices that carry one."""
    labels: dict[str, str] = {}
    inputs: dict[str, TextInput] = {}
    for name, value in (stored if isinstance(stored, Mapping) else {}).items():
        if isinstance(value, Mapping):
            labels[name] = str(value.get("label"))
            declared = TextInput.from_json(value.get("input"))
            if declared is not None:
                inputs[name] = declared
        else:
            labels[name] = str(value)
    return labels, inputs


def _decision(tx: Transaction, row: sqlite3.Row) -> Decision:
    choices_hash = row["choices_hash"]
    default_hash = row["default_response_hash"]
    labels: dict[str, str] | None = None
    inputs: dict[str, TextInput] = {}
    if choices_hash is not None:
        labels, inputs = _read_choices(blobs.read_json(tx, bytes(choices_hash)))
    return Decision(
        decision_id=row["decision_id"],
        resource_id=row["resource_id"],
        run_id=row["run_id"],
        kind=DecisionKind(row["kind"]),
        choices=labels,
        has_default=default_hash is not None,
        default_response=None if default_hash is None else blobs.read_json(tx, bytes(default_hash)),
        deadline_at=row["deadline_at"],
        created_at=row["created_at"],
        inputs=inputs,
    )


def _submission(tx: Transaction, row: sqlite3.Row) -> Submission:
    candidate_hash = row["candidate_hash"]
    digest = None if candidate_hash is None else bytes(candidate_hash)
    return Submission(
        decision_id=row["decision_id"],
        submission_id=row["submission_id"],
        source=SubmissionSource(row["source"]),
        candidate=None if digest is None else blobs.read_json(tx, digest),
        outcome=SubmissionOutcome(row["outcome"]),
        reason=row["reason"],
        submitted_at=row["submitted_at"],
        candidate_hash=digest,
    )
