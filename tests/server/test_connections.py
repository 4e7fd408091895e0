"""Connections survive exhaustion and hostile clients, against real server processes.

Idle connections at the limit are shed for new clients, silent ones are closed at the
first-frame deadline, a client is refused with a typed error only when every connection is
busy, the Python client reconnects transparently after any of that, running out of descriptors
neither spins the server nor floods its log, and a client that never reads is cut off.
"""

from __future__ import annotations

import resource
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import psutil
import pytest

from piwf.client import Client
from piwf.errors import ServerUnavailableError
from piwf.protocol.client_v1 import Hello, Response, parse_server_message
from piwf.protocol.framing import FrameDecoder
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for

STATUS_FRAME = (
    b'{"clientId":"c","operation":"server.status","payload":{},"requestId":"r1",'
    b'"schema":"piwf.client.v1","type":"request"}\n'
)
HALF_FRAME = b'{"clientId":'


def start(servers: ServerFactory, **env: str) -> ServerProcess:
    """A server with ``env`` on top (its start helpers run from its start: its descriptors
    stay put)."""
    settings = {"PIWF_IDLE_EXIT_S": "0", "PIWF_FRAME_DEADLINE_S": "60"}
    started = servers.start(env={**settings, **env})
    assert started.ready.get("ok") is True, started.ready
    return started


def server_log(server: ServerProcess) -> str:
    return (server.home / "server" / "server.log").read_text()


def is_open(client: RawClient) -> bool:
    """Whether the server still holds the connection (nothing to read, not closed)."""
    readable, _, _ = select.select([client.sock], [], [], 0)
    return not readable


def busy_client(server: ServerProcess, name: str) -> RawClient:
    """A connection the server cannot shed: it holds half a frame once the answer is back."""
    client = RawClient(server.socket_path, name)
    client.send_bytes(STATUS_FRAME + HALF_FRAME)  # one write: the server reads both at once
    assert client.response().outcome == "accepted"
    return client


@contextmanager
def opened(*clients: RawClient) -> Iterator[list[RawClient]]:
    with ExitStack() as stack:
        for client in clients:
            stack.callback(client.close)
        yield list(clients)


def first_message(sock: socket.socket) -> object:
    """The first message the server sends on a fresh connection, or None if it just closes."""
    decoder = FrameDecoder()
    sock.settimeout(10)
    while True:
        data = sock.recv(65536)
        if not data:
            return None
        frames = decoder.feed(data)
        if frames:
            return parse_server_message(frames[0])


def test_idle_connections_at_the_limit_are_shed_for_a_new_client(servers: ServerFactory) -> None:
    server = start(servers, PIWF_MAX_CONNECTIONS="3", PIWF_FIRST_FRAME_DEADLINE_S="120")
    idle = [RawClient(server.socket_path, f"idle-{n}") for n in range(3)]
    with opened(*idle), Client(server.home, autostart=False) as client:
        # At the limit the client is refused until an idle connection is old enough to shed;
        # the client retries that on its own.
        status = client.server_status()
        assert status.connections <= 3
        wait_for(lambda: not is_open(idle[0]), what="the oldest idle connection to close")
        assert idle[0].closed_by_server(timeout_s=10)
        assert is_open(idle[1]) and is_open(idle[2]), "only the one idle longest was shed"
        assert client.server_status().state == "running"
    assert "idle longest at the limit of 3 connections" in server_log(server)


def test_a_client_is_refused_with_a_typed_error_only_when_every_connection_is_busy(
    servers: ServerFactory,
) -> None:
    server = start(servers, PIWF_MAX_CONNECTIONS="2")
    with opened(busy_client(server, "busy-1"), busy_client(server, "busy-2")) as busy:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as refused:
            refused.connect(str(server.socket_path))
            message = first_message(refused)
            assert isinstance(message, Response), message
            assert message.outcome == "unavailable"
            assert message.error is not None
            assert message.error.code == "tooManyConnections"
            assert refused.recv(65536) == b"", "then the server closes it"
        with Client(server.home, autostart=False, retry_timeout_s=0.5) as client:
            with pytest.raises(ServerUnavailableError, match="tooManyConnections"):
                client.server_status()
        busy[0].close()
        with Client(server.home, autostart=False) as client:
            assert client.server_status().state == "running", "served once a slot is free"
        assert is_open(busy[1]), "a busy connection is never shed"
    assert "refused a client: all 2 connections are busy" in server_log(server)


