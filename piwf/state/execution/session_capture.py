"""Session capture (``session_segments``, ``session_entries``, ``attempt_entries``,
``session_events``): the one module that writes them.

What an origin session reports of a workflow turn is kept with the run, one *segment* per
accepted turn (seed 001: capture starts only after an ``active`` receipt)::

    turn start, active      ─▶ segment recording       event ``turnStart``
    record(entries, events) ─▶ appended in order        an entry id seen before: adopted when
                                                        its kind and content are the same,
                                                        refused otherwise
    turn end, completed     ─▶ complete                 event ``turnEnd``
    turn end, aborted/error/lost (a proved interruption) ─▶ failed, saying how it ended
    the run ends meanwhile  ─▶ still recording          a normal continuation fails nothing:
                                                        the late matching end finishes it
    idle branch, no end     ─▶ failed                   the session proved the turn over

Bounded: a segment keeps at most :data:`MAX_SEGMENT_ENTRIES` entries, :data:`MAX_SEGMENT_EVENTS`
events and :data:`MAX_SEGMENT_BYTES` of content; what arrives beyond is counted as dropped,
never stored. The history stays here: nothing is copied into runner messages or node results.

For an agent step's attempt, ``attempt_entries`` names its ``prompt`` (the captured entry that
holds the step message), its ``response`` (the turn's reported reply entry), and its ``first``
and ``last`` captured entries.

Writers run inside the caller's one change and never commit.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.lifecycle import Conflict
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import AttemptEntryRole, SegmentStatus, TurnStopReason

#: A segment's bounds: entries, events and stored content bytes (entries and event payloads).
MAX_SEGMENT_ENTRIES = 2000
MAX_SEGMENT_EVENTS = 5000
MAX_SEGMENT_BYTES = 8 * 1024 * 1024

_SEGMENT_COLUMNS = """
SELECT s.segment_id, s.run_id, s.attempt_id, a.node_path, s.turn_id, s.session_id, s.status,
       s.entry_count, s.event_count, s.stored_bytes, s.dropped_entries, s.dropped_events,
       s.failure, s.created_at, s.finished_at
FROM session_segments s LEFT JOIN node_attempts a ON a.attempt_id = s.attempt_id
"""

_SELECT_OF_TURN = _SEGMENT_COLUMNS + " WHERE s.turn_id = ?"

_SELECT_OF_RUN = (
    _SEGMENT_COLUMNS
    + " WHERE s.run_id = :run AND (:attempt IS NULL OR s.attempt_id = :attempt)"
    + " ORDER BY s.created_at, s.rowid LIMIT :limit"
)

_COUNT_OF_RUN = """
SELECT count(*) FROM session_segments
WHERE run_id = :run AND (:attempt IS NULL OR attempt_id = :attempt)
"""

_INSERT_SEGMENT = """
INSERT INTO session_segments (segment_id, run_id, attempt_id, turn_id, session_id, status,
                              created_at)
VALUES (?, ?, ?, ?, ?, 'recording', ?)
"""

_FINISH = """
UPDATE session_segments SET status = ?, failure = ?, finished_at = ?
WHERE segment_id = ? AND status = 'recording'
"""

_SELECT_ENTRY = """
SELECT entry_kind, content_hash FROM session_entries WHERE segment_id = ? AND entry_id = ?
"""

_INSERT_ENTRY = """
INSERT INTO session_entries (segment_id, run_id, entry_seq, run_seq, entry_id, entry_kind,
                             content_hash, content_bytes, recorded_at)
VALUES (?, ?, ?, (SELECT coalesce(max(run_seq), 0) + 1 FROM session_entries WHERE run_id = ?),
        ?, ?, ?, ?, ?)
"""

_INSERT_EVENT = """
INSERT INTO session_events (segment_id, run_id, event_seq, run_seq, event_type, tool_call_id,
                            payload_hash, payload_bytes, recorded_at)
VALUES (?, ?, ?, (SELECT coalesce(max(run_seq), 0) + 1 FROM session_events WHERE run_id = ?),
        ?, ?, ?, ?, ?)
"""

_COUNT_ENTRY = """
UPDATE session_segments SET entry_count = entry_count + 1, stored_bytes = stored_bytes + ?
WHERE segment_id = ?
"""

_COUNT_EVENT = """
UPDATE session_segments SET event_count = event_count + 1, stored_bytes = stored_bytes + ?
WHERE segment_id = ?
"""

_DROP = """
UPDATE session_segments SET dropped_entries = dropped_entries + ?,
                            dropped_events = dropped_events + ?
