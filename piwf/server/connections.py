"""One accepted client connection's state, and which connection to shed when room is needed.

A connection is *idle* when closing it loses nothing: no request is waiting for an answer, no
answer is buffered, no frame is half received and no received frame waits to be served. Only
idle connections are ever shed (at the connection limit, or when accepting fails because the
process is out of descriptors); the one idle longest goes first, and only once it has been
idle for SHED_MIN_IDLE_S, so that a burst of new clients does not shed one another before any
of them could send its request.

Times are monotonic seconds.
"""

from __future__ import annotations

import selectors
import socket
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from piwf.errors import PiwfError
from piwf.protocol.framing import FrameDecoder

#: How long a connection must have been idle before it may be shed for another client.
SHED_MIN_IDLE_S: Final = 1.0


@dataclass(frozen=True)
class Deadlines:
    """The listener's time limits in seconds; 0 turns the first-byte and stall limits off."""

    #: From a frame's first byte to its newline.
    frame_s: float
    #: From accepting a connection to its first byte.
    first_frame_s: float = 0.0
    #: Buffered output without any progress.
    output_stall_s: float = 0.0

    @property
    def check_interval_s(self) -> float:
        """How often to check them: a quarter of the shortest, between 10 ms and 250 ms."""
        limits = [s for s in (self.frame_s, self.first_frame_s, self.output_stall_s) if s > 0]
        return min(0.25, max(min(limits, default=1.0) / 4, 0.01))


class ClientConnection:
    """One accepted client: decoder, frames waiting to be served, output buffer, counters.

    ``events`` is the selector interest currently registered (0: not registered), so interest
    is changed only when it really changes. ``backlog`` holds frames read but not yet served
    (the server serves a bounded slice of them per loop turn); ``refusal`` is the framing error
    to answer once the frames received before it are served.
    """

    def __init__(
        self, sock: socket.socket, connection_id: str, peer_pid: int, *, now: float
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.connection_id = connection_id
        self.peer_pid = peer_pid
        self.decoder = FrameDecoder()
        self.output = bytearray()
        self.backlog: deque[bytes] = deque()
        self.refusal: PiwfError | None = None
        self.inflight = 0
        self.closing = False
        self.closed = False
        self.events = 0
        self.queued = False  # in the listener's round-robin of connections with a backlog
        self.callback: Callable[[int], None] | None = None
        self.accepted_at = now
        self.received_bytes = 0
        #: Last time the client sent bytes or an answer was fully written to it.
        self.active_at = now
        #: Last time buffered output was written (or began to be buffered).
        self.output_progress_at = now

    @property
    def idle(self) -> bool:
        """Whether closing this connection now loses no request, answer or frame."""
        return (
            not self.closed
            and not self.closing
            and self.inflight == 0
            and not self.output
            and not self.backlog
            and self.refusal is None
            and self.decoder.buffered_bytes == 0
        )

    def received(self, count: int, now: float) -> None:
        """Record ``count`` bytes read from the client at ``now``."""
        self.received_bytes += count
        self.active_at = now

    def overdue(self, now: float, deadlines: Deadlines) -> str | None:
        """Why the connection must be closed at ``now`` (a safe log phrase), or None."""
        if self.decoder.frame_overdue(now, deadlines.frame_s):
            return "a frame took too long to arrive"
        first_s = deadlines.first_frame_s
        if first_s > 0 and self.received_bytes == 0 and now - self.accepted_at > first_s:
            return "it sent nothing after connecting"
        stall_s = deadlines.output_stall_s
        if stall_s > 0 and self.output and now - self.output_progress_at > stall_s:
            return "it stopped reading its responses"
        return None

    def set_interest(self, selector: selectors.BaseSelector, events: int) -> None:
        """Register exactly ``events`` (0: take the socket out of the selector)."""
        if events == self.events or self.closed:
            return
        if self.events == 0:
            selector.register(self.sock, events, self.callback)
        elif events == 0:
            selector.unregister(self.sock)
        else:
            selector.modify(self.sock, events, self.callback)
        self.events = events


def longest_idle(
    connections: Iterable[ClientConnection], now: float, min_idle_s: float = SHED_MIN_IDLE_S
) -> ClientConnection | None:
    """The connection idle longest, if it has been idle at least ``min_idle_s``; else None."""
    idle = [
        connection
        for connection in connections
        if connection.idle and now - connection.active_at >= min_idle_s
    ]
    return min(idle, key=lambda connection: connection.active_at, default=None)
