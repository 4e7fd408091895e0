"""The server's event loop: one thread, ``selectors``, non-blocking sockets and a timer heap.

Each turn of the loop is a list of named duties::

    wait (select until the next timer, at most 1 s)
    -> dispatch I/O (accept, read frames, write buffered output, child pipes)
    -> handle signals (SIGTERM/SIGINT only set a flag; set_wakeup_fd wakes select)
    -> run due timers (lease renewal, frame deadlines, idle exit, child deadlines)

Everything is bounded: frames (1 MiB), a per-frame read deadline measured from its first byte,
buffered output per connection (past the cap the connection is closed; past half of it the
server stops reading from that client), connections, and requests in flight per connection. A
bad frame closes only its own connection. Handlers run short transactions inline; work that
waits (a resolver child, ``run.wait``) answers later through its ``reply`` callback.
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
from collections.abc import Callable
from dataclasses import dataclass, field

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
from piwf.protocol.framing import FrameDecoder
from piwf.protocol.operations import is_durable
from piwf.server.listener import peer_credentials

log = logging.getLogger("piwf.server")

Reply = Callable[[Response], None]
RequestHandler = Callable[[Request, Reply], None]
IoCallback = Callable[[int], None]


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


class ClientConnection:
    """One accepted client: its decoder, output buffer and in-flight count."""

    def __init__(self, sock: socket.socket, connection_id: str, peer_pid: int) -> None:
        self.sock = sock
        self.connection_id = connection_id
        self.peer_pid = peer_pid
        self.decoder = FrameDecoder()
        self.output = bytearray()
        self.inflight = 0
        self.closing = False
        self.closed = False
        self.reading = True


class EventLoop:
    """Selector, timers and signal wake-up; knows nothing about piwf operations."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self._timers: list[Timer] = []
        self._sequence = itertools.count()
        self.stop_requested = False
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
        """One turn: wait, dispatch I/O, then run due timers."""
        for key, mask in self.selector.select(self._wait_timeout()):
            callback: IoCallback = key.data
            _contained(callback, mask)
        self._run_due_timers()

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


class ClientListener:
    """Accepts clients and turns their frames into handler calls; owns every connection."""

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
    ) -> None:
        self.loop = loop
        self.listener = listener
        self.handle = handle
        self.hello = hello
        self.max_connections = max_connections
        self.max_inflight = max_inflight
        self.output_cap = output_cap
        self.frame_deadline_s = frame_deadline_s
        self.connections: dict[int, ClientConnection] = {}
        self._ids = itertools.count(1)
        self.last_activity = time.monotonic()
        loop.selector.register(listener, selectors.EVENT_READ, self._accept)
        loop.every(min(0.25, max(frame_deadline_s / 4, 0.01)), self._enforce_frame_deadlines)

    def close_all(self) -> None:
        """Close every connection and stop accepting."""
        for connection in list(self.connections.values()):
            self._close(connection)
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(self.listener)
        self.listener.close()

    def _accept(self, _mask: int) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # EMFILE and friends: keep serving the others
                log.warning("accept failed: %s", error.strerror)
                return
            self._admit(sock)

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
        if len(self.connections) >= self.max_connections:
            log.warning("refused a client: %d connections open", len(self.connections))
            sock.close()
            return
        sock.setblocking(False)
        connection = ClientConnection(sock, f"connection-{next(self._ids)}", pid)
        self.connections[sock.fileno()] = connection
        self.loop.selector.register(sock, selectors.EVENT_READ, self._io_callback(connection))
        self.last_activity = time.monotonic()
        self._send(connection, encode_message(self.hello(connection.connection_id)))

    def _io_callback(self, connection: ClientConnection) -> IoCallback:
        def on_event(mask: int) -> None:
            if mask & selectors.EVENT_WRITE:
                self._flush(connection)
            if mask & selectors.EVENT_READ and not connection.closed:
                self._read(connection)

        return on_event

    def _read(self, connection: ClientConnection) -> None:
        try:
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection)
            return
        if not data:
            self._close(connection)
            return
        self.last_activity = time.monotonic()
        try:
            frames = connection.decoder.feed(data)
        except FrameError as error:
            for frame in error.frames:
                self._dispatch(connection, frame)
            self._refuse(connection, error)
            return
        for frame in frames:
            if connection.closing or connection.closed:
                return
            self._dispatch(connection, frame)

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
            self.handle(request, reply)
        except PiwfError as error:
            reply(_error_response(request.request_id, "rejected", error))

    def _refuse(
        self, connection: ClientConnection, error: PiwfError, request_id: str = "-"
    ) -> None:
        """Answer a bad frame with a typed error, then close only this connection."""
        self._send_response(connection, _error_response(request_id, "rejected", error))
        connection.closing = True
        self._stop_reading(connection)
        if not connection.output:
            self._close(connection)

    def _send_response(self, connection: ClientConnection, response: Response) -> None:
        try:
            data = encode_message(response)
        except PiwfError as error:
            data = encode_message(_error_response(response.request_id, "rejected", error))
        self._send(connection, data)

    def _send(self, connection: ClientConnection, data: bytes) -> None:
        if connection.closed:
            return
        connection.output += data
        if len(connection.output) > self.output_cap:
            log.warning("closed %s: it does not read its responses", connection.connection_id)
            self._close(connection)
            return
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
        if connection.closed:
            return
        if connection.closing and not connection.output:
            self._close(connection)
            return
        self._update_interest(connection)

    def _update_interest(self, connection: ClientConnection) -> None:
        # Backpressure: stop reading requests from a client that does not read its answers.
        half_full = len(connection.output) > self.output_cap // 2
        connection.reading = not connection.closing and not half_full
        events = (selectors.EVENT_READ if connection.reading else 0) | (
            selectors.EVENT_WRITE if connection.output else 0
        )
        if events:
            self.loop.selector.modify(connection.sock, events, self._io_callback(connection))
        else:
            self.loop.selector.modify(
                connection.sock, selectors.EVENT_READ, self._io_callback(connection)
            )
            connection.reading = True

    def _stop_reading(self, connection: ClientConnection) -> None:
        connection.reading = False
        if not connection.closed:
            events = selectors.EVENT_WRITE if connection.output else selectors.EVENT_READ
            self.loop.selector.modify(connection.sock, events, self._io_callback(connection))

    def _enforce_frame_deadlines(self) -> None:
        now = time.monotonic()
        for connection in list(self.connections.values()):
            if connection.decoder.frame_overdue(now, self.frame_deadline_s):
                log.info("closed %s: a frame took too long to arrive", connection.connection_id)
                self._close(connection)

    def _close(self, connection: ClientConnection) -> None:
        if connection.closed:
            return
        connection.closed = True
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(connection.sock)
        self.connections.pop(connection.sock.fileno(), None)
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