WHERE segment_id = ?
"""

_SET_ROLE = """
INSERT INTO attempt_entries (attempt_id, role, segment_id, entry_id) VALUES (?, ?, ?, ?)
ON CONFLICT (attempt_id, role) DO UPDATE
SET segment_id = excluded.segment_id, entry_id = excluded.entry_id
"""

_SET_FIRST = """
INSERT INTO attempt_entries (attempt_id, role, segment_id, entry_id) VALUES (?, 'first', ?, ?)
ON CONFLICT (attempt_id, role) DO NOTHING
"""

_PROMPT_ENTRY = """
SELECT m.entry_id FROM workflow_turns t JOIN workflow_messages m ON m.message_id = t.message_id
WHERE t.turn_id = ?
"""

_RESPONSE_ENTRY = "SELECT response_entry_id FROM workflow_turns WHERE turn_id = ?"

_IDLE_UNFINISHED = """
SELECT s.segment_id FROM session_segments s JOIN workflow_turns t ON t.turn_id = s.turn_id
WHERE s.session_id = ? AND s.status = 'recording' AND t.state = 'ended'
"""

_SELECT_ENTRIES = """
SELECT entry_seq, run_seq, entry_id, entry_kind, content_hash, content_bytes, recorded_at
FROM session_entries WHERE segment_id = ? AND entry_seq > ? ORDER BY entry_seq LIMIT ?
"""

_SELECT_EVENTS = """
SELECT event_seq, run_seq, event_type, tool_call_id, payload_hash, payload_bytes, recorded_at
FROM session_events WHERE segment_id = ? AND event_seq > ? ORDER BY event_seq LIMIT ?
"""

_SELECT_ROLES = "SELECT role, segment_id, entry_id FROM attempt_entries WHERE attempt_id = ?"


@dataclass(frozen=True)
class SegmentRow:
    """One captured turn of a run."""

    segment_id: str
    run_id: str
    attempt_id: str | None
    node_path: str | None
    turn_id: str
    session_id: str
    status: SegmentStatus
    entry_count: int
    event_count: int
    stored_bytes: int
    dropped_entries: int
    dropped_events: int
    failure: str | None
    created_at: int
    finished_at: int | None


@dataclass(frozen=True)
class CapturedEntry:
    """One conversation entry as a session reports it: its own id, a kind (``user``,
    ``assistant``, ``toolResult``, ... as the host names them), its content, and optionally its
    role for the attempt (``prompt`` or ``response``)."""

    entry_id: str
    kind: str
    content: JsonValue
    role: AttemptEntryRole | None = None


@dataclass(frozen=True)
class CapturedEvent:
    """One session event: its type (``toolCall``, ``toolResult``, ...), the tool call it
    belongs to, if any, and its payload."""

    event_type: str
    payload: JsonValue
    tool_call_id: str | None = None


@dataclass(frozen=True)
class RecordOutcome:
    """What one report did to a segment."""

    segment: SegmentRow
    stored_entries: int
    adopted_entries: int
    stored_events: int
    dropped_entries: int
    dropped_events: int


@dataclass(frozen=True)
class StoredEntry:
    """A captured entry as read back (content as a blob digest)."""

    entry_seq: int
    run_seq: int
    entry_id: str
    kind: str
    content_hash: bytes
    content_bytes: int
    recorded_at: int


@dataclass(frozen=True)
class StoredEvent:
    """A captured event as read back (payload as a blob digest)."""

    event_seq: int
    run_seq: int
    event_type: str
    tool_call_id: str | None
    payload_hash: bytes
    payload_bytes: int
    recorded_at: int


def open_segment(
    tx: Transaction, *, turn_id: str, run_id: str, session_id: str, attempt_id: str | None
) -> SegmentRow:
    """Start recording an accepted turn (a repeat returns the turn's segment)."""
    found = segment_of_turn(tx, turn_id)
    if found is not None:
        return found
    segment_id = f"segment-{secrets.token_hex(10)}"
    tx.execute(_INSERT_SEGMENT, (segment_id, run_id, attempt_id, turn_id, session_id, tx.now))
    opened = segment_of_turn(tx, turn_id)
    assert opened is not None
    _event(tx, opened, CapturedEvent("turnStart", {"turnId": turn_id}))
    return opened


def segment_of_turn(tx: Transaction, turn_id: str) -> SegmentRow | None:
    """Return the segment of a turn, or None (a turn never accepted records nothing)."""
    row = tx.one(_SELECT_OF_TURN, (turn_id,))
    return None if row is None else _segment(row)


def record(
    tx: Transaction,
    segment: SegmentRow,
    entries: Sequence[CapturedEntry],
    events: Sequence[CapturedEvent],
) -> RecordOutcome | Conflict:
    """Append ``entries`` then ``events`` to a segment (module docstring); a conflicting
    repeat of an entry id, or anything new for a finished segment, is a Conflict and the
    caller's change stores nothing."""
    refused = _refusal(tx, segment, entries, events)
    if refused is not None:
        return refused
    stored = adopted = stored_events = dropped = dropped_events = 0
    prompt_entry = tx.scalar(_PROMPT_ENTRY, (segment.turn_id,))
    for entry in entries:
        if tx.one(_SELECT_ENTRY, (segment.segment_id, entry.entry_id)) is not None:
            adopted += 1
            continue
        encoded = canonical.encode(entry.content)
        current = _reload(tx, segment)
        if (
            current.entry_count >= MAX_SEGMENT_ENTRIES
            or current.stored_bytes + len(encoded) > MAX_SEGMENT_BYTES
        ):
            dropped += 1
            continue
        tx.execute(
            _INSERT_ENTRY,
            (
                segment.segment_id,
                segment.run_id,
                current.entry_count + 1,
                segment.run_id,
                entry.entry_id,
                entry.kind,
                blobs.put_json(tx, entry.content),
                len(encoded),
                tx.now,
            ),
        )
        tx.execute(_COUNT_ENTRY, (len(encoded), segment.segment_id))
        stored += 1
        _name_roles(tx, segment, entry, prompt_entry)
    for event in events:
        if not _event(tx, _reload(tx, segment), event):
            dropped_events += 1
            continue
        stored_events += 1
    if dropped or dropped_events:
        tx.execute(_DROP, (dropped, dropped_events, segment.segment_id))
    return RecordOutcome(
        segment=_reload(tx, segment),
        stored_entries=stored,
        adopted_entries=adopted,
        stored_events=stored_events,
        dropped_entries=dropped,
        dropped_events=dropped_events,
    )


def _refusal(
    tx: Transaction,
    segment: SegmentRow,
    entries: Sequence[CapturedEntry],
    events: Sequence[CapturedEvent],
) -> Conflict | None:
    """Why the report cannot be stored at all (checked before anything is written): an entry
    id repeated with another kind or content, or something new for a finished segment."""
    batch: dict[str, tuple[str, bytes]] = {}
    new = bool(events)
    for entry in entries:
        identity = (entry.kind, hashlib.sha256(canonical.encode(entry.content)).digest())
        seen = tx.one(_SELECT_ENTRY, (segment.segment_id, entry.entry_id))
        earlier = (str(seen[0]), bytes(seen[1])) if seen is not None else batch.get(entry.entry_id)
        if earlier is not None and earlier != identity:
            return Conflict(
                f"entry {entry.entry_id} was recorded before with other content; an entry id"
                " names one entry of the conversation"
            )
        new = new or seen is None
        batch[entry.entry_id] = identity
    if new and segment.status is not SegmentStatus.RECORDING:
        return _finished(segment)
    return None


def finish_segment(tx: Transaction, turn_id: str, stop_reason: TurnStopReason) -> None:
    """The turn's end was reported (or proved): complete its segment, or fail it when the
    end proved an interruption; the reply entry becomes the attempt's ``response``."""
    segment = segment_of_turn(tx, turn_id)
    if segment is None or segment.status is not SegmentStatus.RECORDING:
        return
    _event(tx, segment, CapturedEvent("turnEnd", {"stopReason": stop_reason.value}), force=True)
    response = tx.scalar(_RESPONSE_ENTRY, (turn_id,))
    if segment.attempt_id is not None and response is not None:
        held = tx.one(_SELECT_ENTRY, (segment.segment_id, str(response)))
        if held is not None:
            tx.execute(
                _SET_ROLE,
                (segment.attempt_id, AttemptEntryRole.RESPONSE.value, segment.segment_id, response),
            )
    if stop_reason is TurnStopReason.COMPLETED:
        tx.execute(_FINISH, (SegmentStatus.COMPLETE.value, None, tx.now, segment.segment_id))
    else:
        failure = f"the turn ended {stop_reason.value}"
        tx.execute(_FINISH, (SegmentStatus.FAILED.value, failure, tx.now, segment.segment_id))


def settle_idle(tx: Transaction, session_id: str) -> int:
    """An idle session has no turn running: a segment still recording whose turn the run's
    end already closed will get no end report, so it fails. Returns how many did."""
    failure = "the session went idle without reporting the turn's end"
    rows = tx.all(_IDLE_UNFINISHED, (session_id,))
    for row in rows:
        tx.execute(_FINISH, (SegmentStatus.FAILED.value, failure, tx.now, str(row[0])))
    return len(rows)


def segments_of_run(
    tx: Transaction, run_id: str, *, attempt_id: str | None = None, limit: int = 500
) -> tuple[list[SegmentRow], int]:
    """Return a run's segments in capture order (at most ``limit``) and how many it has."""
    params = {"run": run_id, "attempt": attempt_id, "limit": limit}
    rows = tx.all(_SELECT_OF_RUN, params)
    total = int(tx.scalar(_COUNT_OF_RUN, params) or 0)
    return [_segment(row) for row in rows], total


def entries_of(tx: Transaction, segment_id: str, *, after: int, limit: int) -> list[StoredEntry]:
    """Return a segment's entries after ``entry_seq`` ``after`` (at most ``limit``)."""
    return [
        StoredEntry(
            entry_seq=int(row[0]),
            run_seq=int(row[1]),
            entry_id=str(row[2]),
            kind=str(row[3]),
            content_hash=bytes(row[4]),
            content_bytes=int(row[5]),
            recorded_at=int(row[6]),
        )
        for row in tx.all(_SELECT_ENTRIES, (segment_id, after, limit))
    ]


def events_of(tx: Transaction, segment_id: str, *, after: int, limit: int) -> list[StoredEvent]:
    """Return a segment's events after ``event_seq`` ``after`` (at most ``limit``)."""
    return [
        StoredEvent(
            event_seq=int(row[0]),
            run_seq=int(row[1]),
            event_type=str(row[2]),
            tool_call_id=None if row[3] is None else str(row[3]),
            payload_hash=bytes(row[4]),
            payload_bytes=int(row[5]),
            recorded_at=int(row[6]),
        )
        for row in tx.all(_SELECT_EVENTS, (segment_id, after, limit))
    ]


def attempt_roles(tx: Transaction, attempt_id: str) -> dict[AttemptEntryRole, tuple[str, str]]:
    """Return role -> (segment id, entry id) of a node attempt's captured entries."""
    return {
        AttemptEntryRole(row[0]): (str(row[1]), str(row[2]))
        for row in tx.all(_SELECT_ROLES, (attempt_id,))
    }


def _name_roles(
    tx: Transaction, segment: SegmentRow, entry: CapturedEntry, prompt_entry: object
) -> None:
    if segment.attempt_id is None:
        return
    key = (segment.segment_id, entry.entry_id)
    tx.execute(_SET_FIRST, (segment.attempt_id, *key))
    tx.execute(_SET_ROLE, (segment.attempt_id, AttemptEntryRole.LAST.value, *key))
    role = entry.role
    if role is None and prompt_entry is not None and str(prompt_entry) == entry.entry_id:
        role = AttemptEntryRole.PROMPT
    if role in (AttemptEntryRole.PROMPT, AttemptEntryRole.RESPONSE):
        tx.execute(_SET_ROLE, (segment.attempt_id, role.value, *key))


def _event(
    tx: Transaction, segment: SegmentRow, event: CapturedEvent, *, force: bool = False
) -> bool:
    """Append one event unless the bounds are reached (``force``: the server's own
    ``turnEnd`` is always kept). Returns whether it was stored."""
    encoded = canonical.encode(event.payload)
    over = (
        segment.event_count >= MAX_SEGMENT_EVENTS
        or segment.stored_bytes + len(encoded) > MAX_SEGMENT_BYTES
    )
    if over and not force:
        return False
    tx.execute(
        _INSERT_EVENT,
        (
            segment.segment_id,
            segment.run_id,
            segment.event_count + 1,
            segment.run_id,
            event.event_type,
            event.tool_call_id,
            blobs.put_json(tx, event.payload),
            len(encoded),
            tx.now,
        ),
    )
    tx.execute(_COUNT_EVENT, (len(encoded), segment.segment_id))
    return True


def _finished(segment: SegmentRow) -> Conflict:
    return Conflict(
        f"the capture of turn {segment.turn_id} is {segment.status.value}: record a turn's"
        " entries and events before you report its end"
    )


def _reload(tx: Transaction, segment: SegmentRow) -> SegmentRow:
    found = segment_of_turn(tx, segment.turn_id)
    assert found is not None
    return found


def _segment(row: sqlite3.Row) -> SegmentRow:
    return SegmentRow(
        segment_id=str(row[0]),
        run_id=str(row[1]),
        attempt_id=None if row[2] is None else str(row[2]),
        node_path=None if row[3] is None else str(row[3]),
        turn_id=str(row[4]),
        session_id=str(row[5]),
        status=SegmentStatus(row[6]),
        entry_count=int(row[7]),
        event_count=int(row[8]),
        stored_bytes=int(row[9]),
        dropped_entries=int(row[10]),
        dropped_events=int(row[11]),
        failure=None if row[12] is None else str(row[12]),
        created_at=int(row[13]),
        finished_at=None if row[14] is None else int(row[14]),
    )
