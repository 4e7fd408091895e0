"""Real server processes and raw protocol clients for integration tests.

Servers are started the way users start them (``python -m piwf server run``) in a private
``PIWF_HOME`` under /tmp (short, so the socket path fits in ``sun_path``), report readiness on a
pipe, and are always stopped and reaped by the fixtures. Nothing here sleeps to synchronise:
waits poll a condition against a deadline.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from piwf.errors import IncompatibleStateError, StateCorruptError
from piwf.processes import is_alive
from piwf.protocol.client_v1 import (
    Hello,
    Request,
    Response,
    ServerMessage,
    encode_message,
    parse_server_message,
)
from piwf.protocol.framing import FrameDecoder
from piwf.state import StateDatabase
from piwf.state.diagnostics import find_violations

READY_TIMEOUT_S = 30.0
#: How users start an attached server; the ready descriptor is appended per start.
SERVER_COMMAND = [sys.executable, "-m", "piwf", "server", "run"]


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0, what: str = "") -> Any:
    """Poll ``condition`` until it is truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")
        select.select([], [], [], 0.02)  # a bounded poll interval, not a synchronisation sleep


#: ``[sys.executable, "-c", WITH_DEFAULT_SIGINT, program, *args]`` runs a command as a terminal
#: runs a foreground job: SIGINT at its default disposition. A test run started in the
#: background of a non-interactive shell (or under nohup) inherits SIGINT ignored, an ignored
#: signal stays ignored across exec, and Python then leaves it so: Ctrl-C (a SIGINT the test
#: sends) could never reach the command, whatever piwf does.
WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


#: The uid tests run another user's client as (``nobody`` on common distributions).
NOBODY_UID = 65534


