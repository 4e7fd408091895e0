"""``piwf`` commands for tests, each in its own process, without paying an interpreter start.

A test suite that runs the CLI about a thousand times spends most of each run starting Python
and importing click, pydantic and the protocol's models (about 0.25 s of CPU a command against
a few milliseconds for the command itself). :func:`run_piwf` keeps the process boundary a test
relies on (its own pid, file descriptors, environment, working directory, exit code, signals)
and skips the start: one *zygote* per test process imports :mod:`piwf.cli` and the client once,
and forks a child per command. The child takes the command's environment and directory, gets
the caller's pipes as its standard streams (passed over a Unix socket, ``SCM_RIGHTS``), and
calls :func:`piwf.cli.main` — the function the installed ``piwf`` script calls — then exits with
its code.

What a fork cannot give falls back to starting the installed script for real: an environment
that changes what Python reads only at start (``PYTHON*``, the locale) or what piwf reads at
import (``PIWF_FAULTS``). ``TESTS_PIWF_CLI=exec`` makes every command start the script, for a
run that checks nothing depends on the zygote. The script's own start (its imports, what
``--version`` loads) is tested by tests/unit/test_lazy_cli.py, which always starts it.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import io
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

PIWF = Path(sys.executable).parent / "piwf"
#: Read by Python or piwf only when a process starts: a command whose environment changes one
#: of these runs the installed script instead of a fork.
_READ_AT_START = ("PYTHON", "LC_", "LANG", "PIWF_FAULTS")


def run_piwf(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | Path | None = None,
    input: str | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``piwf ARGS`` in a new process with ``env`` and ``cwd``, as ``subprocess.run`` with
    ``capture_output=True, text=True, check=False`` would; raises ``TimeoutExpired`` (after
    killing the command) past ``timeout`` seconds."""
    command = [str(PIWF), *args]
    zygote = None if os.environ.get("TESTS_PIWF_CLI") == "exec" else _zygote()
    if zygote is None or _read_at_start(env, zygote.environment):
        return subprocess.run(
            command,
            env=dict(env),
            cwd=cwd,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    return zygote.run(command, dict(env), str(cwd or Path.cwd()), input, timeout)


def _read_at_start(env: Mapping[str, str], started_with: Mapping[str, str]) -> bool:
    """Whether ``env`` differs from the zygote's own environment in what is read at start."""
    return "PIWF_FAULTS" in env or any(
        name.startswith(_READ_AT_START) and env.get(name) != started_with.get(name)
        for name in set(env) | set(started_with)
    )


class _Zygote:
    """The forking process of this test process, started on first use."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="pz", dir="/tmp"))
        self.address = self.directory / "z.sock"
        self.environment = {
            name: value for name, value in os.environ.items() if name != "PIWF_FAULTS"
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_process", str(self.address)],
            env=self.environment,
            cwd=Path(__file__).resolve().parents[1],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not self.address.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the piwf zygote did not start")
            select.select([], [], [], 0.01)  # a bounded poll for the socket's name
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self.address.unlink()
            self.directory.rmdir()

    def run(
        self, command: list[str], env: dict[str, str], cwd: str, text: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        stdin_read, stdin_write = os.pipe()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        request = json.dumps({"argv": command[1:], "env": env, "cwd": cwd}).encode()
        framed = len(request).to_bytes(8, "big") + request
        try:
            connection.connect(str(self.address))
            sent = connection.sendmsg([framed[:8]], [_rights(stdin_read, out_write, err_write)])
            connection.sendall(framed[sent:])
        except OSError:
            connection.close()
            for descriptor in (stdin_write, out_read, err_read):
                os.close(descriptor)
            raise
        finally:  # the child has its own copies now
            for descriptor in (stdin_read, out_write, err_write):
                os.close(descriptor)
        data = (text or "").encode()
        if not data:
            os.close(stdin_write)
        return _communicate(command, connection, stdin_write, out_read, err_read, data, timeout)


def _communicate(
    command: list[str],
    connection: socket.socket,
    stdin_write: int,
    out_read: int,
    err_read: int,
    data: bytes,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """Feed stdin, read both streams and the child's report (its pid, then its exit code)
    until all end; kill the child at the deadline."""
    selector = selectors.DefaultSelector()
    streams = {out_read: bytearray(), err_read: bytearray()}
    for descriptor in streams:
        selector.register(descriptor, selectors.EVENT_READ)
    selector.register(connection, selectors.EVENT_READ)
    if data:
        os.set_blocking(stdin_write, False)
        selector.register(stdin_write, selectors.EVENT_WRITE)
    report = bytearray()
    open_count = len(streams) + 1
    deadline = time.monotonic() + timeout
    try:
        while open_count:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill(report)
                raise subprocess.TimeoutExpired(command, timeout)
            for key, _ in selector.select(left):
                if key.fileobj == stdin_write:
                    try:
                        data = data[os.write(stdin_write, data) :]
                    except BrokenPipeError:
                        data = b""
                    if not data:
                        selector.unregister(stdin_write)
                        os.close(stdin_write)
                        stdin_write = -1
                    continue
                if key.fileobj is connection:
                    chunk = connection.recv(4096)
                else:
                    chunk = os.read(key.fd, 65536)
                if chunk:
                    (report if key.fileobj is connection else streams[key.fd]).extend(chunk)
                else:
                    selector.unregister(key.fileobj)
                    open_count -= 1
    finally:
        selector.close()
        connection.close()
        for descriptor in (stdin_write, out_read, err_read):
            if descriptor >= 0:
                with contextlib.suppress(OSError):
                    os.close(descriptor)
    lines = report.decode().split()
    # The child writes its exit code last; a child killed by a signal never did.
    code = int(lines[1]) if len(lines) > 1 else -signal.SIGKILL
    return subprocess.CompletedProcess(
        command,
        code,
        streams[out_read].decode(errors="replace"),
        streams[err_read].decode(errors="replace"),
    )


def _rights(*descriptors: int) -> tuple[int, int, bytes]:
    return (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", descriptors).tobytes())


def _kill(report: bytearray) -> None:
    lines = report.decode().split()
    if lines:
        with contextlib.suppress(OSError):
            os.kill(int(lines[0]), signal.SIGKILL)


_instance: _Zygote | None = None
_instance_lock = threading.Lock()


def _zygote() -> _Zygote:
    global _instance
    with _instance_lock:
        if _instance is None or _instance.process.poll() is not None:
            _instance = _Zygote()
        return _instance


# -- the zygote ---------------------------------------------------------------------------------


def _serve(address: str) -> None:
    """Import what commands load, then fork a child for each connection."""
    import piwf.cli
    import piwf.client.client

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".new")
    listener.listen(64)
    Path(address + ".new").rename(address)  # the caller waits for this name: it listens
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    parent = os.getppid()
    while True:
        readable, _, _ = select.select([listener], [], [], 1.0)
        if os.getppid() != parent:  # the test process ended
            return
        if not readable:
            continue
        connection, _ = listener.accept()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            _child(connection, piwf.cli.main)
        connection.close()


def _child(connection: socket.socket, main: Callable[[list[str]], None]) -> None:
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        head, descriptors, _, _ = socket.recv_fds(connection, 8, 3)
        request = bytearray(head)
        while len(request) < 8 or len(request) < 8 + int.from_bytes(request[:8], "big"):
            chunk = connection.recv(1 << 16)
            if not chunk:
                raise EOFError("the request ended early")
            request.extend(chunk)
        body = json.loads(request[8:])
        for target, descriptor in enumerate(descriptors):
            os.dup2(descriptor, target)
            os.close(descriptor)
        _standard_streams()
        os.environ.clear()
        os.environ.update(body["env"])
        time.tzset()  # TZ, read by the C library at its first use, as in a new process
        os.chdir(body["cwd"])
        sys.argv = [str(PIWF), *body["argv"]]
        connection.sendall(f"{os.getpid()}\n".encode())
        try:
            main(body["argv"])
            code = 0
        except SystemExit as done:
            code = _exit_code(done.code)
        except BaseException:  # as Python reports an uncaught exception
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):
                stream.flush()
        with contextlib.suppress(OSError):
            connection.sendall(f"{code}\n".encode())
        os._exit(code)


def _standard_streams() -> None:
    """New ``sys.stdin``/``stdout``/``stderr`` over descriptors 0-2, made as Python makes them
    at start (stdout line-buffered only on a terminal, stderr always, backslashreplace)."""
    encoding = sys.stdout.encoding
    # Open for the rest of the process, as Python's own streams are.
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(open(0, "rb", closefd=False), encoding)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        open(1, "wb", closefd=False),  # noqa: SIM115
        encoding,
        line_buffering=os.isatty(1),
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        open(2, "wb", closefd=False),  # noqa: SIM115
        encoding,
        "backslashreplace",
        line_buffering=True,
    )


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve(sys.argv[1])
