"""A scripted piwf server on a real Unix socket, served by threads inside the test process.

It speaks the real framing and message models: a ``hello`` first on every connection, then one
call of the test's handler per request. The handler answers with ``conn.reply(...)``, holds the
request and answers later, or drops the connection with ``conn.close()``. Every request is
recorded with the number of the connection that carried it, so tests can assert what the
client sent on which connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from piwf._version import __version__
from piwf.config import ServerPaths
from piwf.protocol import (
    ErrorInfo,
    FrameDecoder,
    Hello,
    Outcome,
    Request,
    Response,
    encode_message,
    parse_request,
)
from piwf.protocol.payloads import RunInfo

WAIT_S = 5.0


class FakeConnection:
    """One accepted client connection (numbered from 1 in accept order)."""

    def __init__(self, sock: socket.socket, number: int) -> None:
        self.sock = sock
        self.number = number
        self._send_lock = threading.Lock()

    def reply(self, request: Request, receipt: dict[str, Any] | None = None, **fields: Any) -> None:
        """Answer ``request``; ``outcome`` defaults to ``accepted``."""
        fields.setdefault("outcome", "accepted")
        response = Response(request_id=request.request_id, receipt=receipt, **fields)
        self.send(response)

    def fail(self, request: Request, outcome: Outcome, code: str, message: str) -> None:
        """Answer ``request`` with a non-success outcome and an error."""
        self.send(
            Response(
                request_id=request.request_id,
                outcome=outcome,
                error=ErrorInfo(code=code, message=message),
            )
        )

    def send(self, message: Hello | Response) -> None:
        with self._send_lock, contextlib.suppress(OSError):
            self.sock.sendall(encode_message(message))

    def close(self) -> None:
        """Drop the connection as a crashing server would."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


Handler = Callable[[FakeConnection, Request], None]


class FakeServer:
    """Listen on ``ServerPaths(home).socket`` until :meth:`stop`."""

    def __init__(
        self,
        home: Path,
        handler: Handler,
        *,
        package_version: str = __version__,
        epoch: int = 1,
    ) -> None:
        self.paths = ServerPaths(home)
        self.handler = handler
        self.package_version = package_version
        self.epoch = epoch
        self.requests: list[tuple[int, Request]] = []
        self.connections: list[FakeConnection] = []
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []
        self.paths.server_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.paths.socket))
        self._listener.listen()
        self._start(self._accept_loop)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop listening, drop every connection, remove the socket, join the threads."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for connection in list(self.connections):
            connection.close()
        for thread in self._threads:
            thread.join(WAIT_S)
            assert not thread.is_alive(), "fake server thread did not stop"
        self.paths.socket.unlink(missing_ok=True)

    def wait_for_requests(self, count: int, timeout_s: float = WAIT_S) -> list[Request]:
        """Block until ``count`` requests arrived (fail the test at the deadline)."""
        with self._changed:
            arrived = self._changed.wait_for(lambda: len(self.requests) >= count, timeout_s)
        assert arrived, f"expected {count} requests, got {len(self.requests)}"
        return [request for _, request in self.requests]

    def requests_for(self, operation: str) -> Iterator[tuple[int, Request]]:
        return ((n, r) for n, r in self.requests if r.operation == operation)

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            connection = FakeConnection(sock, len(self.connections) + 1)
            self.connections.append(connection)
            self._start(self._serve, connection)

    def _serve(self, connection: FakeConnection) -> None:
        connection.send(
            Hello(
                connection_id=f"conn-{connection.number}",
                package_version=self.package_version,
                server_epoch=self.epoch,
            )
        )
        decoder = FrameDecoder()
        with connection.sock:
            while True:
                try:
                    data = connection.sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                for frame in decoder.feed(data):
                    request = parse_request(frame)
                    with self._changed:
                        self.requests.append((connection.number, request))
                        self._changed.notify_all()
                    self.handler(connection, request)


def run_info(run_id: str = "run-1", **fields: Any) -> dict[str, Any]:
    """A valid ``RunInfo`` wire object; ``fields`` override snake_case attributes."""
    values: dict[str, Any] = {
        "run_id": run_id,
        "workflow_ref": "/flows/hello.py",
        "workflow_name": "hello",
        "status": "queued",
        "display_status": "queued",
        "paused": False,
        "queue_status": "queued",
        "root_run_id": run_id,
        "restart_number": 0,
        "definition_digest": "d" * 64,
        "revision": 1,
        "created_at": 1_700_000_000_000,
        "updated_at": 1_700_000_000_000,
    }
    values.update(fields)
    return RunInfo(**values).to_wire()


SERVER_STATUS: dict[str, Any] = {
    "state": "running",
    "epoch": 1,
    "pid": 4242,
    "packageVersion": __version__,
    "socketAvailable": True,
    "maxWorkers": 4,
    "activeRunners": 0,
    "connections": 1,
    "queuedRuns": 2,
    "runningRuns": 0,
    "waitingRuns": 0,
    "parkedRuns": 1,
    "parkedByReason": {"runnerNoProgress": 1},
    "pausedRuns": 0,
    "expiredClaims": 0,
    "pendingInteractions": 0,
    "agentDeadlines": 0,
    "ambiguousEffects": 0,
}
