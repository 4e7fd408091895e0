"""Workflow messages (``workflow_messages``): the one module that writes them.

An interactive run's conversation is the server's to fill: every message the origin session
must show is a row here, created in the same transaction as the fact it presents, and sent
by the session's one coordinator in session order::

    request opened (agent, checkpoint) ──▶ step (initial)       ┐
    request opened (human decision)    ──▶ decision             │ pending ─branch evidence─▶ sent
    run resumed with its request open  ──▶ step (resumed)       │    │
    a sent step or decision missing    ──▶ step (resumed) /     │    └─ its source closed, the
      from the reported branch              decision            │       run paused or ended ─▶
    notify node finished               ──▶ notification         │       cancelled
    run terminal                       ──▶ terminal             ┘

A message leaves ``pending`` only two ways: its source stops needing it (``cancelled``) or
branch evidence names the conversation entry that holds it (``sent``; evidence adopts a
cancelled message too, since it proves the send). Nothing here guesses that a message was
sent: a coordinator that dies after sending leaves it pending until a branch report adopts it.

**Eligibility** (what :func:`next_eligible` may name): the lowest-ordered pending message of
the session whose source still wants it: a step or decision whose request is still pending (a
step also needs its run not paused), and any notification or terminal message. An ineligible
pending message does not block later eligible ones.

Writers run inside the caller's one change and never commit; they do nothing for a headless run.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.lifecycle import InteractionKind
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import MessageKind, MessageStatus, StepReason

_SELECT_SESSION = (
    "SELECT origin_session_id FROM run_bindings WHERE run_id = ? AND execution_mode = 'interactive'"
)

_SELECT_HOLDER = """
SELECT b.run_id FROM run_bindings b JOIN runs r ON r.run_id = b.run_id
WHERE b.origin_session_id = ? AND r.finished_at IS NULL AND b.run_id != ?
ORDER BY b.created_at LIMIT 1
"""

_COUNT_SESSION_RUNS = "SELECT count(*) FROM run_bindings WHERE origin_session_id = ?"

_NEXT_ORDER = (
    "SELECT coalesce(max(order_number), 0) + 1 FROM workflow_messages WHERE session_id = ?"
)

_INSERT = """
INSERT INTO workflow_messages (message_id, run_id, session_id, kind, reason, source_id,
                               content_hash, order_number, status, entry_id, created_at,
                               updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, ?, ?)
"""

_COLUMNS = """
SELECT message_id, run_id, session_id, kind, reason, source_id, content_hash, order_number,
       status, entry_id, created_at, updated_at
FROM workflow_messages
"""

_SELECT_ONE = _COLUMNS + " WHERE message_id = ?"

_SELECT_PENDING_STEP = _COLUMNS + " WHERE kind = 'step' AND source_id = ? AND status = 'pending'"

_SELECT_PENDING_OF_SOURCE = _COLUMNS + " WHERE kind = ? AND source_id = ? AND status = 'pending'"

_CANCEL_OF_SOURCE = """
UPDATE workflow_messages SET status = 'cancelled', updated_at = ?
WHERE source_id = ? AND status = 'pending' AND kind IN ('step', 'decision')
"""

_CANCEL_STEPS_OF_RUN = """
UPDATE workflow_messages SET status = 'cancelled', updated_at = ?
WHERE run_id = ? AND status = 'pending' AND kind = 'step'
"""

_CANCEL_OPEN_OF_RUN = """
UPDATE workflow_messages SET status = 'cancelled', updated_at = ?
WHERE run_id = ? AND status = 'pending' AND kind IN ('step', 'decision')
"""

_SELECT_RUN_STATUS = "SELECT status FROM runs WHERE run_id = ?"

_CANCEL_FOLLOW_UPS_OF_RUN = """
UPDATE workflow_messages SET status = 'cancelled', updated_at = ?
WHERE run_id = ? AND status = 'pending' AND kind = 'followUp'
"""

_CANCEL_FOLLOW_UP = """
UPDATE workflow_messages SET status = 'cancelled', updated_at = ?
WHERE message_id = ? AND kind = 'followUp' AND status = 'pending'
"""

_MARK_SENT = """
UPDATE workflow_messages SET status = 'sent', entry_id = ?, updated_at = ?
WHERE message_id = ? AND status IN ('pending', 'cancelled')
"""

# A session's window: every message of a run still unfinished, and every message still pending.
_WINDOW = """
SELECT message_id, run_id, session_id, kind, reason, source_id, content_hash, order_number,
       status, entry_id, created_at, updated_at