def as_uid(uid: int, action: Callable[[], str], timeout_s: float = 30.0) -> str:
    """Run ``action`` in a forked child that dropped to ``uid`` (its group, no supplementary
    groups) and return what it returned, or ``"error: <type>: <message>"`` if it raised.

    Forked rather than a new interpreter: the test's interpreter may live under a directory
    ``uid`` cannot read (a tox environment under root's home), and a fork has every module the
    test imported already. The child opens no database and exits without cleanup.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        outcome = "error: nothing ran"
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            outcome = action()
        except BaseException as error:  # reported to the parent, which fails the test
            outcome = f"error: {type(error).__name__}: {error}"
        finally:
            os.write(write_end, outcome.encode())
            os._exit(0)
    os.close(write_end)
    try:
        wait_for(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, timeout_s, f"the child as {uid}")
        with os.fdopen(read_end, "rb", closefd=False) as reader:
            return reader.read().decode()
    finally:
        os.close(read_end)
        with suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def runner_processes(home: Path) -> list[psutil.Process]:
    """Live workflow-runner children recorded in ``home``'s database (never another test's).

    Found through ``run_runners`` (pid and exact start identity), as recovery finds them, not
    by title or environment: a runner renames itself, and its title may hide its environment.
    """
    path = home / "state.sqlite"
    if not path.exists():
        return []
    try:
        with StateDatabase(path, mode="read-only") as database, database.read() as tx:
            rows = tx.all(
                "SELECT pid, process_start_identity FROM run_runners WHERE pid IS NOT NULL"
            )
    except (IncompatibleStateError, StateCorruptError):  # unreadable: no runner to find
        return []
    found = []
    for pid, identity in rows:
        if is_alive(identity):
            with suppress(psutil.Error):
                process = psutil.Process(pid)
                if process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
    return found


@dataclass
class ServerProcess:
    """One ``piwf server run`` child process."""

    home: Path
    process: subprocess.Popen[bytes]
    ready: dict[str, Any]

    @property
    def socket_path(self) -> Path:
        return self.home / "server" / "server.sock"

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the server (a crash)."""
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)

    def terminate(self) -> int:
        """SIGTERM the server and return its exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=15)


@dataclass
class ServerFactory:
    """Starts servers for one test and reaps every one of them afterwards."""

    home: Path
    started: list[ServerProcess] = field(default_factory=list)
    #: Check the state file at cleanup; off only for a file a test damaged on purpose.
    verify: bool = True

    def start(self, *args: str, env: dict[str, str] | None = None) -> ServerProcess:
        """Start a server and wait for its ready line (which may report a failure)."""
        read_end, write_end = os.pipe()
        environment = {**os.environ, "PIWF_HOME": str(self.home), **(env or {})}
        command = [*SERVER_COMMAND, "--ready-fd", str(write_end)]
        process = subprocess.Popen(
            [*command, *args],
            pass_fds=(write_end,),
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        os.close(write_end)
        try:
            line = _read_line(read_end, READY_TIMEOUT_S)
        finally:
            os.close(read_end)
        server = ServerProcess(self.home, process, json.loads(line) if line else {})
        self.started.append(server)
        return server

    def cleanup(self) -> None:
        """Reap every server, then check the state file they left (however they ended).

        Every committed state must satisfy ``state verify``'s invariants, crash or not, so a
        test that leaves a violating database fails here.
        """
        for server in self.started:
            if server.alive():
                with suppress(ProcessLookupError):
                    os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
            if server.process.stderr is not None:
                server.process.stderr.close()
        # A runner leads its own process group and ends when its lifeline sees the server
        # gone; one a test stopped (SIGSTOP) cannot, so every recorded runner still alive is
        # killed here (identity-checked: never a reused pid).
        for runner in runner_processes(self.home):
            with suppress(psutil.Error):
                runner.kill()
        violations = state_violations(self.home) if self.started and self.verify else []
        assert violations == [], f"the test left a database that fails verify: {violations}"


def state_violations(home: Path) -> list[str]:
    """The invariant violations of the state file in ``home`` (none if there is no file).

    A file that is not a piwf database of this schema (planted on purpose) is not checked.
    """
    path = home / "state.sqlite"
    if not path.exists():
        return []
    try:
        with StateDatabase(path, mode="read-only") as database, database.read() as tx:
            return [f"{v.code}: {v.detail}" for v in find_violations(tx)]
    except IncompatibleStateError:
        return []


def _read_line(descriptor: int, timeout_s: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("the server did not report readiness in time")
        readable, _, _ = select.select([descriptor], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(descriptor, 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


class RawClient:
    """A protocol client over a plain socket, for tests that need exact bytes."""

    def __init__(self, socket_path: Path, client_id: str = "test-client") -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)  # above every run.wait a test asks for
        self.client_id = client_id
        self.decoder = FrameDecoder()
        self.pending: list[ServerMessage] = []
        self._ids = 0
        try:
            self.sock.connect(str(socket_path))
            hello = self.receive()
            assert isinstance(hello, Hello), hello
        except BaseException:
            self.sock.close()
            raise
        self.hello = hello

    def close(self) -> None:
        self.sock.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> ServerMessage:
        """Return the next message; raise ConnectionError when the server closed."""
        while not self.pending:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.pending.extend(parse_server_message(f) for f in self.decoder.feed(data))
        return self.pending.pop(0)

    def response(self) -> Response:
        message = self.receive()
        assert isinstance(message, Response), message
        return message

    def request(
        self,
        operation: str,
        payload: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        run_id: str | None = None,
        request_id: str | None = None,
    ) -> Response:
        """Send one request and return its response."""
        self.send(operation, payload, key=key, run_id=run_id, request_id=request_id)
        return self.response()

    def send(
        self,
        operation: str,
        payload: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        run_id: str | None = None,
        request_id: str | None = None,
    ) -> str:
        self._ids += 1
        request_id = request_id or f"{self.client_id}-{self._ids}"
        request = Request(
            request_id=request_id,
            client_id=self.client_id,
            operation=operation,  # type: ignore[arg-type]
            payload=payload or {},
            idempotency_key=key,
            run_id=run_id,
        )
        self.sock.sendall(encode_message(request))
        return request_id

    def closed_by_server(self, timeout_s: float = 10.0) -> bool:
        """Whether the server closes this connection within ``timeout_s`` (drains data)."""
        self.sock.settimeout(timeout_s)
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


@contextmanager
def raw_client(server: ServerProcess, client_id: str = "test-client") -> Iterator[RawClient]:
    client = RawClient(server.socket_path, client_id)
    try:
        yield client
    finally:
        client.close()
