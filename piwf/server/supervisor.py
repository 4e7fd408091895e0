"""Starting, watching and stopping child processes, each in its own process group.

``start`` spawns ``python -m <module> --fd N`` with a fresh session (so the child and every
grandchild share one process group that ``stop`` can signal at once), one end of a socket pair
as descriptor N, and its stdout/stderr on pipes the server reads without blocking. Captured
output goes to a ``0600`` file under ``$PIWF_HOME/server/runners/`` and is bounded: a child
that writes more than the cap is killed (a flood must not fill the disk or stall the loop).

``stop`` sends SIGTERM to the group, then SIGKILL after a grace period. A child's exit is
noticed through its pipe and stream end-of-file plus ``waitpid``; the handle then reports the
exit code or signal. Handles are keyed by the child's start identity, never by a bare pid.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from piwf.config import FILE_MODE, MAX_FRAME_BYTES, ensure_private_dir
from piwf.server.loop import EventLoop, Timer
from piwf.server.pipes import PipeChannel
from piwf.server.processes import start_identity

DEFAULT_OUTPUT_CAP = 1024 * 1024


@dataclass
class ChildHandle:
    """One supervised child."""

    name: str
    process: subprocess.Popen[bytes]
    channel: PipeChannel
    identity: str | None
    log_path: Path
    output_cap: int
    captured: int = 0
    flooded: bool = False
    streams_open: int = 2
    exited: bool = False
    kill_timer: Timer | None = None
    on_exit: list[Callable[[ChildHandle], None]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id)."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """Exit code, or ``-signal`` when a signal ended it; None while it runs."""
        return self.process.returncode


class Supervisor:
    """Starts children into their own process groups and reaps them from the server loop."""

    def __init__(self, loop: EventLoop, log_dir: Path, *, output_cap: int = DEFAULT_OUTPUT_CAP):
        self.loop = loop
        self.log_dir = log_dir
        self.output_cap = output_cap
        self.children: dict[int, ChildHandle] = {}

    def start(
        self,
        name: str,
        module: str,
        *,
        cwd: Path | None = None,
        on_exit: Callable[[ChildHandle], None] | None = None,
    ) -> ChildHandle:
        """Spawn ``python -m module --fd N``; the caller talks to it through ``handle.channel``."""
        ensure_private_dir(self.log_dir)
        server_end, child_end = socket.socketpair()
        log_path = self.log_dir / f"{name}.log"
        descriptor = os.open(
            log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE
        )
        os.close(descriptor)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", module, "--fd", str(child_end.fileno())],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                cwd=str(cwd) if cwd is not None and cwd.is_dir() else "/",
                env=_child_environment(),
            )
        finally:
            child_end.close()
        connection = Connection(os.dup(server_end.fileno()))
        server_end.close()
        handle = ChildHandle(
            name=name,
            process=process,
            channel=PipeChannel(connection, MAX_FRAME_BYTES),
            identity=start_identity(process.pid),
            log_path=log_path,
            output_cap=self.output_cap,
        )
        if on_exit is not None:
            handle.on_exit.append(on_exit)
        self.children[process.pid] = handle
        for stream in (process.stdout, process.stderr):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
            self.loop.selector.register(
                stream, selectors.EVENT_READ, self._stream_reader(handle, stream.fileno())
            )
        return handle

    def stop(self, handle: ChildHandle, grace_s: float = 2.0) -> None:
        """SIGTERM the child's process group, then SIGKILL it after ``grace_s``."""
        if handle.exited:
            return
        self._signal_group(handle, signal.SIGTERM)
        if handle.kill_timer is None:
            handle.kill_timer = self.loop.call_later(grace_s, lambda: self.kill(handle))

    def kill(self, handle: ChildHandle) -> None:
        """SIGKILL the child's whole process group now."""
        self._signal_group(handle, signal.SIGKILL)

    def poll(self) -> None:
        """Reap children that exited (called from a loop timer and on stream end-of-file)."""
        for handle in list(self.children.values()):
            if handle.exited:
                continue
            if handle.process.poll() is None:
                continue
            self._finish(handle)

    def stop_all(self, grace_s: float = 2.0) -> None:
        """Stop every child and wait for each (server shutdown)."""
        for handle in list(self.children.values()):
            self._signal_group(handle, signal.SIGTERM)
        for handle in list(self.children.values()):
            try:
                handle.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(handle, signal.SIGKILL)
                handle.process.wait(timeout=5)
            self._finish(handle)

    def _stream_reader(self, handle: ChildHandle, descriptor: int) -> Callable[[int], None]:
        def read(_mask: int) -> None:
            try:
                data = os.read(descriptor, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(KeyError, ValueError):
                    self.loop.selector.unregister(descriptor)
                handle.streams_open -= 1
                if handle.streams_open == 0:
                    self.loop.call_later(0, self.poll)
                return
            self._capture(handle, data)

        return read

    def _capture(self, handle: ChildHandle, data: bytes) -> None:
        room = handle.output_cap - handle.captured
        if room > 0:
            with open(handle.log_path, "ab") as log:
                log.write(data[:room])
        handle.captured += len(data)
        if handle.captured > handle.output_cap and not handle.flooded:
            handle.flooded = True
            self.kill(handle)

    def _signal_group(self, handle: ChildHandle, number: signal.Signals) -> None:
        if handle.process.returncode is not None and handle.exited:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, number)

    def _finish(self, handle: ChildHandle) -> None:
        if handle.exited:
            return
        handle.process.wait()
        handle.exited = True
        if handle.kill_timer is not None:
            handle.kill_timer.cancel()
        # The group may still hold grandchildren: no member of a finished run survives it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, signal.SIGKILL)
        for stream in (handle.process.stdout, handle.process.stderr):
            if stream is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.loop.selector.unregister(stream)
                stream.close()
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(handle.channel.fd)
        handle.channel.close()
        self.children.pop(handle.pid, None)
        for callback in handle.on_exit:
            callback(handle)


def _child_environment() -> dict[str, str]:
    """The child's environment: the server's, without fault injection meant for the server."""
    environment = dict(os.environ)
    for name in ("PIWF_FAULTS", "PIWF_FAULTS_LOG"):
        if name in environment and not environment.get("PIWF_CHILD_FAULTS"):
            environment.pop(name)
    if environment.get("PIWF_CHILD_FAULTS"):
        environment["PIWF_FAULTS"] = environment["PIWF_CHILD_FAULTS"]
    return environment
