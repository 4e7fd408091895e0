"""Payloads of the origin-session operations (docs/SESSIONS.md).

An interactive run is bound to an origin session (``run.start`` with ``session``). The
session's conversation is filled by one coordinator at a time::

    session.attach      this connection becomes the session's coordinator: a new epoch; the
                        previous coordinator's epoch is fenced (its reports are refused)
    session.view        the session's messages (a bounded window in session order, their
                        complete count) and, for the active epoch only, the next one to send
    session.list        the sessions runs were bound to
    followUp.queue      durable: a prompt to show once the run completed and its terminal
                        message (and every earlier follow-up) was shown and its turn ended
    followUp.remove     durable: withdraw a follow-up not shown yet
    workflowTurn.report durable: a model turn's exact start or end on a sent message (the
                        server decides whether it is workflow work: ``ownership``)
    workflowMessage.reportBranch
                        durable: what the conversation holds (message id -> entry id for the
                        messages found, the ids searched for and not found, whether the
                        session is idle with no pending input); evidence marks messages sent,
                        a lost presentation is made again (once)

A report proves facts only about the messages it names: a message it does not name, and a
pending message reported absent, stay as they are.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from piwf.protocol.payloads import ContentRef, WireModel

_SESSION_ID = r"^[A-Za-z0-9_.:@-]+$"
_SESSION_ID_RULE = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")


def session_id_problem(value: object) -> str | None:
    """What is wrong with a session id, or None (1-128 letters, digits and ``_.:@-``)."""
    if isinstance(value, str) and _SESSION_ID_RULE.fullmatch(value):
        return None
    return "a session id is 1 to 128 characters: letters, digits and _ . : @ -"


_MESSAGE_ID = r"^[\x21-\x7e]{1,256}$"

#: The patterns of a session id and of a record id (a message, turn, run or entry id), for the
#: payload modules that extend this one.
SESSION_ID_PATTERN = _SESSION_ID
RECORD_ID_PATTERN = _MESSAGE_ID

#: Messages one session view carries at most (the count says how many there are).
MAX_WINDOW_MESSAGES = 200
#: Entries one branch report may name at most.
MAX_REPORTED_MESSAGES = 500

MessageKind = Literal["step", "decision", "notification", "terminal", "followUp"]
MessageState = Literal["pending", "sent", "cancelled"]


class SessionAttachPayload(WireModel):
    """``session.attach``: make this connection the coordinator of ``session_id``."""

    session_id: str = Field(min_length=1, max_length=128, pattern=_SESSION_ID)


class SessionAttachReceipt(WireModel):
    """The epoch this connection holds until it closes or another attach replaces it."""

    session_id: str
    coordinator_epoch: str
    #: True when another connection held the session and was fenced.
    replaced: bool


class SessionViewPayload(WireModel):
    """``session.view``: the session's messages; with the active epoch, the next to send."""

    session_id: str = Field(min_length=1, max_length=128, pattern=_SESSION_ID)
    coordinator_epoch: str | None = Field(default=None, max_length=256)


class WorkflowMessageInfo(WireModel):
    """One workflow message: what it presents, where it is in the session, its state."""

    message_id: str
    run_id: str
    kind: MessageKind
    #: A step's reason: ``initial``, ``reminder`` or ``resumed``.
    reason: str | None = None
    #: The record it presents: a request id, a notification id, the run id (terminal).
    source_id: str
    order: int
    state: MessageState
    #: The conversation entry that holds it, once branch evidence named one.
    entry_id: str | None = None
    content: Any = None
    content_ref: ContentRef | None = None
    created_at: int


class SessionView(WireModel):
    """The session as its coordinator needs it, from one read."""

    session_id: str
    #: The unfinished run that reserves the session, if any.
    active_run_id: str | None = None
    #: How many runs were ever bound to the session (0: no run has used it).
    runs: int = 0
    #: Whether some connection holds the session's coordinator epoch now.
    coordinated: bool
    #: Whether the ``coordinatorEpoch`` sent is the active one.
    active_epoch: bool
    messages: list[WorkflowMessageInfo] = Field(default_factory=list)
    total: int = 0
    #: The message to send next (the active epoch only; None: nothing is eligible).
    next_message_id: str | None = None


class BranchEntry(WireModel):
    """A message found in the conversation, and the entry that holds it."""

    message_id: str = Field(pattern=_MESSAGE_ID)
    entry_id: str = Field(min_length=1, max_length=256)


