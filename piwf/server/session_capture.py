"""The session capture operations: ``sessionCapture.record`` and ``sessionCapture.read``.

A record comes from the session's active coordinator epoch only (answered before the command
runs otherwise, so nothing is stored) and names an accepted turn; its entries and events are
checked (size, canonical JSON, no server event type) before the change, which stores all of
them or, on a conflicting repeat or a finished segment, nothing. A read is one snapshot: the
run's segments, and one segment's page of entries and events, each value inline up to 16 KiB
or by content reference (the run's readers may read it).
"""

from __future__ import annotations

from piwf import canonical
from piwf.errors import CanonicalJsonError, SessionError
from piwf.lifecycle import Conflict
from piwf.protocol.client_v1 import Request
from piwf.protocol.session_capture_payloads import (
    MAX_CAPTURED_VALUE_BYTES,
    MAX_READ_SEGMENTS,
    SERVER_EVENT_TYPES,
    CapturedEntryInfo,
    CapturedEventInfo,
    CaptureReadPayload,
    CaptureRecordPayload,
    CaptureRecordReceipt,
    RunCapture,
    SegmentInfo,
)
from piwf.server.commands import CommandResult
from piwf.server.content_offer import ContentOffer
from piwf.server.context import ServerContext
from piwf.server.loop import Reply
from piwf.server.replies import InvalidPayloadError, error_response, not_found, ok, payload_of
from piwf.server.sessions import not_the_coordinator
from piwf.state import Transaction
from piwf.state.enums import AttemptEntryRole
from piwf.state.execution import runs, session_capture
from piwf.state.execution.session_capture import CapturedEntry, CapturedEvent, SegmentRow


