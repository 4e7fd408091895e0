"""Start a detached piwf server for a state home and wait until it is ready.

The server is one process per state home. :func:`start_server` spawns it as::

    python -m piwf server run --ready-fd FD [--max-workers N] [--idle-exit S]

in a new session (its own process group, no controlling terminal), with standard input, output
and error on ``/dev/null`` (the server appends to its own log, ``ServerPaths(home).log``) and
with ``PIWF_HOME`` set to the home. ``FD`` is the write end of a pipe; the server writes exactly
one line of JSON to it and closes it::

    {"ok":true,"epoch":N,"pid":P}                                   ready: the socket accepts
    {"ok":false,"error":{"code":"serverRunning","message":"..."}}   another server owns the home
    {"ok":false,"error":{"code":"serverStart","message":"..."}}     it could not start (why)

End of file without a line means the server died before it could report; the reason is then
read from what it appended to its log. The launcher waits for that line with ``poll`` (never by
sleeping) and for at most ``timeout_s``; a server that has not answered by then is killed with
its process group, so no half-started server is ever left behind.

Before anything is spawned, the socket path is checked as the client checks it
(:func:`piwf.client.sockets.check_socket_path`): a home, server directory or socket that is
a symlink, another kind of file or another user's is refused with
:class:`~piwf.client.sockets.UnsafeSocketError`, so a start never ends with a client talking
to a server of another home. A socket path too long for the OS is refused with
:class:`~piwf.errors.ServerStartError`, before the server would create the home.

This module imports only the standard library, piwf's base modules and that check: the client
uses it to auto-start a server, and it never imports the server package itself.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from piwf import canonical
from piwf.client.sockets import NotListeningError, check_socket_path
from piwf.config import DEFAULT_START_TIMEOUT_S, ServerPaths, socket_path_problem, state_home
from piwf.errors import (
    CanonicalJsonError,
    PiwfError,
    ServerRunningError,
    ServerStartError,
    StateError,
)

#: A ready line is a few dozen bytes; anything this long is not one.
_MAX_READY_LINE_BYTES: Final = 64 * 1024
#: How much of the server log to quote when the server died without a ready line.
_LOG_TAIL_BYTES: Final = 4096
_LOG_TAIL_LINES: Final = 5
#: How long to wait for a server that refused to start to exit on its own before killing it.
_EXIT_GRACE_S: Final = 2.0

# Servers this process started and that may still run. Holding the Popen objects lets a
# long-lived client reap a server that later exits (no zombie), and keeps Popen's destructor
# from warning that a detached child is still running.
_started: list[subprocess.Popen[bytes]] = []


@dataclass(frozen=True)
class ServerStarted:
    """A server this call started: its process id and its server epoch."""

    pid: int
    epoch: int


def socket_path(home: Path | None = None) -> Path:
    """Return the client socket of ``home`` (default: :func:`piwf.config.state_home`)."""
    return ServerPaths(home or state_home()).socket


def server_command(
    ready_fd: int, *, max_workers: int | None = None, idle_exit_s: float | None = None
) -> list[str]:
    """Return the argv that runs an attached server reporting readiness on ``ready_fd``."""
    argv = [sys.executable, "-m", "piwf", "server", "run", "--ready-fd", str(ready_fd)]
    if max_workers is not None:
        argv += ["--max-workers", str(max_workers)]
    if idle_exit_s is not None:
        argv += ["--idle-exit", repr(float(idle_exit_s))]
    return argv


def start_server(
    home: Path | None = None,
    *,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    max_workers: int | None = None,
    idle_exit_s: float | None = None,
) -> ServerStarted:
    """Start a detached server for ``home`` and return once it accepts connections.

    Raises :class:`~piwf.errors.ServerRunningError` when another live server owns the home (the
    new process exits and the running server is left alone), and
    :class:`~piwf.errors.ServerStartError` with the reason when the server failed to start, sent
    an invalid ready line, or did not report within ``timeout_s`` seconds; in every error case
    the new process has exited or been killed, together with its process group, and reaped.
    Raises :class:`~piwf.client.sockets.UnsafeSocketError`, before starting anything, when
    the socket path is unsafe, and :class:`~piwf.errors.ServerStartError`, before creating
    anything, when it is too long for the OS.
    """
    home = (home or state_home()).absolute()
    paths = ServerPaths(home)
    too_long = socket_path_problem(paths.socket)
    if too_long is not None:  # refused here: the server would create the home first
        raise ServerStartError(too_long)
    with contextlib.suppress(NotListeningError):  # none yet: the server creates it
        check_socket_path(paths.socket)
    _reap_finished()
    log_offset = _file_size(paths.log)
    read_fd, write_fd = os.pipe()
    try:
        env = dict(os.environ, PIWF_HOME=str(home))
        try:
            process = subprocess.Popen(
                server_command(write_fd, max_workers=max_workers, idle_exit_s=idle_exit_s),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(write_fd,),
                start_new_session=True,
                cwd="/",
                env=env,
            )
        except OSError as error:
            raise ServerStartError(f"could not run the piwf server: {error.strerror}") from None
        finally:
            os.close(write_fd)
        try:
            line = _read_ready_line(read_fd, time.monotonic() + timeout_s)
        except TimeoutError:
            _kill(process)
            raise ServerStartError(
                f"the piwf server did not report ready within {timeout_s:g} s and was stopped; "
                f"see {paths.log}"
            ) from None
    finally:
        os.close(read_fd)
    return _accept_ready_line(process, line, paths, log_offset)


def ensure_server(
    home: Path | None = None,
    *,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    max_workers: int | None = None,
    idle_exit_s: float | None = None,
) -> ServerStarted | None:
    """Start a server for ``home`` unless one already owns it.

    Returns the :class:`ServerStarted` of a server this call started, or ``None`` when another
    server owns the home (it may still be starting or stopping: connect with a retry). Raises
    :class:`~piwf.errors.ServerStartError` as :func:`start_server` does.
    """
    try:
        return start_server(
            home, timeout_s=timeout_s, max_workers=max_workers, idle_exit_s=idle_exit_s
        )
    except ServerRunningError:
        return None


def _read_ready_line(fd: int, deadline: float) -> bytes:
    """Read up to the first newline or end of file; raise ``TimeoutError`` at ``deadline``."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    received = bytearray()
    while b"\n" not in received and len(received) < _MAX_READY_LINE_BYTES:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(remaining * 1000):
            raise TimeoutError
        chunk = os.read(fd, _MAX_READY_LINE_BYTES)
        if not chunk:
            break
        received += chunk
    line, _, _ = bytes(received).partition(b"\n")
    return line