class ReportBranchPayload(WireModel):
    """``workflowMessage.reportBranch``: the conversation's evidence, from the active epoch."""

    session_id: str = Field(min_length=1, max_length=128, pattern=_SESSION_ID)
    coordinator_epoch: str = Field(min_length=1, max_length=256)
    found: list[BranchEntry] = Field(default_factory=list, max_length=MAX_REPORTED_MESSAGES)
    #: Messages searched for in the conversation and not found there.
    missing: list[str] = Field(default_factory=list, max_length=MAX_REPORTED_MESSAGES)
    #: The session is idle and has no pending input (absence is usable only then).
    idle: bool = False


class ReportBranchReceipt(WireModel):
    """What the report changed: messages now ``sent``, and the presentations made again."""

    session_id: str
    sent: list[str] = Field(default_factory=list)
    presented_again: list[str] = Field(default_factory=list)


TurnStopReason = Literal["completed", "aborted", "error", "lost"]


class TurnReportPayload(WireModel):
    """``workflowTurn.report``: one model turn's start (``stopReason`` absent) or end, from the
    active epoch, on a sent workflow message."""

    session_id: str = Field(min_length=1, max_length=128, pattern=_SESSION_ID)
    coordinator_epoch: str = Field(min_length=1, max_length=256)
    turn_id: str = Field(pattern=_MESSAGE_ID)
    message_id: str = Field(pattern=_MESSAGE_ID)
    run_id: str = Field(pattern=_MESSAGE_ID)
    phase: Literal["start", "end"]
    stop_reason: TurnStopReason | None = None
    #: The conversation entry of the turn's reply, if it has one.
    response_entry_id: str | None = Field(default=None, min_length=1, max_length=256)
    #: The turn's visible reply: the output of an assistant-message step (ignored otherwise).
    response_text: str | None = Field(default=None, max_length=65536)


class TurnInfo(WireModel):
    """A saved workflow turn."""

    turn_id: str
    message_id: str
    run_id: str
    state: Literal["started", "ended"]
    stop_reason: TurnStopReason | None = None
    response_entry_id: str | None = None
    started_at: int
    ended_at: int | None = None


class TurnReceipt(WireModel):
    """``active``: the turn is workflow work now; ``settled``: it ended (its rules applied);
    ``absent``: not workflow work (a closed message, or an end of a turn never started)."""

    ownership: Literal["active", "settled", "absent"]
    turn: TurnInfo | None = None
    #: A reminder step this end presented, whether it paused the run (an abort), whether it
    #: gave the step up (the third unproductive end: the visit fails ``missingSubmission``).
    reminder_message_id: str | None = None
    paused: bool = False
    gave_up: bool = False
    #: An assistant-message step's reply became this submission (validated like any).
    submission_id: str | None = None
    #: Why an assistant-message reply was not taken (the step stays pending).
    refusal: str | None = None


#: A follow-up prompt's size limit (characters).
MAX_FOLLOW_UP_CHARS = 16 * 1024


class FollowUpQueuePayload(WireModel):
    """``followUp.queue``: a prompt to follow the session's run once it completed."""

    session_id: str = Field(min_length=1, max_length=128, pattern=_SESSION_ID)
    run_id: str = Field(pattern=_MESSAGE_ID)
    prompt: str = Field(min_length=1, max_length=MAX_FOLLOW_UP_CHARS)


class FollowUpRemovePayload(WireModel):
    """``followUp.remove``: withdraw a follow-up that was not shown yet."""

    session_id: str = Field(min_length=1, max_length=128, pattern=_SESSION_ID)
    message_id: str = Field(pattern=_MESSAGE_ID)


class FollowUpReceipt(WireModel):
    """The follow-up's message and its state (``pending`` queued, ``cancelled`` removed)."""

    message_id: str
    run_id: str
    state: MessageState


class SessionListPayload(WireModel):
    """``session.list``: the sessions runs were bound to, most recently used first."""

    limit: int = Field(default=50, ge=1, le=500)


class SessionInfo(WireModel):
    """One session: its runs, the run that reserves it, its pending messages."""

    session_id: str
    runs: int
    active_run_id: str | None = None
    pending_messages: int
    coordinated: bool
    last_run_at: int


class SessionList(WireModel):
    """Receipt of ``session.list``."""

    sessions: list[SessionInfo]
