"""``piwf relay`` between a real server and real WebSocket clients.

Every test starts a real ``piwf server run`` and a real ``piwf relay`` subprocess; clients are
the ``websockets`` sync client (exact messages) or :class:`piwf.Client` with ``remote``. Waits
are bounded polls of a condition (``wait_for``), never sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from piwf import Client
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import ServerNotRunningError, ServerUnavailableError
from piwf.protocol.client_v1 import Hello, Request, Response, parse_server_message, serialize
from tests.relay.conftest import RelayFactory, require_websockets
from tests.server.harness import (
    NOBODY_UID,
    ServerFactory,
    ServerProcess,
    as_uid,
    raw_client,
    wait_for,
)
from tests.server.test_execution import start, write_workflow

require_websockets()

from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import ClientConnection, connect  # noqa: E402
from websockets.typing import Origin  # noqa: E402

DEADLINE_S = 30.0


@contextmanager
def websocket(url: str, **options: object) -> Iterator[ClientConnection]:
    with connect(url, proxy=None, compression=None, open_timeout=10, **options) as connection:
        yield connection


def next_message(connection: ClientConnection) -> bytes:
    """The next message, which must be binary (a frame body)."""
    message = connection.recv(timeout=DEADLINE_S)
    assert isinstance(message, bytes), message
    return message


def hello_of(connection: ClientConnection) -> Hello:
    message = parse_server_message(next_message(connection))
    assert isinstance(message, Hello), message
    return message


def server_connections(server: ServerProcess) -> int:
    """How many client connections the server holds, the asking one included."""
    with raw_client(server, "counter") as client:
        receipt = client.request("server.status").receipt
    assert receipt is not None
    return int(receipt["connections"])


def closed_with(connection: ClientConnection) -> tuple[int, str]:
    """Receive until the relay closes; return its close code and reason (no message between)."""
    with pytest.raises(ConnectionClosed) as closed:
        message = connection.recv(timeout=DEADLINE_S)
        raise AssertionError(f"a message arrived before the close: {message[:200]!r}")
    frame = closed.value.rcvd
    assert frame is not None, "the relay dropped the connection without a close frame"
    return frame.code, frame.reason


def request_frame(request_id: str, operation: str, **fields: object) -> bytes:
    request = Request.model_validate(
        {
            "requestId": request_id,
            "clientId": "relay-test",
            "operation": operation,
            "payload": {},
            **fields,
        }
    )
    return serialize(request)


def test_a_request_through_the_relay_gets_the_answer_the_socket_gives(
    server: ServerProcess, relays: RelayFactory, tmp_path: Path
) -> None:
    workflow = write_workflow(
        tmp_path,
        "answered",
        """
        from piwf.workflow import compute, define_workflow

        workflow = define_workflow(
            name="answered", start_at="only", nodes={"only": compute(lambda ctx: {"ok": True})},
            edges=[],
        )
        """,
    )
    relay = relays.start()
    assert relay.url.startswith("ws://127.0.0.1:")
    with raw_client(server, "relay-test") as direct:
        run_id = start(direct, workflow, {}, "answered")
        direct.request("run.wait", {"timeoutMs": 30_000}, run_id=run_id)
        frame = request_frame("same-1", "run.get", runId=run_id)
        direct.send_bytes(frame + b"\n")
        over_socket: list[bytes] = []
        while not over_socket:
            over_socket = direct.decoder.feed(direct.sock.recv(1 << 20))
        with websocket(relay.url) as remote:
            hello = hello_of(remote)
            assert (hello.package_version, hello.server_epoch) == (
                direct.hello.package_version,
                direct.hello.server_epoch,
            )
            assert hello.connection_id != direct.hello.connection_id, "a connection of its own"
            remote.send(frame)
            over_relay = next_message(remote)
    # A read answers the same bytes whichever way it came: the relay translates nothing.
    assert over_socket == [over_relay]
    response = parse_server_message(over_relay)
    assert isinstance(response, Response) and response.outcome == "accepted"


# conformance: I7
def test_a_remote_client_drives_a_run_to_completion_through_the_relay(
    server: ServerProcess, relays: RelayFactory, tmp_path: Path
) -> None:
    """The Python client over the relay sees the server's own run view and display."""
    workflow = write_workflow(
        tmp_path,
        "remote",
        """
        from piwf.workflow import compute, define_workflow

        workflow = define_workflow(
            name="remote", start_at="only", nodes={"only": compute(lambda ctx: {"ok": 1})},
            edges=[],
        )
        """,
    )
    relay = relays.start()
    with Client(remote=relay.url) as remote, Client(server.home, autostart=False) as local:
        assert remote.autostart is False, "a remote client never starts a server"
        run = remote.start_run(workflow, input={})
        done = remote.wait_run(run.run_id, timeout_s=DEADLINE_S)
        assert done.run.status == "completed" and done.output == {"ok": 1}
        assert remote.run_view(run.run_id).display == local.run_view(run.run_id).display