class CaptureHandlers:
    """Answers the capture operations from the store."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context

    def record(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, CaptureRecordPayload)
        session_id = payload.session_id
        if not self.context.coordinators.is_active(session_id, payload.coordinator_epoch):
            error = not_the_coordinator(session_id, payload.coordinator_epoch)
            reply(error_response(request, "rejected", error.code, str(error)))
            return
        entries = [
            CapturedEntry(
                entry_id=entry.entry_id,
                kind=entry.kind,
                content=_checked(entry.content, f"entries[{index}].content"),
                role=None if entry.role is None else AttemptEntryRole(entry.role),
            )
            for index, entry in enumerate(payload.entries)
        ]
        events = []
        for index, event in enumerate(payload.events):
            if event.event_type in SERVER_EVENT_TYPES:
                raise InvalidPayloadError(
                    f"events[{index}].eventType: {event.event_type} is recorded by the server"
                    " itself (from workflowTurn.report); report the turn's start and end there"
                )
            content = _checked(event.payload, f"events[{index}].payload")
            events.append(CapturedEvent(event.event_type, content, event.tool_call_id))

        def change(tx: Transaction) -> CommandResult:
            segment = session_capture.segment_of_turn(tx, payload.turn_id)
            if segment is None or segment.session_id != session_id:
                missing = SessionError(
                    f"turn {payload.turn_id} is not an accepted turn of session {session_id}:"
                    " capture starts when workflowTurn.report answers ownership active"
                )
                return CommandResult.failed("notFound", missing)
            outcome = session_capture.record(tx, segment, entries, events)
            if isinstance(outcome, Conflict):
                return CommandResult.failed("conflict", SessionError(outcome.evidence))
            saved = outcome.segment
            receipt = CaptureRecordReceipt(
                segment_id=saved.segment_id,
                turn_id=saved.turn_id,
                status=saved.status.value,
                stored_entries=outcome.stored_entries,
                adopted_entries=outcome.adopted_entries,
                stored_events=outcome.stored_events,
                dropped_entries=outcome.dropped_entries,
                dropped_events=outcome.dropped_events,
                entry_count=saved.entry_count,
                event_count=saved.event_count,
            )
            return CommandResult.accepted(receipt.to_wire(), run_id=saved.run_id)

        reply(self.context.commands.execute(request, change))

    def read(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, CaptureReadPayload)
        run_id = payload.run_id
        with self.context.db.read() as tx:
            if runs.load_run(tx, run_id) is None:
                reply(not_found(request, run_id, self.context.home))
                return
            rows, total = session_capture.segments_of_run(
                tx, run_id, attempt_id=payload.attempt_id, limit=MAX_READ_SEGMENTS
            )
            segments = [_segment_info(tx, row) for row in rows]
            capture_view = RunCapture(run_id=run_id, segments=segments, total_segments=total)
            if payload.segment_id is not None:
                chosen = [row for row in rows if row.segment_id == payload.segment_id]
                if not chosen:
                    unknown = f"run {run_id} has no captured segment {payload.segment_id}"
                    reply(error_response(request, "notFound", SessionError.code, unknown))
                    return
                capture_view = _with_page(tx, capture_view, chosen[0], payload)
        reply(ok(request, capture_view))


def _with_page(
    tx: Transaction, view: RunCapture, segment: SegmentRow, payload: CaptureReadPayload
) -> RunCapture:
    """``view`` with one page of ``segment``'s entries and events (one more of each is read
    to tell whether more follow)."""
    offer = ContentOffer(tx)
    limit = payload.limit
    entries = session_capture.entries_of(
        tx, segment.segment_id, after=payload.after_entry, limit=limit + 1
    )
    events = session_capture.events_of(
        tx, segment.segment_id, after=payload.after_event, limit=limit + 1
    )
    entry_infos = []
    for entry in entries[:limit]:
        content = offer.json("run", segment.run_id, entry.content_hash)
        entry_infos.append(
            CapturedEntryInfo(
                entry_seq=entry.entry_seq,
                run_seq=entry.run_seq,
                entry_id=entry.entry_id,
                kind=entry.kind,
                content=content.value,
                content_ref=content.ref,
                content_bytes=entry.content_bytes,
                recorded_at=entry.recorded_at,
            )
        )
    event_infos = []
    for event in events[:limit]:
        carried = offer.json("run", segment.run_id, event.payload_hash)
        event_infos.append(
            CapturedEventInfo(
                event_seq=event.event_seq,
                run_seq=event.run_seq,
                event_type=event.event_type,
                tool_call_id=event.tool_call_id,
                payload=carried.value,
                payload_ref=carried.ref,
                payload_bytes=event.payload_bytes,
                recorded_at=event.recorded_at,
            )
        )
    return view.model_copy(
        update={
            "segment_id": segment.segment_id,
            "entries": entry_infos,
            "events": event_infos,
            "more_entries": len(entries) > limit,
            "more_events": len(events) > limit,
        }
    )


def _segment_info(tx: Transaction, row: SegmentRow) -> SegmentInfo:
    roles = {}
    if row.attempt_id is not None:
        for role, (segment_id, entry_id) in session_capture.attempt_roles(
            tx, row.attempt_id
        ).items():
            if segment_id == row.segment_id:
                roles[role.value] = entry_id
    return SegmentInfo(
        segment_id=row.segment_id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        node_path=row.node_path,
        turn_id=row.turn_id,
        session_id=row.session_id,
        status=row.status.value,
        entry_count=row.entry_count,
        event_count=row.event_count,
        stored_bytes=row.stored_bytes,
        dropped_entries=row.dropped_entries,
        dropped_events=row.dropped_events,
        failure=row.failure,
        roles=roles,
        created_at=row.created_at,
        finished_at=row.finished_at,
    )


def _checked(value: object, field: str) -> canonical.JsonValue:
    """``value`` when it is canonical JSON of at most MAX_CAPTURED_VALUE_BYTES."""
    try:
        encoded = canonical.encode(value)
    except CanonicalJsonError as error:
        raise InvalidPayloadError(f"{field}: {error}") from None
    if len(encoded) > MAX_CAPTURED_VALUE_BYTES:
        raise InvalidPayloadError(
            f"{field}: {len(encoded)} bytes; a captured value is at most"
            f" {MAX_CAPTURED_VALUE_BYTES} bytes (record a long entry shortened, or as a"
            " reference to where the host keeps it)"
        )
    return canonical.decode(encoded)
