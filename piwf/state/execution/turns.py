"""Workflow turns (``workflow_turns``): the one module that writes them.

A session reports each model turn it runs on a sent workflow message: its exact start and end
(seed 001, "Origin-session activity"). The server alone decides whether the turn is workflow
work; the receipt's ``ownership`` says so::

    start on an open message   ─▶ started (active)     an older open turn of the session ends
                                                        ``lost`` first (one turn at a time)
    start on a closed message  ─▶ nothing (absent)     not workflow work
    end of a started turn      ─▶ ended (settled)      the rules below, in the same change
    a repeat                   ─▶ the saved turn        another stop reason: refused

A message is **open** for a turn while: a step, its request pending and its run not paused or
finished; a terminal or follow-up message, until its first turn ended. Decisions and
notifications never open a turn.

The end of a turn on a step whose request is still pending:

- ``completed`` with the turn's visible reply, on an assistant-message step: the reply (at most
  its ``maxChars``) is submitted as the output and validated like any submission; not counted.
- ``aborted``: the run is paused (pending step messages withdrawn with it); not counted.
- ``completed``, ``error``, ``lost``: counted as unproductive when the run is not paused and
  no submission is validating. The first two counted ends each present one ``reminder`` step;
  the third answers the request ``unproductive`` (a control claim, the run made eligible): the
  next runner fails the visit ``missingSubmission`` and follows a ``$result.outcome`` route.

An open turn of an agent step keeps its attempt's active-time interval open (the deadline
counts only while the session works on it). A server restart closes no turn: the session
reports the same started turn again (its interval reopens).

An accepted turn records its session capture (:mod:`piwf.state.execution.session_capture`): the
segment opens with the ``active`` receipt and finishes with the reported end. When the run
ends while a turn is open, the run's terminal change ends the turn ``lost``
(``ended_by_run``) but leaves its capture recording; the session's late end report adopts
that end and finishes the capture.

Writers run inside the caller's one change and never commit.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal

from piwf.lifecycle import AnsweredBy, Conflict, InteractionKind, RunStatus
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import (
    FailureClass,
    MessageKind,
    MessageStatus,
    OwnerType,
    QueueStatus,
    TurnState,
    TurnStopReason,
)
from piwf.state.execution import (
    active_time,
    control,
    messages,
    queue,
    requests,
    runs,
    session_capture,
    submissions,
)
from piwf.state.execution.core import record_run_change, take_run_authority
from piwf.state.leases import release_claim
from piwf.state.records import Actor

#: Counted unproductive ends that each present a reminder; one more fails the visit.
REMINDERS = 2

Ownership = Literal["active", "settled", "absent"]

_COLUMNS = """
SELECT turn_id, message_id, run_id, session_id, state, stop_reason, response_entry_id,
       counted, started_at, ended_at, ended_by_run
FROM workflow_turns
"""

_SELECT_ONE = _COLUMNS + " WHERE turn_id = ?"

_SELECT_OPEN_OF_SESSION = _COLUMNS + " WHERE session_id = ? AND state = 'started'"

_INSERT = """
INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, state, started_at)
VALUES (?, ?, ?, ?, 'started', ?)
"""

_END = """
UPDATE workflow_turns
SET state = 'ended', stop_reason = ?, response_entry_id = ?, counted = ?, ended_at = ?
WHERE turn_id = ? AND state = 'started'
"""

_END_OF_RUN = """
UPDATE workflow_turns SET state = 'ended', stop_reason = 'lost', ended_by_run = 1, ended_at = ?
WHERE run_id = ? AND state = 'started'
RETURNING turn_id, message_id
"""

_SET_RESPONSE_ENTRY = """
UPDATE workflow_turns SET response_entry_id = ? WHERE turn_id = ? AND response_entry_id IS NULL
"""

_COUNT_ENDED_OF_MESSAGE = (
    "SELECT count(*) FROM workflow_turns WHERE message_id = ? AND state = 'ended'"
)

_COUNT_UNPRODUCTIVE = """
SELECT count(*) FROM workflow_turns t JOIN workflow_messages m ON m.message_id = t.message_id
WHERE m.kind = 'step' AND m.source_id = ? AND t.counted = 1
"""

_VALIDATING = """
SELECT EXISTS (SELECT 1 FROM interactive_submissions
               WHERE request_id = ? AND outcome = 'validating')