def test_closing_the_websocket_closes_its_server_connection(
    server: ServerProcess, relays: RelayFactory
) -> None:
    relay = relays.start()
    alone = server_connections(server)
    with websocket(relay.url) as remote:
        hello_of(remote)
        wait_for(lambda: server_connections(server) == alone + 1, DEADLINE_S, "the relay's")
    wait_for(lambda: server_connections(server) == alone, DEADLINE_S, "the relay to hang up")
    assert relay.alive(), "one connection ending ends only that pair"


def test_stopping_the_server_closes_the_websocket(
    servers: ServerFactory, relays: RelayFactory
) -> None:
    server = servers.start(env={"PIWF_IDLE_EXIT_S": "0"})
    relay = relays.start()
    with websocket(relay.url) as remote:
        hello_of(remote)
        assert server.terminate() == 0
        assert closed_with(remote) == (1000, "the piwf server closed the connection")
    assert relay.alive(), "the relay outlives the server; a new connection needs a new server"


def test_without_a_server_the_relay_answers_503_and_the_client_says_so(
    relays: RelayFactory,
) -> None:
    relay = relays.start()
    with pytest.raises(InvalidStatus) as refused:
        connect(relay.url, proxy=None, open_timeout=10)
    assert refused.value.response.status_code == 503
    with Client(remote=relay.url) as remote, pytest.raises(ServerNotRunningError) as error:
        remote.server_status()
    assert "no piwf server is running on the relay's machine" in str(error.value)
    assert "piwf server start" in str(error.value)


def test_an_oversized_message_closes_only_that_connection_and_never_reaches_the_server(
    server: ServerProcess, relays: RelayFactory
) -> None:
    relay = relays.start()
    base = len(request_frame("big", "server.status", payload={"pad": ""}))
    # The largest body a frame can hold (limit less its LF) still reaches the server...
    pad = "x" * (MAX_FRAME_BYTES - 1 - base)
    largest = request_frame("big", "server.status", payload={"pad": pad})
    assert len(largest) == MAX_FRAME_BYTES - 1
    alone = server_connections(server)
    with websocket(relay.url, max_size=None) as remote:
        hello_of(remote)
        remote.send(largest)
        answer = parse_server_message(next_message(remote))
        assert isinstance(answer, Response) and answer.request_id == "big", answer
    # The relay closes that pair's server side on its own time: wait for it before counting.
    wait_for(lambda: server_connections(server) == alone, DEADLINE_S, "the first pair gone")
    # ...one byte more is refused by the relay: the server answers nothing, no frame went in.
    with websocket(relay.url) as remote, websocket(relay.url) as bystander:
        hello_of(remote)
        hello_of(bystander)
        remote.send(largest + b" ")
        code, reason = closed_with(remote)
        assert code == 1009, (code, reason)
        assert str(MAX_FRAME_BYTES - 1) in reason, reason
        bystander.send(request_frame("still", "server.status"))
        reply = parse_server_message(next_message(bystander))
        assert isinstance(reply, Response) and reply.outcome == "accepted"
        wait_for(lambda: server_connections(server) == alone + 1, DEADLINE_S, "one pair gone")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (b'{"a":1}\n{"b":2}', (1008, "not a piwf.client.v1 frame: a frame body must not")),
        (b"", (1008, "not a piwf.client.v1 frame: empty frame")),
        ("text", (1003, "piwf.client.v1 frames travel as binary messages")),
    ],
    ids=["embedded-newline", "empty", "text"],
)
def test_a_message_that_is_no_frame_closes_the_connection_with_the_rule(
    server: ServerProcess, relays: RelayFactory, message: bytes | str, expected: tuple[int, str]
) -> None:
    relay = relays.start()
    with websocket(relay.url) as remote:
        hello_of(remote)
        remote.send(message)
        code, reason = closed_with(remote)
    assert code == expected[0] and reason.startswith(expected[1]), (code, reason)


