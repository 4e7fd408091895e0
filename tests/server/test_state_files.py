"""Real servers on damaged and mispaired state files, on unsafe socket paths, and at the JSON
value limits: verify reports damage, a foreign WAL stops the start with nothing changed, the
client refuses a socket it must not follow (and the server behind it sees no connection), and
values the protocol refuses fail in the client before anything is sent, and in the server too.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piwf.client import Client, launcher
from piwf.client.sockets import UnsafeSocketError
from piwf.config import ServerPaths
from piwf.errors import CanonicalJsonError
from piwf.state import StateDatabase
from piwf.state.backup import backup_database
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client
from tests.state.files import (
    REPO,
    crash_piwf_writer,
    make_database,
    overwrite,
    private_copy,
    snapshot,
    table_leaf_page,
)

HELLO = str(REPO / "fixtures" / "workflows" / "hello.py")
QUIET = {"PIWF_IDLE_EXIT_S": "0"}


def connection_number(server: ServerProcess) -> int:
    """The number of a fresh connection to ``server``: ids count up by one per accepted
    connection, so two calls one apart prove the server accepted nothing in between."""
    with raw_client(server, "counter") as client:
        prefix, _, number = client.hello.connection_id.rpartition("-")
    assert prefix == "connection"
    return int(number)


def discard_state(home: Path) -> None:
    """Remove a deliberately damaged database so the fixture's final verify skips it."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{home / 'state.sqlite'}{suffix}").unlink(missing_ok=True)


# -- live verify of damage --------------------------------------------------------------------


def start_on(servers: ServerFactory, prepare: Any) -> ServerProcess:
    home = servers.home
    home.mkdir(mode=0o700)
    database = home / "state.sqlite"
    make_database(database, blobs=200, projects=3)
    prepare(database)
    # The open check would refuse a damaged file at start (tests/server/test_corrupt_state.py
    # proves that); it is off here so that a live server meets the damage later, in verify.
    started = servers.start(env={**QUIET, "PIWF_QUICK_CHECK_S": "0"})
    assert started.ready.get("ok") is True, started.ready
    return started


def damage_table_page(database: Path) -> None:
    leaf, page_size = table_leaf_page(database, "blobs")
    overwrite(database, (leaf - 1) * page_size, b"\x00" * 8)


def test_live_verify_reports_a_damaged_table_page_as_integrity_violations(
    servers: ServerFactory,
) -> None:
    # A truncated file, a damaged header, a non-SQLite or empty file cannot be opened by a
    # server at all (or, empty, becomes a new database); offline verify covers those.
    server = start_on(servers, damage_table_page)
    try:
        with Client(servers.home, autostart=False) as client:
            receipt = client.state_verify()
            assert receipt.valid is False
            assert receipt.violations
            assert {violation.code for violation in receipt.violations} == {"integrity"}
            assert client.server_status().state == "running", "the server answers on"
    finally:
        assert server.terminate() in (0, 1)
        discard_state(servers.home)


# -- a foreign WAL at server start ------------------------------------------------------------


def test_a_server_does_not_start_on_a_backup_copied_beside_a_crashed_wal(
    servers: ServerFactory, tmp_path: Path
) -> None:
    home = servers.home
    home.mkdir(mode=0o700)
    database = home / "state.sqlite"
    make_database(database)
    backup = tmp_path / "backup.sqlite"
    with StateDatabase(database) as live:
        backup_database(live, backup)
    crash_piwf_writer(database, rows=10)
    private_copy(backup, database)  # "restoring" by copying over the live file
    before = snapshot(home)

    started = servers.start(env=QUIET)
    assert started.ready.get("ok") is False
    assert started.ready["error"]["code"] == "foreignWal", started.ready
    assert "piwf state restore" in started.ready["error"]["message"]
    assert started.process.wait(timeout=30) == 1
    after = {name: value for name, value in snapshot(home).items() if name.startswith("state")}
    assert after == {name: v for name, v in before.items() if name.startswith("state")}
    discard_state(home)


# -- socket safety ----------------------------------------------------------------------------


@pytest.fixture
def other_server() -> Iterator[ServerProcess]:
    """A live server in a second home (the one a planted symlink points into)."""
    root = Path(tempfile.mkdtemp(prefix="po", dir="/tmp"))
    factory = ServerFactory(root / "h")
    try:
        started = factory.start(env=QUIET)
        assert started.ready.get("ok") is True, started.ready
        yield started
    finally:
        factory.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def assert_refused_without_connecting(home: Path, target: ServerProcess, match: str) -> None:
    first = connection_number(target)
    for autostart in (False, True):
        with pytest.raises(UnsafeSocketError, match=match) as refused:
            Client(home, autostart=autostart, retry_timeout_s=1).connect()
        assert refused.value.code == "unsafeSocket"
    with pytest.raises(UnsafeSocketError):
        launcher.start_server(home, timeout_s=5)
    assert connection_number(target) == first + 1, "the other server received a connection"


def test_a_socket_symlink_into_another_home_is_refused(
    short_home: Path, other_server: ServerProcess
) -> None:
    ServerPaths(short_home).server_dir.mkdir(mode=0o700, parents=True)
    ServerPaths(short_home).socket.symlink_to(other_server.socket_path)
    assert_refused_without_connecting(short_home, other_server, "is a symlink, not this")
    assert not (short_home / "state.sqlite").exists(), "no server started for the home"