def test_a_connection_that_sends_nothing_is_closed_at_the_first_frame_deadline(
    servers: ServerFactory,
) -> None:
    server = start(servers, PIWF_FIRST_FRAME_DEADLINE_S="0.5")
    with raw_client(server, "talker") as talker:
        assert talker.request("server.status").outcome == "accepted"
        with raw_client(server, "silent") as silent:
            assert silent.closed_by_server(timeout_s=10), "the deadline closes a silent one"
        # The talker was accepted first, so its deadline passed too: one request is enough.
        assert is_open(talker)
        assert talker.request("server.status").outcome == "accepted"
    assert "it sent nothing after connecting" in server_log(server)


def test_the_python_client_reconnects_when_the_server_closes_its_idle_connection(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start(servers, PIWF_FIRST_FRAME_DEADLINE_S="0.5", PIWF_MAX_CONNECTIONS="1")
    with Client(server.home, autostart=False) as client:
        first = client.connect()
        # Connected without a request: the first-frame deadline closes it under the client.
        wait_for(lambda: "it sent nothing after connecting" in server_log(server))
        assert client.server_status().state == "running", "a read reconnects"
        assert client.hello is not None
        assert client.hello.connection_id != first.connection_id
        # Idle after its request, the client's connection is shed for a newcomer at the limit.
        newcomer = wait_for(lambda: _hello_or_none(server), what="a slot for the newcomer")
        with opened(newcomer):
            assert newcomer.request("server.status").outcome == "accepted"
        receipt = client.backup(tmp_path / "copy.sqlite", idempotency_key="backup-1")
        assert receipt.bytes > 0 and (tmp_path / "copy.sqlite").exists()
        again = client.backup(tmp_path / "copy.sqlite", idempotency_key="backup-1")
        assert again == receipt, "the durable command ran once; the retry adopted it"
    assert "idle longest at the limit of 1 connections" in server_log(server)


def _hello_or_none(server: ServerProcess) -> RawClient | None:
    try:
        return RawClient(server.socket_path, "newcomer")
    except (AssertionError, ConnectionError, OSError):
        return None  # refused while the only connection was busy or in use too recently


@contextmanager
def descriptor_limit(server: ServerProcess, spare: int) -> Iterator[psutil.Process]:
    """Lower the server's RLIMIT_NOFILE to what it holds now plus ``spare``; restore after."""
    process = psutil.Process(server.process.pid)
    soft, hard = process.rlimit(resource.RLIMIT_NOFILE)
    process.rlimit(resource.RLIMIT_NOFILE, (process.num_fds() + spare, hard))
    try:
        yield process
    finally:
        if process.is_running():
            process.rlimit(resource.RLIMIT_NOFILE, (soft, hard))


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def observe(seconds: float) -> None:
    """An observation window: the test measures what the server does meanwhile."""
    select.select([], [], [], seconds)


ACCEPT_FAILED = "accept failed (Too many open files)"


def readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def read_frames(sock: socket.socket, decoder: FrameDecoder, count: int) -> list[object]:
    """The next ``count`` messages on ``sock`` (bounded by the socket timeout)."""
    sock.settimeout(10)
    messages: list[object] = []
    while len(messages) < count:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        messages.extend(parse_server_message(frame) for frame in decoder.feed(data))
    return messages


def fill_descriptors(
    server: ServerProcess, stack: ExitStack, *, busy: bool
) -> tuple[list[socket.socket], socket.socket]:
    """Open connections until the server has no descriptor left; return them and the waiting one.

    The limit is lowered beforehand, but the exact number of free descriptors is not known (a
    descriptor the server is just closing may count), so connections are opened until one is
    left in the backlog and the server logs the failed accept. Admitted ones are made busy (a
    request and half a frame in one write, answered) or left idle; ``stack`` closes them all.
    """
    log = server.home / "server" / "server.log"
    admitted: list[socket.socket] = []
    for _ in range(32):
        sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        sock.connect(str(server.socket_path))
        wait_for(lambda: readable(sock) or ACCEPT_FAILED in log.read_text())  # noqa: B023
        if not readable(sock):
            return admitted, sock
        decoder = FrameDecoder()
        assert isinstance(read_frames(sock, decoder, 1)[0], Hello)
        if busy:
            sock.sendall(STATUS_FRAME + HALF_FRAME)
            answer = read_frames(sock, decoder, 1)[0]
            assert isinstance(answer, Response) and answer.outcome == "accepted"
        admitted.append(sock)
    raise AssertionError("the server never ran out of descriptors")


def test_running_out_of_descriptors_neither_spins_nor_floods_the_log(
    servers: ServerFactory,
) -> None:
    server = start(servers)
    log = server.home / "server" / "server.log"
    with ExitStack() as stack, descriptor_limit(server, spare=4) as process:
        busy, waiting = fill_descriptors(server, stack, busy=True)
        cpu_before, log_before = cpu_seconds(process), log.stat().st_size
        observe(2.0)
        # A spinning loop would burn about 2 s of CPU and write megabytes in this window.
        assert cpu_seconds(process) - cpu_before < 0.5
        assert log.stat().st_size - log_before < 4096
        for sock in busy:
            sock.close()  # their descriptors are free again
        assert isinstance(first_message(waiting), Hello), "the waiting client is accepted"
    with Client(server.home, autostart=False) as client:
        assert client.server_status().state == "running"
    assert "accepting clients again after" in server_log(server)


def test_out_of_descriptors_an_idle_connection_is_shed_for_a_waiting_client(
    servers: ServerFactory,
) -> None:
    server = start(servers, PIWF_FIRST_FRAME_DEADLINE_S="120")
    with ExitStack() as stack, descriptor_limit(server, spare=4):
        idle, waiting = fill_descriptors(server, stack, busy=False)
        assert len(idle) >= 2
        assert isinstance(first_message(waiting), Hello), "an idle one made room"
        assert closed(idle[0]), "the one idle longest was shed"
        assert not any(readable(sock) for sock in idle[1:]), "and only that one"
        with Client(server.home, autostart=False) as client:
            assert client.server_status().state == "running"
    assert "idle longest, to free a descriptor" in server_log(server)


def closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (its hello was read already) within 10 s."""
    sock.settimeout(10)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_pipelining_client_that_never_reads_is_cut_off_at_the_cap_while_others_are_served(
    servers: ServerFactory,
) -> None:
    # One read of requests (64 KiB) brings more answers than this cap, so the backlog passes it.
    server = start(servers, PIWF_OUTPUT_CAP_BYTES=str(64 * 1024))
    frames = b"".join(
        STATUS_FRAME.replace(b'"r1"', f'"s{n}"'.encode())
        + STATUS_FRAME.replace(b"server.status", b"run.list").replace(b'"r1"', f'"l{n}"'.encode())
        for n in range(2_000)
    )
    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect(str(server.socket_path))
    cut_off = threading.Event()

    def flood() -> None:
        try:
            for _ in range(100):  # bounded: 400,000 requests whose answers are never read
                hog.sendall(frames)
        except OSError:
            cut_off.set()

    flooder = threading.Thread(target=flood, daemon=True)
    try:
        with raw_client(server, "other") as other:
            flooder.start()
            for _ in range(100_000):  # bounded; ends when the non-reader is cut off
                assert other.request("server.status").outcome == "accepted"
                if cut_off.is_set():
                    break
            assert cut_off.is_set(), "the non-reader is closed once its output passes the cap"
            assert other.request("server.status").outcome == "accepted"
    finally:
        hog.close()
        flooder.join(timeout=30)
    assert "it does not read its responses" in server_log(server)


def test_output_that_makes_no_progress_closes_the_connection_at_the_stall_deadline(
    servers: ServerFactory,
) -> None:
    server = start(servers, PIWF_OUTPUT_STALL_DEADLINE_S="0.5")
    log = server.home / "server" / "server.log"
    stalled = RawClient(server.socket_path, "stalled")
    try:
        # About 700 KiB of answers: more than the socket buffers hold, far below half the cap.
        # On a loaded machine the deadline may pass while this is still being sent: the server
        # then closes the connection under the send, which is the outcome checked below.
        with suppress(BrokenPipeError, ConnectionResetError):
            stalled.send_bytes(STATUS_FRAME * 2_000)
        wait_for(lambda: "it stopped reading its responses" in log.read_text())
        assert stalled.closed_by_server(timeout_s=10)
    finally:
        stalled.close()
    with raw_client(server) as other:
        assert other.request("server.status").outcome == "accepted"
