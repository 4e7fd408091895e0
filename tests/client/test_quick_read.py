"""``read_quickly``: one read without the protocol's models, or None for anything unusual.

Against the scripted server of :mod:`tests.client.fake_server` (a real Unix socket), which
parses every request with the real ``Request`` model, so a quick request that the protocol
would refuse fails here.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from piwf.client.quick_read import read_quickly
from piwf.config import ServerPaths
from piwf.protocol import Request
from tests.client.fake_server import FakeConnection, FakeServer, run_info

RECEIPT = {"runs": [run_info("run-a", title="Ada")]}


def answer(conn: FakeConnection, request: Request) -> None:
    conn.reply(request, RECEIPT)


def test_an_accepted_answer_gives_the_receipt_as_the_server_sent_it(short_home: Path) -> None:
    with FakeServer(short_home, answer) as server:
        receipt = read_quickly(
            short_home, "run.list", {"limit": 5}, client_id="cli-quick", timeout_s=5
        )
    assert receipt == RECEIPT
    ((_, request),) = server.requests
    assert (request.operation, request.payload, request.client_id) == (
        "run.list",
        {"limit": 5},
        "cli-quick",
    )
    assert request.idempotency_key is None


def test_a_durable_operation_is_refused_before_anything_connects(short_home: Path) -> None:
    with pytest.raises(ValueError, match="run.cancel is not a read"):
        read_quickly(short_home, "run.cancel", {}, client_id="cli-quick", timeout_s=5)


def test_no_server_gives_none(short_home: Path) -> None:
    assert read_quickly(short_home, "run.list", {}, client_id="cli-quick", timeout_s=5) is None


def test_another_version_gets_no_request(short_home: Path) -> None:
    with FakeServer(short_home, answer, package_version="0.0.1") as server:
        receipt = read_quickly(short_home, "run.list", {}, client_id="cli-quick", timeout_s=5)
    assert receipt is None
    assert server.requests == []


def test_a_refusal_gives_none(short_home: Path) -> None:
    def refuse(conn: FakeConnection, request: Request) -> None:
        conn.fail(request, "rejected", "stateBusy", "busy")

    with FakeServer(short_home, refuse):
        assert read_quickly(short_home, "run.list", {}, client_id="c", timeout_s=5) is None


def test_a_symlinked_socket_is_not_followed(short_home: Path) -> None:
    # A real server's socket elsewhere, and this home's socket path a symlink to it.
    elsewhere = Path(os.path.realpath(short_home)).parent / "other"
    with FakeServer(elsewhere, answer) as server:
        ServerPaths(short_home).server_dir.mkdir(parents=True, mode=0o700)
        ServerPaths(short_home).socket.symlink_to(ServerPaths(elsewhere).socket)
        assert read_quickly(short_home, "run.list", {}, client_id="c", timeout_s=5) is None
    assert server.requests == []


def test_silence_gives_none_at_the_deadline(short_home: Path) -> None:
    # A listener that accepts and never says hello.
    paths = ServerPaths(short_home)
    paths.server_dir.mkdir(parents=True, mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(paths.socket))
    listener.listen()
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]))
    thread.start()
    try:
        assert read_quickly(short_home, "run.list", {}, client_id="c", timeout_s=0.2) is None
    finally:
        thread.join(5)
        for sock in accepted:
            sock.close()
        listener.close()