def test_a_server_directory_symlink_is_refused(
    short_home: Path, other_server: ServerProcess
) -> None:
    short_home.mkdir(mode=0o700)
    ServerPaths(short_home).server_dir.symlink_to(other_server.socket_path.parent)
    assert_refused_without_connecting(short_home, other_server, "server is a symlink")


def test_a_home_symlink_is_refused(short_home: Path, other_server: ServerProcess) -> None:
    short_home.symlink_to(other_server.home)
    assert_refused_without_connecting(short_home, other_server, "is a symlink; piwf does not")


def test_a_socket_path_that_is_not_a_socket_is_refused(short_home: Path) -> None:
    ServerPaths(short_home).server_dir.mkdir(mode=0o700, parents=True)
    ServerPaths(short_home).socket.write_bytes(b"")
    with pytest.raises(UnsafeSocketError, match="is not a socket"):
        Client(short_home, autostart=False).connect()


def test_a_home_that_is_a_file_is_refused_with_what_to_do(short_home: Path) -> None:
    short_home.write_bytes(b"a file in the way")
    for autostart in (False, True):
        with pytest.raises(UnsafeSocketError, match="is not a directory") as refused:
            Client(short_home, autostart=autostart, retry_timeout_s=1).connect()
        assert "set PIWF_HOME to another directory" in str(refused.value)
    assert short_home.read_bytes() == b"a file in the way"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can chown a socket to another user")
def test_a_socket_owned_by_another_user_is_refused(short_home: Path) -> None:
    paths = ServerPaths(short_home)
    paths.server_dir.mkdir(mode=0o700, parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(paths.socket))
        listener.listen(8)
        os.chown(paths.socket, 65534, 65534)
        with pytest.raises(UnsafeSocketError, match="belongs to another user"):
            Client(short_home, autostart=False).connect()
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    finally:
        listener.close()


def test_the_cli_reports_an_unsafe_socket(short_home: Path, other_server: ServerProcess) -> None:
    ServerPaths(short_home).server_dir.mkdir(mode=0o700, parents=True)
    ServerPaths(short_home).socket.symlink_to(other_server.socket_path)
    first = connection_number(other_server)
    env = {**os.environ, "PIWF_HOME": str(short_home)}
    for command in (["server", "status"], ["run", "list"], ["server", "start"]):
        result = subprocess.run(
            [str(Path(sys.executable).parent / "piwf"), *command, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert '"code":"unsafeSocket"' in result.stdout
    assert connection_number(other_server) == first + 1, "the other server saw a connection"


# -- JSON values at the protocol's limits -----------------------------------------------------

REFUSED_VALUES: list[tuple[object, str]] = [
    ({"n": 2**53}, "unsafeInteger"),
    ({"n": -(2**53)}, "unsafeInteger"),
    ({"n": 2**53 + 1}, "unsafeInteger"),
    ({"n": 2.0**53}, "unsafeInteger"),
    ({"n": 1e20}, "unsafeInteger"),
    ({"n": float("nan")}, "nonFinite"),
    ({"n": float("inf")}, "nonFinite"),
    ({"s": "\ud800"}, "loneSurrogate"),
    ({"n": b"bytes"}, "unsupportedType"),
]


def test_client_refuses_values_beyond_the_protocol_before_sending(server: ServerProcess) -> None:
    with Client(server.home, autostart=False) as client:
        accepted = client.start_run(HELLO, input={"who": "x", "n": 2**53 - 1, "f": 1e21})
        assert accepted.status == "queued"
    first = connection_number(server)
    for value, reason in REFUSED_VALUES:
        with Client(server.home, autostart=False) as client:
            calls: list[tuple[str, Callable[[Any], object]]] = [
                ("input", lambda given: client.start_run(HELLO, input=given)),
                ("response", lambda given: client.answer("req-1", given)),
                ("spec", lambda given: client.apply_resource("m", "k", given)),
            ]
            for name, call in calls:
                with pytest.raises(CanonicalJsonError) as refused:
                    call(value)
                assert refused.value.reason == reason, (value, name)
                assert str(refused.value).startswith(f"{name}: "), str(refused.value)
    assert connection_number(server) == first + 1, "a refused value reached the server"


def test_the_server_refuses_an_unsafe_integer_frame(server: ServerProcess) -> None:
    with Client(server.home, autostart=False) as client:
        runs_before = len(client.list_runs().runs)
    frame = (
        b'{"clientId":"c","idempotencyKey":"k","operation":"run.start","payload":'
        b'{"input":{"n":9007199254740992},"projectPath":"/","workflow":"'
        + HELLO.encode()
        + b'"},"requestId":"r","schema":"piwf.client.v1","type":"request"}\n'
    )
    offender = RawClient(server.socket_path, "offender")
    try:
        offender.send_bytes(frame)
        response = offender.response()
        assert response.outcome == "rejected"
        assert response.error is not None and response.error.code == "invalidJson"
        assert "9007199254740991" in response.error.message
        assert offender.closed_by_server()
    finally:
        offender.close()
    with Client(server.home, autostart=False) as client:
        assert len(client.list_runs().runs) == runs_before