"""


@dataclass(frozen=True)
class TurnRow:
    """One workflow turn."""

    turn_id: str
    message_id: str
    run_id: str
    session_id: str
    state: TurnState
    stop_reason: TurnStopReason | None
    response_entry_id: str | None
    counted: bool
    started_at: int
    ended_at: int | None
    #: Ended ``lost`` by its run's terminal change (a late end report adopts it).
    ended_by_run: bool = False


@dataclass(frozen=True)
class TurnReceipt:
    """What the server decided about a reported turn (``turn``: the saved one, if any)."""

    ownership: Ownership
    turn: TurnRow | None
    #: Messages this report made (reminders), and whether it paused or failed the step.
    reminded: str | None = None
    paused: bool = False
    gave_up: bool = False
    #: The submission an assistant-message reply became (its validation is to be started).
    submission_id: str | None = None
    #: Why an assistant-message reply was not taken (too long, refused).
    refusal: str | None = None


def get_turn(tx: Transaction, turn_id: str) -> TurnRow | None:
    """Return one turn, or None."""
    row = tx.one(_SELECT_ONE, (turn_id,))
    return None if row is None else _turn(row)


def start_turn(
    tx: Transaction,
    *,
    session_id: str,
    turn_id: str,
    message_id: str,
    run_id: str,
    actor: Actor,
    control_owner_id: str,
    lease_ms: int,
) -> TurnReceipt | Conflict:
    """Record a turn's start on ``message_id`` when the message is open (module docstring)."""
    existing = get_turn(tx, turn_id)
    if existing is not None:
        if (existing.session_id, existing.message_id, existing.run_id) != (
            session_id,
            message_id,
            run_id,
        ):
            return Conflict(f"turn {turn_id} was started on another message")
        if existing.state is TurnState.STARTED:
            _reopen_interval(tx, existing)
            _open_capture(tx, existing)
            return TurnReceipt("active", existing)
        return TurnReceipt("settled", existing)
    message = messages.get_message(tx, message_id)
    if message is None or message.session_id != session_id or message.run_id != run_id:
        return Conflict(f"message {message_id} is not a message of session {session_id}")
    if message.status is not MessageStatus.SENT or not _open(tx, message):
        return TurnReceipt("absent", None)
    for older in tx.all(_SELECT_OPEN_OF_SESSION, (session_id,)):
        _end(tx, _turn(older), TurnStopReason.LOST, None, actor, control_owner_id, lease_ms)
    tx.execute(_INSERT, (turn_id, message_id, run_id, session_id, tx.now))
    started = get_turn(tx, turn_id)
    assert started is not None
    _reopen_interval(tx, started)
    _open_capture(tx, started)
    return TurnReceipt("active", started)


def end_turn(
    tx: Transaction,
    *,
    session_id: str,
    turn_id: str,
    stop_reason: TurnStopReason,
    response_entry_id: str | None,
    actor: Actor,
    control_owner_id: str,
    lease_ms: int,
    response_text: str | None = None,
) -> TurnReceipt | Conflict:
    """Record a turn's end and apply its rules (module docstring); a repeat adopts.
    ``response_text``: the turn's visible reply (an assistant-message step's output)."""
    existing = get_turn(tx, turn_id)
    if existing is None:
        return TurnReceipt("absent", None)
    if existing.session_id != session_id:
        return Conflict(f"turn {turn_id} is not a turn of session {session_id}")
    if existing.state is TurnState.ENDED:
        if existing.ended_by_run:  # the run ended first: this end adopts that end
            if response_entry_id is not None:
                tx.execute(_SET_RESPONSE_ENTRY, (response_entry_id, turn_id))
            session_capture.finish_segment(tx, turn_id, stop_reason)
            return TurnReceipt("settled", get_turn(tx, turn_id))
        if existing.stop_reason is stop_reason:
            return TurnReceipt("settled", existing)
        reason = "?" if existing.stop_reason is None else existing.stop_reason.value
        return Conflict(f"turn {turn_id} already ended {reason}")
    return _end(
        tx,
        existing,
        stop_reason,
        response_entry_id,
        actor,
        control_owner_id,
        lease_ms,
        response_text,
    )


