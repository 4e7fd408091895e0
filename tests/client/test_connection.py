"""``ServerConnection.close`` never hangs, even on a reader thread that does not end.

Unit tests of one module: the transport is a test double of the ``Transport`` protocol whose
``receive`` stays blocked after ``shutdown`` (as a reader stuck anywhere would), since no real
socket can be made to ignore its own shutdown.
"""

from __future__ import annotations

import threading
import time

import pytest

from piwf._version import __version__
from piwf.client import connection
from piwf.client.connection import ServerConnection
from piwf.client.sockets import TransportError
from piwf.protocol import Hello

DEADLINE_S = 10.0


class StuckTransport:
    """A transport whose reader never comes back once it started receiving."""

    def __init__(self) -> None:
        self.receiving = threading.Event()
        self.released = threading.Event()
        self.shut_down = False
        self.closed = False

    def set_timeout(self, timeout_s: float | None) -> None:
        pass

    def send_frame(self, frame: bytes) -> None:
        pass

    def receive(self) -> list[bytes]:
        self.receiving.set()
        self.released.wait()  # ignores shutdown: only the test's cleanup lets it go
        raise OSError("released")

    def shutdown(self) -> None:
        self.shut_down = True

    def close(self) -> None:
        self.closed = True


def test_close_returns_and_fails_waiting_requests_although_the_reader_never_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection, "READER_JOIN_S", 0.2)
    transport = StuckTransport()
    hello = Hello(connection_id="c1", package_version=__version__, server_epoch=1)
    opened = ServerConnection(transport, hello)
    opened._reader.start()
    try:
        assert transport.receiving.wait(DEADLINE_S)
        outcome: list[BaseException] = []

        def waiting_request() -> None:
            try:
                opened.call("r1", b"{}\n", timeout_s=DEADLINE_S)
            except TransportError as error:
                outcome.append(error)

        requester = threading.Thread(target=waiting_request)
        requester.start()
        began = time.monotonic()
        opened.close()
        took = time.monotonic() - began
        requester.join(DEADLINE_S)

        assert took < DEADLINE_S / 2, f"close took {took:.1f} s"
        assert transport.shut_down and transport.closed
        assert opened.broken
        assert [str(error) for error in outcome] == ["the client closed the connection"]
        assert opened._reader.is_alive()  # still stuck: close did not wait for it
    finally:
        transport.released.set()
        opened._reader.join(DEADLINE_S)