FROM workflow_messages
WHERE session_id = :session AND (
  status = 'pending'
  OR run_id IN (SELECT run_id FROM runs WHERE finished_at IS NULL))
ORDER BY order_number LIMIT :limit
"""

_WINDOW_COUNT = """
SELECT count(*) FROM workflow_messages
WHERE session_id = :session AND (
  status = 'pending'
  OR run_id IN (SELECT run_id FROM runs WHERE finished_at IS NULL))
"""

# The eligibility rule of the module docstring, in SQL.
_NEXT_ELIGIBLE = """
SELECT message_id, run_id, session_id, kind, reason, source_id, content_hash, order_number,
       status, entry_id, created_at, updated_at
FROM workflow_messages
WHERE session_id = :session AND status = 'pending' AND (
  kind IN ('notification', 'terminal')
  OR (kind IN ('step', 'decision') AND EXISTS (
        SELECT 1 FROM interactive_requests i JOIN runs r ON r.run_id = i.run_id
        WHERE i.request_id = workflow_messages.source_id AND i.status = 'pending'
          AND r.finished_at IS NULL AND (workflow_messages.kind = 'decision' OR r.paused = 0)))
  OR (kind = 'followUp'
      AND NOT EXISTS (SELECT 1 FROM run_bindings b JOIN runs r ON r.run_id = b.run_id
                      WHERE b.origin_session_id = :session AND r.finished_at IS NULL)
      AND NOT EXISTS (SELECT 1 FROM workflow_messages e
                      WHERE e.session_id = :session
                        AND (e.kind = 'terminal' AND e.run_id = workflow_messages.run_id
                             OR e.kind = 'followUp'
                                AND e.order_number < workflow_messages.order_number)
                        AND (e.status = 'pending'
                             OR EXISTS (SELECT 1 FROM workflow_turns t
                                        WHERE t.message_id = e.message_id
                                          AND t.state = 'started')))
      AND EXISTS (SELECT 1 FROM workflow_messages f
                  WHERE f.run_id = workflow_messages.run_id AND f.kind = 'terminal')))
ORDER BY order_number LIMIT 1
"""

_SELECT_OPEN_SOURCE = """
SELECT i.request_id, i.kind, i.content_hash, r.paused FROM interactive_requests i
JOIN runs r ON r.run_id = i.run_id
WHERE i.request_id = ? AND i.status = 'pending' AND r.finished_at IS NULL
"""

_SELECT_SESSIONS = """
SELECT b.origin_session_id,
       count(*) AS runs,
       (SELECT r2.run_id FROM run_bindings b2 JOIN runs r2 ON r2.run_id = b2.run_id
        WHERE b2.origin_session_id = b.origin_session_id AND r2.finished_at IS NULL
        LIMIT 1) AS active_run,
       (SELECT count(*) FROM workflow_messages m
        WHERE m.session_id = b.origin_session_id AND m.status = 'pending') AS pending,
       max(b.created_at) AS last_run_at