def end_open_turns_lost(
    tx: Transaction, session_id: str, *, actor: Actor, control_owner_id: str, lease_ms: int
) -> list[TurnReceipt]:
    """An idle session proves its open turn over: end it ``lost`` (branch report, idle), and
    fail the capture of a turn its run's end closed whose end was never reported."""
    ended = [
        _end(tx, _turn(row), TurnStopReason.LOST, None, actor, control_owner_id, lease_ms)
        for row in tx.all(_SELECT_OPEN_OF_SESSION, (session_id,))
    ]
    session_capture.settle_idle(tx, session_id)
    return ended


def end_turns_of_run(tx: Transaction, run_id: str) -> int:
    """A run became terminal: its open turns end ``lost`` in the same change (no rule applies
    to a finished run), their active time stops; their capture keeps recording until the
    session reports the end. Returns how many ended."""
    closed = tx.all(_END_OF_RUN, (tx.now, run_id))
    for row in closed:
        message = messages.get_message(tx, str(row[1]))
        if message is not None and message.kind is MessageKind.STEP:
            request = requests.get_request(tx, message.source_id)
            if request is not None:
                active_time.close_interval(tx, request.attempt_id)
    return len(closed)


def _end(
    tx: Transaction,
    turn: TurnRow,
    stop_reason: TurnStopReason,
    response_entry_id: str | None,
    actor: Actor,
    control_owner_id: str,
    lease_ms: int,
    response_text: str | None = None,
) -> TurnReceipt:
    message = messages.get_message(tx, turn.message_id)
    assert message is not None  # a turn's message goes only with its run
    request = (
        requests.get_request(tx, message.source_id) if message.kind is MessageKind.STEP else None
    )
    pending = request is not None and request.status.value == "pending"
    run = runs.require_run(tx, turn.run_id)
    submitted, refusal = None, None
    if (
        request is not None
        and pending
        and stop_reason is TurnStopReason.COMPLETED
        and response_text is not None
        and not run.paused
        and not run.terminal
    ):
        submitted, refusal = _submit_reply(tx, turn, request, response_text)
    counted = (
        pending
        and stop_reason is not TurnStopReason.ABORTED
        and not run.paused
        and not run.terminal
        and not bool(tx.scalar(_VALIDATING, (message.source_id,)))
    )
    tx.execute(_END, (stop_reason.value, response_entry_id, int(counted), tx.now, turn.turn_id))
    session_capture.finish_segment(tx, turn.turn_id, stop_reason)
    if request is not None:
        active_time.close_interval(tx, request.attempt_id)
    ended = get_turn(tx, turn.turn_id)
    if submitted is not None:
        return TurnReceipt("settled", ended, submission_id=submitted)
    if request is None or not pending or run.terminal:
        return TurnReceipt("settled", ended)
    if stop_reason is TurnStopReason.ABORTED:
        paused = control.pause_run(
            tx, run.run_id, actor=actor, control_owner_id=control_owner_id, lease_ms=lease_ms
        )
        return TurnReceipt("settled", ended, paused=not isinstance(paused, Conflict))
    if not counted:
        return TurnReceipt("settled", ended)
    unproductive = int(tx.scalar(_COUNT_UNPRODUCTIVE, (request.request_id,)))
    if unproductive <= REMINDERS:
        content = blobs.read_json(tx, request.content_hash)
        reminder = messages.remind(tx, run.run_id, request.request_id, request.kind, content)
        return TurnReceipt(
            "settled",
            ended,
            reminded=None if reminder is None else reminder.message_id,
            refusal=refusal,
        )
    given_up = _give_up(tx, run, request.request_id, actor, control_owner_id, lease_ms)
    return TurnReceipt("settled", ended, gave_up=given_up, refusal=refusal)


