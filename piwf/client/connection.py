"""One connection of the Python client: the hello check, and a reader thread.

:class:`ServerConnection` runs over a :class:`~piwf.client.transport.Transport` (the Unix
socket, checked and connected by :mod:`piwf.client.sockets`, or a piwf relay's WebSocket): it
reads the server's ``hello`` (refusing another package version), then a reader thread matches
every response to its request by ``requestId``, so
requests from several threads may be in flight at once. Any transport failure marks the
connection broken and wakes every waiting request with :class:`TransportError`; the
:class:`~piwf.client.Client` decides whether to reconnect and retry.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Final

from piwf._version import __version__
from piwf.client.sockets import SilentServerError, TransportError
from piwf.client.transport import PeerClosedError, Transport
from piwf.errors import IncompatibleServerError, PiwfError
from piwf.protocol import Hello, InvalidMessageError, Response, parse_server_message
from piwf.protocol.client_v1 import Event

#: How long :meth:`ServerConnection.close` waits for the reader thread once the transport is
#: shut down. The reader ends at once unless something is badly wrong; a client must never
#: hang on closing (a Ctrl-C ends a command by closing its client), and the reader is a daemon.
READER_JOIN_S: Final = 5.0


@dataclass
class PendingRequest:
    """One request waiting for its response."""

    done: threading.Event = field(default_factory=threading.Event)
    response: Response | None = None


class ServerConnection:
    """One transport, its hello, and a reader thread that routes responses by request id."""

    def __init__(self, transport: Transport, hello: Hello) -> None:
        self.hello = hello
        self._transport = transport
        self._state = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[str, PendingRequest] = {}
        #: The events of each subscription made on this connection, in arrival order; None
        #: is put last when the connection ends.
        self._events: dict[str, queue.SimpleQueue[Event | None]] = {}
        self._failure: str | None = None
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="piwf-client", daemon=True)

    @classmethod
    def open(
        cls, transport: Transport, connect_timeout_s: float, io_timeout_s: float
    ) -> ServerConnection:
        """Read and check the hello, then start the reader; closes ``transport`` on any error."""
        try:
            hello = read_hello(transport, time.monotonic() + connect_timeout_s)
            if hello.package_version != __version__:
                raise IncompatibleServerError(
                    f"the piwf server runs version {hello.package_version} but this client is "
                    f"{__version__}; stop that server with the piwf that started it"
                )
            transport.set_timeout(io_timeout_s)
        except BaseException:
            transport.close()
            raise
        connection = cls(transport, hello)
        connection._reader.start()
        return connection

    @property
    def broken(self) -> bool:
        return self._failure is not None

    def call(self, request_id: str, frame: bytes, timeout_s: float) -> Response:
        """Send ``frame`` and wait for the response to ``request_id``."""
        pending = PendingRequest()
        with self._state:
            if self._failure is not None:
                raise TransportError(self._failure)
            self._pending[request_id] = pending
        try:
            try:
                with self._send_lock:
                    self._transport.send_frame(frame)
            except OSError as error:
                self._fail(f"sending failed: {error.strerror or error}")
            if not pending.done.wait(timeout_s):
                self._fail(f"no response within {timeout_s:g} s")
            if pending.response is None:
                raise TransportError(self._failure or "the connection closed")
            return pending.response
        finally:
            with self._state:
                self._pending.pop(request_id, None)

    def subscribe(self, subscription_id: str) -> queue.SimpleQueue[Event | None]:
        """The queue the events of ``subscription_id`` go to (made before the watch request is
        sent, so no event is missed); None arrives when the connection ends."""
        events: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        with self._state:
            if self._failure is not None:
                events.put(None)
            self._events[subscription_id] = events
        return events

    def unsubscribe(self, subscription_id: str) -> None:
        """Drop the queue of ``subscription_id`` (events that still come are dropped)."""
        with self._state:
            self._events.pop(subscription_id, None)

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait until the connection failed or was closed by either side."""
        return self._closed.wait(timeout_s)

    def close(self) -> None:
        """Fail every waiting request, shut the transport down, wait up to
        :data:`READER_JOIN_S` for the reader thread to end, and release the transport."""
        self._fail("the client closed the connection")
        if threading.current_thread() is not self._reader and self._reader.is_alive():
            self._reader.join(READER_JOIN_S)
        self._transport.close()

    def _fail(self, reason: str) -> None:
        """Mark the connection broken (first reason wins) and wake every waiting request."""
        with self._state:
            if self._failure is None:
                self._failure = reason
            waiting = list(self._pending.values())
            subscribed = list(self._events.values())
        for pending in waiting:
            pending.done.set()
        for events in subscribed:
            events.put(None)
        self._transport.shutdown()
        self._closed.set()

    def _read_loop(self) -> None:
        try:
            while not self.broken:
                try:
                    frames = self._transport.receive()
                except TimeoutError:
                    continue
                for frame in frames:
                    self._dispatch(frame)
        except PeerClosedError as closed:
            self._fail(str(closed))
        except OSError as error:
            self._fail(f"connection error: {error.strerror or error}")
        except PiwfError as error:
            self._fail(f"the server broke the protocol ({error.code})")

    def _dispatch(self, frame: bytes) -> None:
        message = parse_server_message(frame)
        if isinstance(message, Hello):
            raise InvalidMessageError("type", "unexpectedType", "a second hello")
        if isinstance(message, Response):
            with self._state:
                pending = self._pending.get(message.request_id)
            if pending is not None:
                pending.response = message
                pending.done.set()
        elif isinstance(message, Event):
            with self._state:
                events = self._events.get(message.subscription_id)
            if events is not None:
                events.put(message)
        # An event of a subscription given up, a response to a request that gave up: dropped.


def read_hello(transport: Transport, deadline: float) -> Hello:
    """Wait until ``deadline`` (monotonic) for the server's hello and return it.

    Raises :class:`TransportError` (worth a retry) when none comes in time, the peer closes
    first or the server refused the connection, and
    :class:`~piwf.protocol.errors.InvalidMessageError` when the first frame is no hello.
    """
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SilentServerError("the server sent no hello in time")
        transport.set_timeout(remaining)
        try:
            frames = transport.receive()
        except TimeoutError:
            raise SilentServerError("the server sent no hello in time") from None
        except PeerClosedError as closed:
            raise TransportError(f"{closed} before its hello") from None
        except OSError as error:
            raise TransportError(f"connection error: {error.strerror or error}") from None
        if frames:
            message = parse_server_message(frames[0])
            if isinstance(message, Response) and message.error is not None:
                # The server refused the connection (all its connections busy): worth a retry.
                raise TransportError(
                    f"the server refused the connection: {message.error.message} "
                    f"({message.error.code})"
                )
            if not isinstance(message, Hello):
                raise InvalidMessageError("type", "unexpectedType", "expected the server's hello")
            # Nothing was sent yet, so no later frame in this read can answer anything.
            return message