FROM run_bindings b
WHERE b.origin_session_id IS NOT NULL
GROUP BY b.origin_session_id
ORDER BY last_run_at DESC
LIMIT ?
"""

#: A terminal message carries the run's output up to this size (encoded); a larger one stays
#: with the run only (``outputBytes`` says how large it is).
MAX_INLINE_OUTPUT_BYTES = 16 * 1024

#: The kinds a lost presentation is made again for.
_PRESENTABLE = (MessageKind.STEP, MessageKind.DECISION)

#: The kinds of request each message presents.
_KIND_OF_REQUEST = {
    InteractionKind.AGENT: MessageKind.STEP,
    InteractionKind.CHECKPOINT: MessageKind.STEP,
    InteractionKind.HUMAN_DECISION: MessageKind.DECISION,
}


@dataclass(frozen=True)
class MessageRow:
    """One workflow message; ``content_hash`` names its JSON content."""

    message_id: str
    run_id: str
    session_id: str
    kind: MessageKind
    reason: StepReason | None
    source_id: str
    content_hash: bytes
    order_number: int
    status: MessageStatus
    entry_id: str | None
    created_at: int
    updated_at: int


@dataclass(frozen=True)
class SessionRow:
    """One origin session as the bindings know it."""

    session_id: str
    runs: int
    active_run_id: str | None
    pending_messages: int
    last_run_at: int


# Binding ------------------------------------------------------------------------------------


def session_of(tx: Transaction, run_id: str) -> str | None:
    """Return the origin session of an interactive run, None for a headless one."""
    found = tx.scalar(_SELECT_SESSION, (run_id,))
    return None if found is None else str(found)


def session_holder(tx: Transaction, session_id: str, *, besides: str = "") -> str | None:
    """Return the unfinished interactive run that reserves ``session_id`` (other than
    ``besides``), or None: a run reserves its session from its start until it is terminal."""
    found = tx.scalar(_SELECT_HOLDER, (session_id, besides))
    return None if found is None else str(found)


def session_run_count(tx: Transaction, session_id: str) -> int:
    """Return how many runs were ever bound to ``session_id`` (0: no run has used it)."""
    return int(tx.scalar(_COUNT_SESSION_RUNS, (session_id,)) or 0)


# Writers ------------------------------------------------------------------------------------


def request_opened(
    tx: Transaction, run_id: str, request_id: str, kind: InteractionKind, content: JsonValue
) -> MessageRow | None:
    """Present a request that just opened: a step (``initial``) or a decision message."""
    session = session_of(tx, run_id)
    message_kind = _KIND_OF_REQUEST.get(kind)
    if session is None or message_kind is None:
        return None
    reason = StepReason.INITIAL if message_kind is MessageKind.STEP else None
    body = _request_content(request_id, kind, content, reason)
    return _insert(tx, run_id, session, message_kind, request_id, body, reason)


def present_again(
    tx: Transaction, run_id: str, request_id: str, kind: InteractionKind, content: JsonValue
) -> MessageRow | None:
    """Present an open request once more (after a resume, or when the reported branch lost
    it): one ``resumed`` step or one decision; a pending one of that source is kept instead."""
    return _present(tx, run_id, request_id, kind, content, StepReason.RESUMED)


def remind(
    tx: Transaction, run_id: str, request_id: str, kind: InteractionKind, content: JsonValue
) -> MessageRow | None:
    """Present a still-pending step as a ``reminder`` (a turn ended without a submission); a
    pending step of that request is kept instead."""
    return _present(tx, run_id, request_id, kind, content, StepReason.REMINDER)


def _present(
    tx: Transaction,
    run_id: str,
    request_id: str,
    kind: InteractionKind,
    content: JsonValue,
    step_reason: StepReason,
) -> MessageRow | None:
    session = session_of(tx, run_id)
    message_kind = _KIND_OF_REQUEST.get(kind)
    if session is None or message_kind is None:
        return None
    pending = tx.one(_SELECT_PENDING_OF_SOURCE, (message_kind.value, request_id))
    if pending is not None:
        return _message(pending)
    reason = step_reason if message_kind is MessageKind.STEP else None
    body = _request_content(request_id, kind, content, reason)
    return _insert(tx, run_id, session, message_kind, request_id, body, reason)


def notified(
    tx: Transaction, run_id: str, notification_id: str, notify_kind: str, message: str
) -> MessageRow | None:
    """Present a notify node's notification (in the transaction of its node result)."""
    session = session_of(tx, run_id)
    if session is None:
        return None
    body: JsonValue = {
        "kind": MessageKind.NOTIFICATION.value,
        "runId": run_id,
        "notificationId": notification_id,
        "notifyKind": notify_kind,
        "message": message,
    }
    return _insert(tx, run_id, session, MessageKind.NOTIFICATION, notification_id, body, None)