def _submit_reply(
    tx: Transaction, turn: TurnRow, request: requests.RequestRow, text: str
) -> tuple[str | None, str | None]:
    """An assistant-message step takes the turn's visible reply as its output: submit it
    (validated like any submission; the turn id is its idempotency key). Returns the new
    submission's id, or why the reply was refused; (None, None) for any other step."""
    content = blobs.read_json(tx, request.content_hash)
    assistant = content.get("assistantMessage") if isinstance(content, dict) else None
    limit = assistant.get("maxChars") if isinstance(assistant, dict) else None
    if not isinstance(limit, int):
        return None, None
    if len(text) > limit:
        return None, f"the reply has {len(text)} characters; this step takes at most {limit}"
    found = submissions.submit(
        tx, request.request_id, text, idempotency_key=f"turn:{turn.turn_id}", run_id=turn.run_id
    )
    if isinstance(found, submissions.SubmitRefused):
        return None, str(found.error)
    if found is None or not found.created:
        return None, None
    return found.submission.submission_id, None


def _give_up(
    tx: Transaction,
    run: runs.RunRow,
    request_id: str,
    actor: Actor,
    control_owner_id: str,
    lease_ms: int,
) -> bool:
    """Answer the request ``unproductive`` and make the run eligible (as an expiry does)."""
    if run.queue_status is not QueueStatus.PARKED:
        return False
    authority = take_run_authority(
        tx,
        run,
        claim=None,
        owner_type=OwnerType.CONTROL,
        owner_id=control_owner_id,
        lease_ms=lease_ms,
    )
    if isinstance(authority, Conflict):
        return False
    payload = {"requestId": request_id, "unproductiveTurns": REMINDERS + 1}
    record_run_change(tx, run, "interaction.unproductive", actor, authority, payload)
    requests.answer(
        tx, request_id, answer_hash=blobs.put_json(tx, None), answered_by=AnsweredBy.UNPRODUCTIVE
    )
    if run.status is RunStatus.WAITING:
        runs.resume_waiting(tx, run.run_id)
    error_code = None if run.error_code is None else FailureClass(run.error_code)
    queue.set_queue(tx, run.run_id, QueueStatus.PARKED, error_code=error_code, available_now=True)
    release_claim(tx, authority)
    return True


def _open(tx: Transaction, message: messages.MessageRow) -> bool:
    """Whether a turn may start on ``message`` now (module docstring)."""
    if message.kind in (MessageKind.TERMINAL, MessageKind.FOLLOW_UP):
        return int(tx.scalar(_COUNT_ENDED_OF_MESSAGE, (message.message_id,))) == 0
    if message.kind is not MessageKind.STEP:
        return False
    request = requests.get_request(tx, message.source_id)
    run = runs.load_run(tx, message.run_id)
    return (
        request is not None
        and request.status.value == "pending"
        and run is not None
        and not run.paused
        and not run.terminal
    )


def _open_capture(tx: Transaction, turn: TurnRow) -> None:
    """An accepted turn records its capture; a step's turn records for its attempt."""
    message = messages.get_message(tx, turn.message_id)
    request = (
        requests.get_request(tx, message.source_id)
        if message is not None and message.kind is MessageKind.STEP
        else None
    )
    session_capture.open_segment(
        tx,
        turn_id=turn.turn_id,
        run_id=turn.run_id,
        session_id=turn.session_id,
        attempt_id=None if request is None else request.attempt_id,
    )


def _reopen_interval(tx: Transaction, turn: TurnRow) -> None:
    """An open turn of an agent step counts its attempt's active time."""
    message = messages.get_message(tx, turn.message_id)
    if message is None or message.kind is not MessageKind.STEP:
        return
    request = requests.get_request(tx, message.source_id)
    if request is not None and request.kind is InteractionKind.AGENT:
        active_time.open_interval(tx, request.attempt_id)


def _turn(row: sqlite3.Row) -> TurnRow:
    return TurnRow(
        turn_id=str(row[0]),
        message_id=str(row[1]),
        run_id=str(row[2]),
        session_id=str(row[3]),
        state=TurnState(row[4]),
        stop_reason=None if row[5] is None else TurnStopReason(row[5]),
        response_entry_id=None if row[6] is None else str(row[6]),
        counted=bool(row[7]),
        started_at=int(row[8]),
        ended_at=None if row[9] is None else int(row[9]),
        ended_by_run=bool(row[10]),
    )
