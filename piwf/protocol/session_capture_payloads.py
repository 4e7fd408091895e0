"""Payloads of session capture: what an origin session reports of a workflow turn, and reading
it back (docs/SESSIONS.md, "Session capture")::

    sessionCapture.record  durable, from the active coordinator epoch: entries and events of an
                           accepted turn (``workflowTurn.report`` gave it ``active``); entries
                           are the conversation's own (its entry ids), events have no id and are
                           kept once per idempotency key
    sessionCapture.read    a run's captured turns (segments, in order) and, for one segment,
                           a page of its entries and events

Entry contents and event payloads are JSON values of at most :data:`MAX_CAPTURED_VALUE_BYTES`
(canonical encoding); in a read they travel inline up to 16 KiB, beyond by content reference.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from piwf.protocol.payloads import ContentRef, WireModel
from piwf.protocol.session_payloads import RECORD_ID_PATTERN as _MESSAGE_ID
from piwf.protocol.session_payloads import SESSION_ID_PATTERN as _SESSION_ID

#: The largest entry content or event payload one report may carry (canonical JSON bytes).
MAX_CAPTURED_VALUE_BYTES = 256 * 1024
#: Entries, and events, one report may carry at most.
MAX_RECORDED_ITEMS = 200
#: Entries, and events, one read returns at most.
MAX_READ_ITEMS = 500
#: Segments one read lists at most (``totalSegments`` says how many there are).
MAX_READ_SEGMENTS = 500
#: Event types the server records itself; a session may not report them.
SERVER_EVENT_TYPES = frozenset({"turnStart", "turnEnd"})

_NAME = r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$"

SegmentStatus = Literal["recording", "complete", "failed"]


class CapturedEntry(WireModel):
    """One conversation entry: the conversation's own id for it, its kind as the host names
    it (``user``, ``assistant``, ``toolResult``, ...), its content, and optionally its role
    for the step (``prompt``: it holds the step message; ``response``: the reply)."""

    entry_id: str = Field(pattern=_MESSAGE_ID)
    kind: str = Field(pattern=_NAME)
    content: Any = None
    role: Literal["prompt", "response"] | None = None


class CapturedEvent(WireModel):
    """One session event: its type (``toolCall``, ``toolResult``, ...), the tool call it
    belongs to, and its payload."""

    event_type: str = Field(pattern=_NAME)
    payload: Any = None
    tool_call_id: str | None = Field(default=None, pattern=_MESSAGE_ID)


class CaptureRecordPayload(WireModel):
    """``sessionCapture.record``: entries and events of turn ``turn_id``, in order."""

    session_id: str = Field(min_length=1, max_length=128, pattern=_SESSION_ID)
    coordinator_epoch: str = Field(min_length=1, max_length=256)
    turn_id: str = Field(pattern=_MESSAGE_ID)
    entries: list[CapturedEntry] = Field(default_factory=list, max_length=MAX_RECORDED_ITEMS)
    events: list[CapturedEvent] = Field(default_factory=list, max_length=MAX_RECORDED_ITEMS)


class CaptureRecordReceipt(WireModel):
    """What a report did: new entries stored, repeats adopted, events stored, and what the
    segment's bounds dropped; the segment's counts after it."""

    segment_id: str
    turn_id: str
    status: SegmentStatus
    stored_entries: int
    adopted_entries: int
    stored_events: int
    dropped_entries: int
    dropped_events: int
    entry_count: int
    event_count: int


class CaptureReadPayload(WireModel):
    """``sessionCapture.read``: a run's segments (those of one node attempt with
    ``attemptId``) and, with ``segmentId``, its entries after ``afterEntry`` and events after
    ``afterEvent`` (at most ``limit`` of each)."""

    run_id: str = Field(pattern=_MESSAGE_ID)
    attempt_id: str | None = Field(default=None, pattern=_MESSAGE_ID)
    segment_id: str | None = Field(default=None, pattern=_MESSAGE_ID)
    after_entry: int = Field(default=0, ge=0)
    after_event: int = Field(default=0, ge=0)
    limit: int = Field(default=MAX_READ_ITEMS, ge=1, le=MAX_READ_ITEMS)


class SegmentInfo(WireModel):
    """One captured turn: the attempt and node it worked on (none for a terminal or follow-up
    message's turn), its state, its counts and what its bounds dropped, and which of its
    entries were the attempt's ``prompt``, ``response``, ``first`` and ``last`` (role -> entry
    id)."""

    segment_id: str
    run_id: str
    attempt_id: str | None = None
    node_path: str | None = None
    turn_id: str
    session_id: str
    status: SegmentStatus
    entry_count: int
    event_count: int
    stored_bytes: int
    dropped_entries: int
    dropped_events: int
    failure: str | None = None
    roles: dict[str, str] = Field(default_factory=dict)
    created_at: int
    finished_at: int | None = None


class CapturedEntryInfo(WireModel):
    """A captured entry as read back (``entrySeq`` in its segment, ``runSeq`` in its run)."""

    entry_seq: int
    run_seq: int
    entry_id: str
    kind: str
    content: Any = None
    content_ref: ContentRef | None = None
    content_bytes: int
    recorded_at: int


class CapturedEventInfo(WireModel):
    """A captured event as read back."""

    event_seq: int
    run_seq: int
    event_type: str
    tool_call_id: str | None = None
    payload: Any = None
    payload_ref: ContentRef | None = None
    payload_bytes: int
    recorded_at: int


class RunCapture(WireModel):
    """Receipt of ``sessionCapture.read``: the segments, and the asked-for segment's page."""

    run_id: str
    segments: list[SegmentInfo]
    total_segments: int
    segment_id: str | None = None
    entries: list[CapturedEntryInfo] = Field(default_factory=list)
    events: list[CapturedEventInfo] = Field(default_factory=list)
    more_entries: bool = False
    more_events: bool = False