def run_ended(
    tx: Transaction,
    run_id: str,
    status: str,
    *,
    output: JsonValue = None,
    error: str | None = None,
) -> MessageRow | None:
    """Close the conversation side of a terminal run: pending step and decision messages are
    cancelled and one terminal message carries the outcome (in the terminal transaction)."""
    session = session_of(tx, run_id)
    if session is None:
        return None
    tx.execute(_CANCEL_OPEN_OF_RUN, (tx.now, run_id))
    if status != "completed":  # a failed or cancelled run's follow-ups have nothing to follow
        tx.execute(_CANCEL_FOLLOW_UPS_OF_RUN, (tx.now, run_id))
    body: dict[str, JsonValue] = {
        "kind": MessageKind.TERMINAL.value,
        "runId": run_id,
        "status": status,
        "error": error,
    }
    encoded = len(canonical.encode(output))
    if encoded <= MAX_INLINE_OUTPUT_BYTES:
        body["output"] = output
    else:  # the run keeps it: run.get reads it (by content reference)
        body["outputBytes"] = encoded
    return _insert(tx, run_id, session, MessageKind.TERMINAL, run_id, body, None)


def queue_follow_up(tx: Transaction, run_id: str, prompt: str) -> MessageRow | str:
    """Queue a prompt to follow an interactive run; the error text when it cannot.

    It becomes eligible once the run completed, its terminal message was shown and any turn on
    it ended, every earlier follow-up of the session likewise, and no unfinished run holds the
    session. A failed or cancelled run cancels its pending follow-ups.
    """
    session = session_of(tx, run_id)
    if session is None:
        return f"run {run_id} is headless: only an interactive run has follow-ups"
    status = tx.scalar(_SELECT_RUN_STATUS, (run_id,))
    if status in ("failed", "timed_out", "cancelled"):
        return f"run {run_id} ended {status}: a follow-up follows only a run that completes"
    body: JsonValue = {"kind": MessageKind.FOLLOW_UP.value, "runId": run_id, "prompt": prompt}
    source = f"followup-{secrets.token_hex(10)}"
    return _insert(tx, run_id, session, MessageKind.FOLLOW_UP, source, body, None)


def remove_follow_up(tx: Transaction, message_id: str) -> bool:
    """Cancel a pending follow-up; False when it is not one (sent, cancelled, another kind)."""
    return tx.execute(_CANCEL_FOLLOW_UP, (tx.now, message_id)).rowcount == 1


def source_closed(tx: Transaction, request_id: str) -> None:
    """The request stopped being pending (answered, accepted, settled, cancelled, timed out):
    its pending step and decision messages are cancelled."""
    tx.execute(_CANCEL_OF_SOURCE, (tx.now, request_id))


def run_paused(tx: Transaction, run_id: str) -> None:
    """A pause cancels the run's pending step messages (a decision stays presentable)."""
    tx.execute(_CANCEL_STEPS_OF_RUN, (tx.now, run_id))


def mark_sent(tx: Transaction, message_id: str, entry_id: str) -> bool:
    """Record branch evidence: the message is in the conversation as ``entry_id``.

    A pending or cancelled message becomes ``sent``; returns False when it was ``sent``
    already (the caller compares entry ids).
    """
    return tx.execute(_MARK_SENT, (entry_id, tx.now, message_id)).rowcount == 1


@dataclass(frozen=True)
class BranchOutcome:
    """What one branch report changed (message ids)."""

    sent: list[str]
    presented_again: list[str]


class NotInSessionError(LookupError):
    """A branch report named a message that is not one of its session's."""


def apply_branch_report(
    tx: Transaction,
    session_id: str,
    found: Sequence[tuple[str, str]],
    missing: Sequence[str],
    *,
    idle: bool,
) -> BranchOutcome:
    """Apply the conversation's evidence (seed 001, with the original's later correction: a
    report proves facts only about the messages it names).

    ``found`` (message id, entry id): a pending or cancelled message becomes ``sent`` with that
    entry; a sent one keeps its first entry. ``missing``, used only when the session is
    ``idle`` with no pending input: a *sent* step or decision whose request is still pending
    (a step: its run not paused) is presented once more, unless a pending message of that
    source exists; a *pending* message reported missing proves nothing (it was not sent yet).
    Raises :class:`NotInSessionError` before changing anything when a named message is not
    the session's.
    """
    named = [message_id for message_id, _ in found] + list(missing)
    rows = {message_id: get_message(tx, message_id) for message_id in named}
    strangers = [mid for mid, row in rows.items() if row is None or row.session_id != session_id]
    if strangers:
        raise NotInSessionError(strangers[0])
    sent = [message_id for message_id, entry_id in found if mark_sent(tx, message_id, entry_id)]
    again: list[str] = []
    if idle:
        for message_id in missing:
            row = rows[message_id]
            assert row is not None
            if row.status is not MessageStatus.SENT or row.kind not in _PRESENTABLE:
                continue
            request = tx.one(_SELECT_OPEN_SOURCE, (row.source_id,))
            if request is None or (row.kind is MessageKind.STEP and request[3]):
                continue
            content = blobs.read_json(tx, bytes(request[2]))
            made = present_again(
                tx, row.run_id, row.source_id, InteractionKind(request[1]), content
            )
            if made is not None and made.message_id not in again:
                again.append(made.message_id)
    return BranchOutcome(sent=sent, presented_again=again)


