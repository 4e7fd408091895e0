"""Reading a run's session capture: :meth:`Client.read_capture` (``sessionCapture.read``).

An interactive run keeps what its session reported of each accepted turn, one segment per turn
(docs/SESSIONS.md, "Session capture"). A read returns every segment of the run (or of one node
attempt) with all its entries and events, paged through the server's bounded reads and with
every value sent by content reference read back and verified::

    for turn in client.read_capture(run_id):
        print(turn.segment.node_path, turn.segment.status)
        for entry in turn.entries:
            print(" ", entry.kind, entry.content)

Recording is the session coordinator's: :meth:`piwf.client.sessions.SessionCoordinator.record`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from piwf.client.arguments import build_payload
from piwf.client.content import resolve_references

if TYPE_CHECKING:
    from piwf.client.client import Client
    from piwf.protocol.session_capture_payloads import (
        CapturedEntryInfo,
        CapturedEventInfo,
        CaptureReadPayload,
        RunCapture,
        SegmentInfo,
    )


@dataclass(frozen=True)
class CapturedTurn:
    """One captured turn: its segment (state, counts, the attempt's entry roles) and all its
    entries and events in the order the session reported them."""

    segment: SegmentInfo
    entries: list[CapturedEntryInfo]
    events: list[CapturedEventInfo]


class CaptureMethods:
    """The capture reads of :class:`piwf.client.Client`."""

    def read_capture(self, run_id: str, *, attempt_id: str | None = None) -> list[CapturedTurn]:
        """Return every captured turn of run ``run_id`` (only node attempt ``attempt_id``'s
        when given), oldest first, each complete. Raises ``RunNotFoundError`` for an unknown
        run; a run without captured turns gives ``[]``."""
        from piwf.protocol.session_capture_payloads import CaptureReadPayload

        client: Client = self  # type: ignore[assignment]  # a mixin of Client
        payload = build_payload(CaptureReadPayload, run_id=run_id, attempt_id=attempt_id)
        listing = _read(client, payload)
        return [_whole_segment(client, run_id, attempt_id, segment) for segment in listing.segments]


def _whole_segment(
    client: Client, run_id: str, attempt_id: str | None, segment: SegmentInfo
) -> CapturedTurn:
    from piwf.protocol.session_capture_payloads import CaptureReadPayload

    entries: list[CapturedEntryInfo] = []
    events: list[CapturedEventInfo] = []
    more_entries = more_events = True
    while more_entries or more_events:
        page = _read(
            client,
            CaptureReadPayload(
                run_id=run_id,
                attempt_id=attempt_id,
                segment_id=segment.segment_id,
                after_entry=entries[-1].entry_seq if entries else 0,
                after_event=events[-1].event_seq if events else 0,
            ),
        )
        if more_entries:
            entries.extend(page.entries)
            more_entries = page.more_entries and bool(page.entries)
        if more_events:
            events.extend(page.events)
            more_events = page.more_events and bool(page.events)
    return CapturedTurn(segment=segment, entries=entries, events=events)


def _read(client: Client, payload: CaptureReadPayload) -> RunCapture:
    from piwf.protocol.session_capture_payloads import RunCapture

    page = client._call("sessionCapture.read", payload, RunCapture)
    return resolve_references(page, client.read_content)
