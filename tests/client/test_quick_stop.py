"""``stop_quickly`` and ``nothing_listens``: ``piwf server stop``'s path without the models.

Against the scripted server of :mod:`tests.client.fake_server` (a real Unix socket, every
request parsed with the real ``Request`` model, so a quick request the protocol would refuse
fails here), and against a real server process.
"""

from __future__ import annotations

import threading
from pathlib import Path

from piwf.client.quick_stop import QuickStop, nothing_listens, stop_quickly
from piwf.protocol import Request
from tests.client.fake_server import FakeConnection, FakeServer
from tests.server.harness import ServerFactory


def stop(home: Path, wait_s: float = 5.0) -> QuickStop | None:
    return stop_quickly(home, client_id="cli-quick", timeout_s=5.0, wait_s=wait_s)


def test_nothing_listening_is_not_running_and_creates_nothing(short_home: Path) -> None:
    assert nothing_listens(short_home) is True
    assert stop(short_home) is QuickStop.NOT_RUNNING
    assert not short_home.exists()


def test_an_accepted_stop_and_a_closed_connection_is_stopped(short_home: Path) -> None:
    def accept_and_close(conn: FakeConnection, request: Request) -> None:
        conn.reply(request, {"stopping": True})
        conn.close()

    with FakeServer(short_home, accept_and_close) as server:
        assert nothing_listens(short_home) is False
        assert stop(short_home) is QuickStop.STOPPED
    ((_, request),) = server.requests
    assert (request.operation, request.payload, request.client_id) == (
        "server.stop",
        {},
        "cli-quick",
    )
    assert request.idempotency_key is not None and request.idempotency_key.startswith(
        "server.stop-"
    )


def test_a_server_stopping_already_is_waited_for(short_home: Path) -> None:
    def stopping(conn: FakeConnection, request: Request) -> None:
        conn.fail(request, "unavailable", "serverStopping", "the server is stopping")
        conn.close()

    with FakeServer(short_home, stopping):
        assert stop(short_home) is QuickStop.STOPPED


def test_a_server_that_keeps_the_connection_open_gives_none(short_home: Path) -> None:
    closed = threading.Event()

    def accept_and_linger(conn: FakeConnection, request: Request) -> None:
        conn.reply(request, {"stopping": True})
        closed.wait(10)

    with FakeServer(short_home, accept_and_linger):
        try:
            assert stop(short_home, wait_s=0.3) is None
        finally:
            closed.set()


def test_a_refusal_gives_none(short_home: Path) -> None:
    def refuse(conn: FakeConnection, request: Request) -> None:
        conn.fail(request, "conflict", "idempotencyConflict", "used for another command")

    with FakeServer(short_home, refuse):
        assert stop(short_home) is None


def test_another_version_gets_no_request(short_home: Path) -> None:
    with FakeServer(short_home, lambda conn, request: None, package_version="0.0.1") as server:
        assert stop(short_home) is None
    assert server.requests == []


def test_a_real_server_stops_and_its_home_then_has_nothing_listening(short_home: Path) -> None:
    servers = ServerFactory(short_home)
    try:
        server = servers.start(env={"PIWF_IDLE_EXIT_S": "0"})
        assert server.ready.get("ok") is True, server.ready
        assert stop(server.home, wait_s=10.0) is QuickStop.STOPPED
        assert server.process.wait(timeout=30) == 0
        assert nothing_listens(server.home) is True
        assert stop(server.home) is QuickStop.NOT_RUNNING
    finally:
        servers.cleanup()