def test_a_browser_request_is_refused(server: ServerProcess, relays: RelayFactory) -> None:
    relay = relays.start()
    alone = server_connections(server)
    with pytest.raises(InvalidStatus) as refused:
        browser = Origin("http://example.com")
        connect(relay.url, proxy=None, origin=browser, open_timeout=10)
    assert refused.value.response.status_code == 403
    assert b"serves no browser" in refused.value.response.body
    assert server_connections(server) == alone, "no server connection was opened for it"


def _refusal_seen_by_nobody(url: str) -> str:
    """Open a WebSocket to ``url`` as uid 65534 with the same client as every other test;
    return ``"<status> <body>"`` when refused, else ``"admitted"``."""
    import encodings.idna  # noqa: F401  (the client encodes the host; the child cannot import)

    def connect_once() -> str:
        try:
            with connect(url, proxy=None, compression=None, open_timeout=10):
                return "admitted"
        except InvalidStatus as refused:
            body = refused.response.body.decode(errors="replace").strip()
            return f"{refused.response.status_code} {body}"

    return as_uid(NOBODY_UID, connect_once)


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as another user needs root")
def test_a_connection_from_another_user_is_refused_before_the_server_hears_of_it(
    server: ServerProcess, relays: RelayFactory
) -> None:
    relay = relays.start()
    alone = server_connections(server)
    assert _refusal_seen_by_nobody(relay.url) == (
        f"403 the piwf relay serves only its own user (uid 0), not uid {NOBODY_UID}"
    )
    assert server_connections(server) == alone
    with websocket(relay.url) as mine:  # the relay's own user is still served
        hello_of(mine)
    assert relay.stop() == 0
    assert relay.stderr() == f"piwf relay: refused a connection from uid {NOBODY_UID}\n"


def test_sigterm_closes_every_pair_and_the_relay_exits_0(
    server: ServerProcess, relays: RelayFactory
) -> None:
    relay = relays.start()
    alone = server_connections(server)
    with websocket(relay.url) as first, websocket(relay.url) as second:
        hello_of(first)
        hello_of(second)
        wait_for(lambda: server_connections(server) == alone + 2, DEADLINE_S, "both pairs")
        relay.process.terminate()
        assert closed_with(first) == (1001, "the piwf relay is stopping")
        assert closed_with(second) == (1001, "the piwf relay is stopping")
    assert relay.process.wait(timeout=15) == 0
    assert relay.stderr() == "", "the relay logs nothing of its connections"
    wait_for(lambda: server_connections(server) == alone, DEADLINE_S, "the pairs' server side")


def test_a_remote_client_without_a_relay_fails_at_once(short_home: Path) -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        with Client(remote=f"ws://127.0.0.1:{port}") as remote:
            with pytest.raises(ServerUnavailableError, match="is `piwf relay` running"):
                remote.server_status()


def test_a_port_in_use_is_a_runtime_error_naming_it(relays: RelayFactory) -> None:
    first = relays.start()
    port = first.url.rsplit(":", 1)[1]
    second = subprocess.run(
        [sys.executable, "-m", "piwf", "relay", "--listen", f"127.0.0.1:{port}", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PIWF_HOME": str(relays.home)},
    )
    assert second.returncode == 1, second
    error = json.loads(second.stdout)["error"]
    assert error["code"] == "relayError"
    assert error["message"] == (
        f"piwf relay cannot listen on ws://127.0.0.1:{port}: port {port} is in use (another "
        "relay?); stop what listens there or choose another port (127.0.0.1:0 picks a free "
        "one), and forward the SSH tunnel to that port"
    )
    assert first.alive()