# Readers ------------------------------------------------------------------------------------


def get_message(tx: Transaction, message_id: str) -> MessageRow | None:
    """Return one message, or None."""
    row = tx.one(_SELECT_ONE, (message_id,))
    return None if row is None else _message(row)


def pending_step(tx: Transaction, request_id: str) -> MessageRow | None:
    """Return the pending step message of a request, or None."""
    row = tx.one(_SELECT_PENDING_STEP, (request_id,))
    return None if row is None else _message(row)


def window(tx: Transaction, session_id: str, limit: int) -> tuple[list[MessageRow], int]:
    """The session's messages a coordinator needs, in order (at most ``limit``), and their
    complete count: every message of an unfinished run and every pending message."""
    params = {"session": session_id, "limit": limit}
    rows = tx.all(_WINDOW, params)
    return [_message(row) for row in rows], int(tx.scalar(_WINDOW_COUNT, params) or 0)


def next_eligible(tx: Transaction, session_id: str) -> MessageRow | None:
    """Return the message the session's coordinator should send next, or None."""
    row = tx.one(_NEXT_ELIGIBLE, {"session": session_id})
    return None if row is None else _message(row)


def list_sessions(tx: Transaction, limit: int) -> list[SessionRow]:
    """Every session a run was bound to, most recently used first (at most ``limit``)."""
    return [
        SessionRow(
            session_id=str(row[0]),
            runs=int(row[1]),
            active_run_id=None if row[2] is None else str(row[2]),
            pending_messages=int(row[3]),
            last_run_at=int(row[4]),
        )
        for row in tx.all(_SELECT_SESSIONS, (limit,))
    ]


# Helpers ------------------------------------------------------------------------------------


def _request_content(
    request_id: str, kind: InteractionKind, content: JsonValue, reason: StepReason | None
) -> JsonValue:
    body: dict[str, JsonValue] = {
        "kind": (MessageKind.STEP if reason is not None else MessageKind.DECISION).value,
        "requestId": request_id,
        "requestKind": kind.value,
        "request": content,
    }
    if reason is not None:
        body["reason"] = reason.value
    return body


def _insert(
    tx: Transaction,
    run_id: str,
    session_id: str,
    kind: MessageKind,
    source_id: str,
    content: JsonValue,
    reason: StepReason | None,
) -> MessageRow:
    message_id = f"message-{secrets.token_hex(10)}"
    order = int(tx.scalar(_NEXT_ORDER, (session_id,)))
    tx.execute(
        _INSERT,
        (
            message_id,
            run_id,
            session_id,
            kind.value,
            None if reason is None else reason.value,
            source_id,
            blobs.put_json(tx, content),
            order,
            tx.now,
            tx.now,
        ),
    )
    found = get_message(tx, message_id)
    assert found is not None
    return found


def _message(row: sqlite3.Row) -> MessageRow:
    return MessageRow(
        message_id=str(row[0]),
        run_id=str(row[1]),
        session_id=str(row[2]),
        kind=MessageKind(row[3]),
        reason=None if row[4] is None else StepReason(row[4]),
        source_id=str(row[5]),
        content_hash=bytes(row[6]),
        order_number=int(row[7]),
        status=MessageStatus(row[8]),
        entry_id=None if row[9] is None else str(row[9]),
        created_at=int(row[10]),
        updated_at=int(row[11]),
    )
