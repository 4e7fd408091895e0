"""The server's event loop: one thread, ``selectors``, non-blocking sockets and a timer heap.

Each turn of the loop is a list of named duties::

    wait (select until the next timer, at most 1 s)
    -> dispatch I/O (accept, read frames, write buffered output, child pipes)
    -> handle signals (SIGTERM/SIGINT only set a flag; set_wakeup_fd wakes select)
    -> run due timers (lease renewal, deadlines, idle exit, child deadlines, frame slices)

Everything is bounded: frames (1 MiB), a per-frame read deadline measured from its first byte,
a deadline for a new connection's first byte, buffered output per connection (past the cap the
connection is closed; past half of it the server stops reading from that client; output that
makes no progress for a while closes it too), connections, requests in flight per connection,
and the work one client can cost one turn (frames are served in round-robin slices). At the
connection limit the connection idle longest is closed for the new one; a client is refused
(``unavailable``, ``tooManyConnections``) only when every connection is busy. When accepting
fails for want of descriptors the listener is not watched for a growing pause and an idle
connection is shed. A bad frame closes only its own connection. Handlers run short transactions
inline; work that waits (a resolver child, ``run.wait``) answers later through its ``reply``.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import selectors
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from piwf import canonical, faults
from piwf.errors import CanonicalJsonError, PiwfError
from piwf.faults import FaultDropError
from piwf.protocol.client_v1 import (
    ErrorInfo,
    Hello,
    Request,
    Response,
    encode_message,
    parse_request,
)
from piwf.protocol.errors import FrameError, ProtocolError
from piwf.protocol.operations import is_durable
from piwf.server.connections import ClientConnection, Deadlines, longest_idle
from piwf.server.listener import Acceptor, peer_credentials, refuse_connection

log = logging.getLogger("piwf.server")

Reply = Callable[[Response], None]
RequestHandler = Callable[[Request, Reply], None]
IoCallback = Callable[[int], None]

#: Bounds of one loop turn's client work (see ClientListener).
ACCEPTS_PER_TURN: Final = 32
READ_BYTES: Final = 65536
FRAMES_PER_SLICE: Final = 16
SLICE_BUDGET_S: Final = 0.005
TURN_BUDGET_S: Final = 0.02


@dataclass(order=True)
class Timer:
    """A scheduled callback; :meth:`cancel` makes it a no-op."""

    due: float
    sequence: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        """Do not run this timer."""
        self.cancelled = True


class EventLoop:
    """Selector, timers and signal wake-up; knows nothing about piwf operations."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self._timers: list[Timer] = []
        self._sequence = itertools.count()
        self.stop_requested = False
        #: Called after every wait, before the turn's I/O and timers (see :meth:`run_once`).
        self.on_wake: list[Callable[[], None]] = []
        #: Called after the turn's I/O is dispatched and again after its timers ran (see
        #: :meth:`run_once`): nothing queued in a turn waits for the next one.
        self.after_dispatch: list[Callable[[], None]] = []
        self._signals_seen: list[int] = []
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self.selector.register(self._wake_reader, selectors.EVENT_READ, self._drain_wakeup)

    def install_signal_handlers(self) -> None:
        """Route SIGTERM and SIGINT into the loop; the handlers only record the signal."""
        signal.set_wakeup_fd(self._wake_writer.fileno(), warn_on_full_buffer=False)
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._record_signal)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` after ``delay_s`` seconds (monotonic)."""
        timer = Timer(time.monotonic() + max(0.0, delay_s), next(self._sequence), callback)
        heapq.heappush(self._timers, timer)
        return timer

    def every(self, interval_s: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` every ``interval_s`` seconds until the loop stops, even after a run
        that raised (a duty that fails while the disk is full must retry, not end)."""

        def tick() -> None:
            try:
                callback()
            finally:
                if not self.stop_requested:
                    self.call_later(interval_s, tick)

        self.call_later(interval_s, tick)

    def run_once(self) -> None:
        """One turn: wait, run the wake duties, dispatch I/O, run the after-dispatch duties
        (the group commit of what the I/O queued), run due timers, and the after-dispatch
        duties again.

        Wake duties (:attr:`on_wake`) run first after every wait, before any I/O or timer of
        that turn is served: a process that was stopped or starved inside ``select`` checks its
        leases before it acts on what arrived meanwhile.
        """
        events = self.selector.select(self._wait_timeout())
        for duty in self.on_wake:
            _contained(duty)
        for key, mask in events:
            callback: IoCallback = key.data
            _contained(callback, mask)
        self._after_dispatch()
        self._run_due_timers()
        self._after_dispatch()

    def _after_dispatch(self) -> None:
        for duty in self.after_dispatch:
            _contained(duty)

    def close(self) -> None:
        """Release the selector and the wake-up pair."""
        signal.set_wakeup_fd(-1)
        self.selector.close()
        self._wake_reader.close()
        self._wake_writer.close()

    def _wait_timeout(self) -> float:
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        if not self._timers:
            return 1.0
        return min(1.0, max(0.0, self._timers[0].due - time.monotonic()))

    def _run_due_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0].due <= now:
            timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                _contained(timer.callback)

    def _record_signal(self, number: int, _frame: object) -> None:
        self._signals_seen.append(number)
        self.stop_requested = True

    def _drain_wakeup(self, _mask: int) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass


class ConnectionSubscriptions(Protocol):
    """The subscriptions of connections (:mod:`piwf.server.subscriptions`), as the listener
    needs them: the operations they answer, and the drain and close of a connection."""

    def handle(self, connection: ClientConnection, request: Request, reply: Reply) -> None:
        """Answer one subscription operation of ``connection``."""
        ...

    def drained(self, connection: ClientConnection) -> None:
        """``connection`` wrote out all its output."""
        ...

    def closed(self, connection: ClientConnection) -> None:
        """``connection`` closed."""
        ...


class ClientListener:
    """Accepts clients and turns their frames into handler calls; owns every connection.

    Work per loop turn is bounded whatever a client does: at most ACCEPTS_PER_TURN accepts
    (the :class:`~piwf.server.listener.Acceptor` pauses instead of spinning when it cannot),
    one read of READ_BYTES per readable connection, and frames served in slices (at most
    FRAMES_PER_SLICE frames or SLICE_BUDGET_S seconds per connection, TURN_BUDGET_S in all) in
    round-robin; a connection with frames still waiting is not read. A connection whose socket
    is full costs an append per answer until the selector reports it writable again.
    """

    def __init__(
        self,
        loop: EventLoop,
        listener: socket.socket,
        *,
        handle: RequestHandler,
        hello: Callable[[str], Hello],
        max_connections: int,
        max_inflight: int,
        output_cap: int,
        frame_deadline_s: float,
        first_frame_deadline_s: float = 0.0,
        output_stall_deadline_s: float = 0.0,
    ) -> None:
        self.loop = loop
        self.listener = listener
        self.handle = handle
        self.hello = hello
        self.max_connections = max_connections
        self.max_inflight = max_inflight
        self.output_cap = output_cap
        self.deadlines = Deadlines(
            frame_deadline_s, first_frame_deadline_s, output_stall_deadline_s
        )
        self.connections: dict[int, ClientConnection] = {}
        #: Subscriptions, and the operations handed to them with their connection.
        self.subscriptions: ConnectionSubscriptions | None = None
        self.subscription_operations: frozenset[str] = frozenset()
        self._ids = itertools.count(1)
        self.last_activity = time.monotonic()
        self._ready: deque[ClientConnection] = deque()
        self._ready_timer: Timer | None = None
        self.acceptor = Acceptor(
            listener,
            loop.selector,
            loop.call_later,
            admit=self._admit,
            shed=self._shed_for_descriptor,
            per_turn=ACCEPTS_PER_TURN,
        )
        loop.every(self.deadlines.check_interval_s, self._enforce_deadlines)

    def close_all(self) -> None:
        """Close every connection and stop accepting."""
        for connection in list(self.connections.values()):
            self._close(connection)
        self.acceptor.close()

    # -- accepting ----------------------------------------------------------------------------

    def _admit(self, sock: socket.socket) -> None:
        try:
            pid, uid, _gid = peer_credentials(sock)
        except OSError:
            sock.close()
            return
        if uid != os.geteuid():
            log.warning("refused a client with uid %d (pid %d)", uid, pid)
            sock.close()
            return
        if len(self.connections) >= self.max_connections and not self._make_room():
            log.warning("refused a client: all %d connections are busy", len(self.connections))
            refuse_connection(sock, len(self.connections))
            return
        sock.setblocking(False)
        now = time.monotonic()
        connection = ClientConnection(sock, f"connection-{next(self._ids)}", pid, now=now)
        connection.callback = self._io_callback(connection)
        self.connections[connection.fd] = connection
        connection.set_interest(self.loop.selector, selectors.EVENT_READ)
        self.last_activity = now
        self._send(connection, encode_message(self.hello(connection.connection_id)))

    def _shed_for_descriptor(self) -> bool:
        """Close the connection idle longest to free a descriptor; False if none is idle."""
        shed = longest_idle(self.connections.values(), time.monotonic())
        if shed is None:
            return False
        log.info(
            "closed %s: idle longest, to free a descriptor",
            shed.connection_id,
            extra={"rate_key": "connection-shed-for-descriptor"},
        )
        self._close(shed)
        return True

    def _make_room(self) -> bool:
        """Close the connection idle longest; False when every connection is busy."""
        shed = longest_idle(self.connections.values(), time.monotonic())
        if shed is None:
            return False
        log.info(
            "closed %s: idle longest at the limit of %d connections",
            shed.connection_id,
            self.max_connections,
            extra={"rate_key": "connection-shed"},
        )
        self._close(shed)
        return True

    # -- reading and serving ------------------------------------------------------------------

    def _io_callback(self, connection: ClientConnection) -> IoCallback:
        def on_event(mask: int) -> None:
            if mask & selectors.EVENT_WRITE:
                self._flush(connection)
            if mask & selectors.EVENT_READ and not connection.closed:
                self._read(connection)

        return on_event

    def _read(self, connection: ClientConnection) -> None:
        if connection.backlog or connection.refusal is not None or connection.closing:
            return  # not read until its waiting frames are served (interest is being updated)
        try:
            data = connection.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection)
            return
        if not data:
            self._end_of_stream(connection)
            return
        now = time.monotonic()
        connection.received(len(data), now)
        self.last_activity = now
        try:
            connection.backlog.extend(connection.decoder.feed(data))
        except FrameError as error:
            connection.backlog.extend(error.frames)
            connection.refusal = error
        self._serve_slice(connection)

    def _end_of_stream(self, connection: ClientConnection) -> None:
        """The client sent its last byte: a frame it left unfinished is refused as
        ``truncatedFrame`` (it may still read after a half-close); then the connection closes."""
        try:
            connection.decoder.finish()
        except FrameError as error:
            self._refuse(connection, error)
            return
        self._close(connection)

    def _serve_slice(self, connection: ClientConnection) -> None:
        """Serve up to one slice of the connection's waiting frames, in order.

        What is left waits for the next turn in the round-robin; a framing error is answered
        once every frame before it was served.
        """
        started = time.perf_counter()
        try:
            for _ in range(FRAMES_PER_SLICE):
                if not connection.backlog or connection.closing or connection.closed:
                    break
                self._dispatch(connection, connection.backlog.popleft())
                if time.perf_counter() - started >= SLICE_BUDGET_S:
                    break
        finally:
            # Also after a failing handler (contained by the loop): the rest is still served.
            self._after_slice(connection)

    def _after_slice(self, connection: ClientConnection) -> None:
        if connection.closed:
            return
        if connection.closing:
            connection.backlog.clear()
        elif connection.backlog:
            self._queue_ready(connection)
        elif connection.refusal is not None:
            self._refuse(connection, connection.refusal)
            return
        self._update_interest(connection)

    def _queue_ready(self, connection: ClientConnection) -> None:
        if not connection.queued:
            connection.queued = True
            self._ready.append(connection)
        if self._ready_timer is None:
            # Due now, so the next select does not wait; it runs after the I/O of that turn.
            self._ready_timer = self.loop.call_later(0, self._serve_ready)

    def _serve_ready(self) -> None:
        """One round-robin pass over connections with waiting frames, within TURN_BUDGET_S."""
        self._ready_timer = None
        started = time.perf_counter()
        try:
            for _ in range(len(self._ready)):
                connection = self._ready.popleft()
                connection.queued = False
                if not connection.closed:
                    self._serve_slice(connection)
                if time.perf_counter() - started >= TURN_BUDGET_S:
                    break
        finally:
            if self._ready and self._ready_timer is None:
                self._ready_timer = self.loop.call_later(0, self._serve_ready)

    def _dispatch(self, connection: ClientConnection, frame: bytes) -> None:
        try:
            request = parse_request(frame)
        except (ProtocolError, CanonicalJsonError) as error:
            self._refuse(connection, error, _request_id_of(frame))
            return
        faults.point("cmd.after_parse")
        if connection.inflight >= self.max_inflight:
            self._send_response(
                connection,
                Response(
                    request_id=request.request_id,
                    outcome="unavailable",
                    error=ErrorInfo(code="tooManyRequests", message="too many requests in flight"),
                ),
            )
            return
        connection.inflight += 1
        answered = False

        durable = is_durable(request.operation)

        def reply(response: Response) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            connection.inflight -= 1
            if connection.closed:
                return
            if durable:
                try:
                    faults.point("cmd.after_commit_before_reply")
                except FaultDropError:
                    self._close(connection)
                    return
            self._send_response(connection, response)

        try:
            if self.subscriptions is not None and request.operation in self.subscription_operations:
                self.subscriptions.handle(connection, request, reply)
            else:
                self.handle(request, reply)
        except PiwfError as error:
            reply(_error_response(request.request_id, "rejected", error))

    def _refuse(
        self, connection: ClientConnection, error: PiwfError, request_id: str = "-"
    ) -> None:
        """Answer a bad frame with a typed error, then close only this connection."""
        self._send_response(connection, _error_response(request_id, "rejected", error))
        if connection.closed:
            return
        connection.closing = True
        connection.backlog.clear()
        if not connection.output:
            self._close(connection)
            return
        self._update_interest(connection)

    # -- writing ------------------------------------------------------------------------------

    def _send_response(self, connection: ClientConnection, response: Response) -> None:
        try:
            data = encode_message(response)
        except PiwfError as error:
            data = encode_message(_error_response(response.request_id, "rejected", error))
        self._send(connection, data)

    def send(self, connection: ClientConnection, data: bytes) -> None:
        """Write ``data`` (whole frames) to ``connection``, buffering what the socket does not
        take now (an event of a subscription; answers go through their reply)."""
        self._send(connection, data)

    def _send(self, connection: ClientConnection, data: bytes) -> None:
        if connection.closed:
            return
        if not connection.output:
            connection.output_progress_at = time.monotonic()
        connection.output += data
        if len(connection.output) > self.output_cap:
            log.warning("closed %s: it does not read its responses", connection.connection_id)
            self._close(connection)
            return
        if connection.events & selectors.EVENT_WRITE:
            return  # the socket was full; the selector says when it takes more
        self._flush(connection)

    def _flush(self, connection: ClientConnection) -> None:
        while connection.output and not connection.closed:
            try:
                sent = connection.sock.send(connection.output)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(connection)
                return
            del connection.output[:sent]
            connection.output_progress_at = time.monotonic()
        if connection.closed:
            return
        if not connection.output:
            connection.active_at = time.monotonic()
            if connection.closing:
                self._close(connection)
                return
            if self.subscriptions is not None:
                self.subscriptions.drained(connection)  # may write (and so close) it
        if not connection.closed:
            self._update_interest(connection)

    def _update_interest(self, connection: ClientConnection) -> None:
        # Backpressure: a client whose answers pile up, or whose frames wait, is not read.
        reading = (
            not connection.closing
            and not connection.backlog
            and connection.refusal is None
            and len(connection.output) <= self.output_cap // 2
        )
        events = (selectors.EVENT_READ if reading else 0) | (
            selectors.EVENT_WRITE if connection.output else 0
        )
        connection.set_interest(self.loop.selector, events)

    # -- deadlines and closing ----------------------------------------------------------------

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for connection in list(self.connections.values()):
            reason = connection.overdue(now, self.deadlines)
            if reason is not None:
                log.info(
                    "closed %s: %s", connection.connection_id, reason, extra={"rate_key": reason}
                )
                self._close(connection)

    def _close(self, connection: ClientConnection) -> None:
        if connection.closed:
            return
        if connection.events:
            with contextlib.suppress(KeyError, ValueError):
                self.loop.selector.unregister(connection.sock)
        connection.closed = True
        connection.events = 0
        connection.backlog.clear()
        self.connections.pop(connection.fd, None)
        if self.subscriptions is not None:
            self.subscriptions.closed(connection)
        connection.sock.close()
        self.last_activity = time.monotonic()


def _contained(callback: Callable[..., None], *args: int) -> None:
    """Run one loop callback; a bug in one must not stop the server serving the others.

    A typed error (a database that cannot serve) is one line with its code; only a bug's
    traceback is logged.
    """
    try:
        callback(*args)
    except PiwfError as error:
        log.warning("a server callback failed: %s", error.code)
    except Exception:
        log.exception("a server callback failed")


def _error_response(request_id: str, outcome: str, error: PiwfError) -> Response:
    return Response(
        request_id=request_id,
        outcome=outcome,  # type: ignore[arg-type]
        error=ErrorInfo.of(error),
    )


def _request_id_of(frame: bytes) -> str:
    """Best-effort request id of a refused frame, so the client can match the error."""
    try:
        value = canonical.parse(frame)
    except PiwfError:
        return "-"
    if isinstance(value, dict):
        request_id = value.get("requestId")
        if (
            isinstance(request_id, str)
            and 0 < len(request_id) <= 256
            and all("!" <= char <= "~" for char in request_id)
        ):
            return request_id
    return "-"
