"""Bad input, slow clients and foreign users against a real server (testing.md B1-B14, S6-S12).

Each bad-input case checks three things: the offending connection gets a typed error or is
closed, the server keeps answering other clients, and nothing in the state changed. The bad
frames go, one case after another, to one server of this module: each case still checks that
it changed nothing and left the others served, and the server must take them all in turn.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.config import MAX_FRAME_BYTES
from tests.server.harness import (
    NOBODY_UID,
    RawClient,
    ServerFactory,
    ServerProcess,
    as_uid,
    raw_client,
)


def state_fingerprint(server: ServerProcess) -> dict[str, object]:
    with raw_client(server, "observer") as client:
        status = client.request("state.status").receipt
    assert status is not None
    return {key: status[key] for key in ("runs", "events", "blobs", "activeLeases")}


def assert_server_healthy(server: ServerProcess) -> None:
    with raw_client(server, "healthy") as client:
        assert client.request("server.status").outcome == "accepted"


def request_frame(request_id: str = "r1") -> bytes:
    return (
        b'{"clientId":"c","operation":"server.status","payload":{}'
        + b',"requestId":"'
        + request_id.encode()
        + b'","schema":"piwf.client.v1","type":"request"}'
    )


BAD_FRAMES: dict[str, bytes] = {
    "not JSON": b"hello\n",
    "top level array": b"[1,2]\n",
    "trailing garbage": request_frame() + b" x\n",
    "NaN": b'{"a":NaN}\n',
    "Infinity": b'{"a":Infinity}\n',
    "1e400": b'{"a":1e400}\n',
    "duplicate keys": b'{"a":1,"a":2}\n',
    "lone surrogate": b'{"a":"\\ud800"}\n',
    "deep nesting": b"[" * 10_000 + b"]" * 10_000 + b"\n",
    "5000-digit integer": b'{"a":' + b"1" * 5000 + b"}\n",
    "non-canonical whitespace": request_frame().replace(b":", b": ", 1) + b"\n",
    "unsorted keys": b'{"type":"request","clientId":"c"}\n',
    "invalid UTF-8": b'{"a":"\xff"}\n',
    "UTF-8 BOM": b"\xef\xbb\xbf" + request_frame() + b"\n",
    "NUL byte": request_frame()[:-1] + b"\x00}\n",
    "CRLF terminator": request_frame() + b"\r\n",
    "unknown field": b'{"aaa":1,"clientId":"c","operation":"server.status","payload":{},'
    b'"requestId":"r","schema":"piwf.client.v1","type":"request"}\n',
    "missing field": b'{"clientId":"c","operation":"server.status","requestId":"r",'
    b'"schema":"piwf.client.v1","type":"request"}\n',
    "wrong type": b'{"clientId":"c","operation":"server.status","payload":[],"requestId":"r",'
    b'"schema":"piwf.client.v1","type":"request"}\n',
    "bool as revision": b'{"clientId":"c","expectedRevision":true,"operation":"server.status",'
    b'"payload":{},"requestId":"r","schema":"piwf.client.v1","type":"request"}\n',
    "empty idempotency key": b'{"clientId":"c","idempotencyKey":"","operation":"run.cancel",'
    b'"payload":{},"requestId":"r","runId":"x","schema":"piwf.client.v1","type":"request"}\n',
    "oversized idempotency key": b'{"clientId":"c","idempotencyKey":"'
    + b"k" * 257
    + b'","operation":"run.cancel","payload":{},"requestId":"r","runId":"x",'
    b'"schema":"piwf.client.v1","type":"request"}\n',
    "unknown operation": b'{"clientId":"c","operation":"run.explode","payload":{},'
    b'"requestId":"r","schema":"piwf.client.v1","type":"request"}\n',
    "response sent by a client": b'{"outcome":"accepted","requestId":"r",'
    b'"schema":"piwf.client.v1","type":"response"}\n',
}


@pytest.fixture(scope="module")
def bad_frames_server() -> Iterator[ServerProcess]:
    """One server, with the short frame deadline of ``server``, for every bad-frame case."""
    root = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    factory = ServerFactory(root / "h")
    try:
        started = factory.start(env={"PIWF_FRAME_DEADLINE_S": "1", "PIWF_IDLE_EXIT_S": "0"})
        assert started.ready.get("ok") is True, started.ready
        yield started
    finally:
        factory.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_a_bad_frame_gets_a_typed_error_and_closes_only_its_connection(
    bad_frames_server: ServerProcess, case: str
) -> None:
    server = bad_frames_server
    assert server.alive(), "an earlier bad frame ended the server"
    before = state_fingerprint(server)
    bystander = RawClient(server.socket_path, "bystander")
    offender = RawClient(server.socket_path, "offender")
    try:
        offender.send_bytes(BAD_FRAMES[case])
        response = offender.response()
        assert response.outcome == "rejected"
        assert response.error is not None
        assert response.error.code in {"invalidJson", "invalidMessage", "badFrame"}
        assert offender.closed_by_server()
        assert bystander.request("server.status").outcome == "accepted"
    finally:
        offender.close()
        bystander.close()
    assert state_fingerprint(server) == before


def test_a_stream_that_ends_inside_a_frame_is_refused_as_truncated(
    bad_frames_server: ServerProcess,
) -> None:
    server = bad_frames_server
    before = state_fingerprint(server)
    with raw_client(server, "half-closer") as client:
        client.send_bytes(request_frame("done") + b"\n" + request_frame("cut")[:30])
        client.sock.shutdown(socket.SHUT_WR)  # it still reads
        assert client.response().request_id == "done"
        refusal = client.response()
        assert refusal.outcome == "rejected"
        assert refusal.error is not None
        assert refusal.error.code == "badFrame"
        assert "ended in the middle of a frame" in refusal.error.message
        assert client.closed_by_server()
    assert_server_healthy(server)
    assert state_fingerprint(server) == before


def test_frames_up_to_the_limit_are_read_and_one_byte_more_is_refused(
    server: ServerProcess,
) -> None:
    base = request_frame()
    filler = MAX_FRAME_BYTES - len(base) - len(b"\n") - len(b'"pad":""')
    at_limit = base.replace(b'"payload":{}', b'"payload":{"pad":"' + b"p" * filler + b'"}')
    assert len(at_limit) + 1 == MAX_FRAME_BYTES
    with raw_client(server) as client:
        client.send_bytes(at_limit + b"\n")
        response = client.response()
        # The frame was read whole; server.status refuses its unknown payload field.
        assert response.outcome == "rejected"
        assert response.error is not None
        assert response.error.code == "invalidPayload"
    over = base.replace(b'"payload":{}', b'"payload":{"pad":"' + b"p" * (filler + 1) + b'"}')
    with raw_client(server) as client:
        client.send_bytes(over + b"\n")
        response = client.response()
        assert response.error is not None
        assert response.error.code == "frameTooLarge"
        assert client.closed_by_server()
    assert_server_healthy(server)


def test_an_endless_line_is_cut_off_at_the_limit(server: ServerProcess) -> None:
    client = RawClient(server.socket_path)
    sent = 0
    try:
        chunk = b"x" * 65536
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while sent < 100 * 1024 * 1024:
                client.sock.sendall(chunk)
                sent += len(chunk)
    finally:
        client.close()
    assert sent < 8 * MAX_FRAME_BYTES, "the server stopped reading soon after the limit"
    assert_server_healthy(server)


def test_ten_thousand_pipelined_requests_are_all_answered_in_order(
    server: ServerProcess,
) -> None:
    frames = b"".join(request_frame(f"r{i}") + b"\n" for i in range(10_000))
    with raw_client(server) as client:
        client.sock.sendall(frames)
        ids = [client.response().request_id for _ in range(10_000)]
    assert ids == [f"r{i}" for i in range(10_000)]


def test_a_silent_half_frame_does_not_delay_another_client(server: ServerProcess) -> None:
    silent = RawClient(server.socket_path, "silent")
    try:
        silent.send_bytes(request_frame()[:20])  # half a frame, then nothing
        with raw_client(server, "other") as other:
            assert other.request("server.status").outcome == "accepted"
            # The silent client is still connected: the answer did not wait for its deadline.
            readable, _, _ = select.select([silent.sock], [], [], 0)
            assert readable == []
        assert silent.closed_by_server(timeout_s=10), "the frame deadline closes it"
    finally:
        silent.close()


def test_a_client_that_never_reads_is_cut_off_without_harming_others(
    server: ServerProcess,
) -> None:
    hog = RawClient(server.socket_path, "hog")
    hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    frames = b"".join(request_frame(f"h{i}") + b"\n" for i in range(2_000))
    try:
        closed = False
        for _ in range(60):  # up to 120,000 requests whose answers are never read
            try:
                hog.sock.sendall(frames)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            assert_server_healthy(server)
        assert closed, "the server closes a connection whose output passes its cap"
    finally:
        hog.close()
    assert_server_healthy(server)


def test_a_client_of_another_user_is_refused(server: ServerProcess) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to another uid (CI runs as root)")
    outcome = _connect_as_nobody(server.socket_path)
    assert outcome in {"EACCES", "closed"}, outcome
    assert_server_healthy(server)


def test_a_foreign_uid_is_rejected_by_peer_credentials_even_with_open_permissions(
    server: ServerProcess,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to another uid (CI runs as root)")
    # Test-only: open the directory and socket so the kernel lets the other uid connect; the
    # SO_PEERCRED check must still refuse it.
    opened = [server.home.parent, server.home, server.home / "server"]
    for directory in opened:
        directory.chmod(0o755)
    server.socket_path.chmod(0o666)
    try:
        assert _connect_as_nobody(server.socket_path) == "closed"
    finally:
        server.socket_path.chmod(0o600)
        for directory in opened:
            directory.chmod(0o700)
    assert_server_healthy(server)
    log = (server.home / "server" / "server.log").read_text()
    assert "refused a client with uid 65534" in log


def _connect_as_nobody(path: Path) -> str:
    """Try the socket as uid 65534; return EACCES, closed or answered."""

    def connect() -> str:  # no SQLite, no exec, just a socket
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        try:
            sock.connect(str(path))
        except PermissionError:
            return "EACCES"
        try:
            return "answered" if sock.recv(4096) else "closed"
        except (ConnectionResetError, TimeoutError):
            return "closed"

    return as_uid(NOBODY_UID, connect)