def _accept_ready_line(
    process: subprocess.Popen[bytes], line: bytes, paths: ServerPaths, log_offset: int
) -> ServerStarted:
    if not line.strip():
        status = _wait_exit(process)
        reason = _log_tail(paths.log, log_offset)
        detail = f": {reason}" if reason else f"; see {paths.log}"
        raise ServerStartError(f"the piwf server {status} before it was ready{detail}")
    report = _parse_ready_line(line)
    if report is None:
        _kill(process)
        raise ServerStartError("the piwf server sent an invalid ready report and was stopped")
    if isinstance(report, ServerStarted):
        _started.append(process)
        return report
    code, message = report
    _wait_exit(process)
    if code == ServerRunningError.code:
        raise ServerRunningError(message or f"a piwf server already runs for {paths.home}")
    # A refusal about the state (damaged, incompatible, unsafe home) keeps its own class and
    # code, so `--json` says `stateCorrupt` and not just that the server did not start.
    raise _state_error_of_code(code)(message or "the piwf server could not start")


def _state_error_of_code(code: str) -> type[PiwfError]:
    """The :class:`~piwf.errors.StateError` class with wire code ``code``, else
    :class:`~piwf.errors.ServerStartError`."""
    pending: list[type[PiwfError]] = [StateError]
    while pending:
        found = pending.pop()
        if found.code == code:
            return found
        pending.extend(found.__subclasses__())
    return ServerStartError


def _parse_ready_line(line: bytes) -> ServerStarted | tuple[str, str] | None:
    """Return the started server, ``(code, message)`` of a refusal, or None if malformed."""
    try:
        report = canonical.parse(line)
    except CanonicalJsonError:
        return None
    if not isinstance(report, dict):
        return None
    ok = report.get("ok")
    if ok is True:
        pid, epoch = _count(report.get("pid")), _count(report.get("epoch"))
        if pid is None or pid == 0 or epoch is None:
            return None
        return ServerStarted(pid=pid, epoch=epoch)
    error = report.get("error")
    if ok is False and isinstance(error, dict):
        code, message = error.get("code"), error.get("message", "")
        if isinstance(code, str) and isinstance(message, str):
            return code, message
    return None


def _count(value: object) -> int | None:
    """Return ``value`` if it is a non-negative integer (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _wait_exit(process: subprocess.Popen[bytes]) -> str:
    """Wait briefly for a server that gave up to exit (kill it if it lingers); describe it."""
    try:
        code = process.wait(timeout=_EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill(process)
        return "did not exit after failing and was stopped"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the server's process group (it leads its own session) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait()


def _reap_finished() -> None:
    """Collect the exit status of servers this process started that have exited since."""
    _started[:] = [process for process in _started if process.poll() is None]


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _log_tail(path: Path, offset: int) -> str:
    """Return the last few non-empty lines the server appended to its log after ``offset``."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(offset, size - _LOG_TAIL_BYTES))
            data = log.read()
    except OSError:
        return ""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
    return " | ".join([line for line in lines if line][-_LOG_TAIL_LINES:])
