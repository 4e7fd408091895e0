"""Starting, watching and stopping child processes, each in its own process group.

``start`` gives a child one end of a socket pair (its channel, ``--fd N``) and stdout/stderr
pipes the server reads without blocking, and starts it in a fresh session, so the child and
every grandchild share one process group that ``stop`` can signal at once. There are two ways
in, behind one :class:`ChildProcess` shape:

- a **fork** of the zygote (:mod:`piwf.server.children.zygote`), when a :class:`Forker` is
  installed and ready: the descriptors travel to the zygote with SCM_RIGHTS, the child is
  forked from an interpreter that has imported everything already, and the zygote reports its
  exit;
- a **spawn** of ``python -m <module> --fd N`` with ``subprocess``, whenever no zygote is ready
  or a fork request fails. Nothing else differs: the same handle, output capture, stop and kill.

Captured output goes to a ``0600`` file under ``$PIWF_HOME/server/runners/`` and is bounded: a
child that writes more than the cap is killed (a flood must not fill the disk or stall the
loop). A child's exit is noticed through ``waitpid`` (spawned) or the zygote's report (forked),
with stream end-of-file and a timer as triggers; the handle then reports the exit code or
signal. Each handle carries the child's start identity, never only a bare pid.

**Nothing a child started outlives it.** Every child (the zygote included) gets the read end
of one *lifeline pipe* whose write end only this process holds (``--lifeline-fd``), and the pid
to expect as its parent (``--parent-pid``); the child's lifeline thread
(:mod:`piwf.runner.lifeline`) ends it and its descendants when the pipe reaches end-of-file,
that is, when the server dies however it dies. While the server lives:

- ``stop`` walks the child's process tree (from its proven start identity; children are
  subreapers on Linux, so daemons that left the group are still in it), sends SIGTERM to those
  descendants and to the group, remembers them, and SIGKILLs after a grace period;
- ``kill`` first freezes the tree (SIGSTOP the group, then every descendant, walking again until
  nothing new appears), so nothing forks between the walk and the SIGKILL of all of them;
- when a child has exited, its group and every descendant remembered for it get SIGKILL.

The zygote's own tree is its forked children, each supervised on its own handle, so it gets
none of this: stopping or killing it signals its group only.
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
from typing import Protocol

import psutil

from piwf.config import FILE_MODE, MAX_FRAME_BYTES, ensure_private_dir
from piwf.processes import (
    descendants,
    freeze_tree,
    is_gone,
    process_of,
    signal_processes,
    start_identity,
)
from piwf.server.children.pipes import PipeChannel
from piwf.server.failures import log_failure
from piwf.server.loop import EventLoop, Timer
from piwf.state.failures import state_error_of_os

DEFAULT_OUTPUT_CAP = 1024 * 1024


class ChildProcess(Protocol):
    """The process behind a handle, however it was started."""

    @property
    def pid(self) -> int:
        """Its pid, which is also its process group and session id."""
        ...

    @property
    def start_identity(self) -> str | None:
        """``pid:create_time:boot_id`` taken while it could not have been reaped; None only if
        it was already gone."""
        ...

    @property
    def returncode(self) -> int | None:
        """Exit code, ``-signal`` when a signal ended it; None while it runs or when its end was
        seen but its status is unknown (a zygote child whose zygote died)."""
        ...

    def poll(self) -> bool:
        """Whether it has ended (without blocking)."""
        ...

    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` for its end; True if it ended."""
        ...

    def release(self) -> None:
        """Collect what is left of an ended process (its zombie, for a spawned one)."""
        ...


class Forker(Protocol):
    """A faster way to start some children (the zygote); None from :meth:`fork` means spawn."""

    def fork(
        self, module: str, directory: str, descriptors: tuple[int, int, int]
    ) -> ChildProcess | None:
        """Start ``module`` with (channel, stdout, stderr) as the child's descriptors, or return
        None, having sent nothing or failed: the caller then spawns with fresh descriptors."""
        ...

    def owns(self, handle: ChildHandle) -> bool:
        """Whether ``handle`` is the forker's own process (stopped after every other child)."""
        ...

    def stop(self) -> None:
        """Stop forking and let the forker's own process end (server shutdown)."""
        ...


class SpawnedProcess:
    """A child started with ``subprocess`` (the server is its parent)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.start_identity = start_identity(popen.pid)

    @property
    def pid(self) -> int:
        """Its pid (and process group)."""
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Exit code or ``-signal``; None while it runs."""
        return self.popen.returncode

    def poll(self) -> bool:
        """Whether it has exited (reaps it if so)."""
        return self.popen.poll() is not None

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s``; True if it exited."""
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def release(self) -> None:
        """Reap it."""
        self.popen.wait()


@dataclass
class ChildHandle:
    """One supervised child."""

    name: str
    process: ChildProcess
    channel: PipeChannel
    identity: str | None
    log_path: Path
    output_cap: int
    #: The read ends of its stdout and stderr pipes (closed when it is finished).
    streams: list[int] = field(default_factory=list)
    captured: int = 0
    flooded: bool = False
    streams_open: int = 2
    exited: bool = False
    kill_timer: Timer | None = None
    on_exit: list[Callable[[ChildHandle], None]] = field(default_factory=list)
    #: Descendants seen when it was stopped: killed with it, even once reparented elsewhere.
    descendants: list[psutil.Process] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id)."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """Exit code, or ``-signal`` when a signal ended it; None while it runs (or unknown)."""
        return self.process.returncode


@dataclass
class _Descriptors:
    """One child's descriptors: its channel pair and its stdout/stderr pipes."""

    server_end: socket.socket
    child_end: socket.socket
    stdout: tuple[int, int]
    stderr: tuple[int, int]

    @classmethod
    def create(cls) -> _Descriptors:
        server_end, child_end = socket.socketpair()
        return cls(server_end, child_end, os.pipe(), os.pipe())

    @property
    def for_child(self) -> tuple[int, int, int]:
        return (self.child_end.fileno(), self.stdout[1], self.stderr[1])

    def close_child_ends(self) -> None:
        """The child (or the zygote) holds its own copies now."""
        self.child_end.close()
        for _, write_end in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                os.close(write_end)

    def close_all(self) -> None:
        self.close_child_ends()
        self.server_end.close()
        for read_end, _ in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                os.close(read_end)


class Supervisor:
    """Starts children into their own process groups and reaps them from the server loop."""

    def __init__(self, loop: EventLoop, log_dir: Path, *, output_cap: int = DEFAULT_OUTPUT_CAP):
        self.loop = loop
        self.log_dir = log_dir
        self.output_cap = output_cap
        self.children: dict[int, ChildHandle] = {}
        #: Set by the server when the zygote is enabled (``PIWF_ZYGOTE``).
        self.forker: Forker | None = None
        #: The lifeline pipe (read end, write end); created with the first child.
        self._lifeline: tuple[int, int] | None = None

    def start(
        self,
        name: str,
        module: str,
        *,
        cwd: Path | None = None,
        on_exit: Callable[[ChildHandle], None] | None = None,
    ) -> ChildHandle:
        """Start ``module --fd N`` (forked by the zygote when it is ready, else spawned); the
        caller talks to it through ``handle.channel``."""
        ensure_private_dir(self.log_dir)
        log_path = self.log_dir / f"{name}.log"
        descriptor = os.open(
            log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE
        )
        os.close(descriptor)
        directory = str(cwd) if cwd is not None and cwd.is_dir() else "/"
        process: ChildProcess | None = None
        if self.forker is not None:
            descriptors = _Descriptors.create()
            try:
                process = self.forker.fork(module, directory, descriptors.for_child)
            finally:
                if process is None:
                    # Whatever a failed request left behind holds none of the fresh set below.
                    descriptors.close_all()
        if process is None:
            descriptors = _Descriptors.create()
            try:
                process = self._spawn(module, directory, descriptors, self._lifeline_reader())
            except BaseException:
                descriptors.close_all()
                raise
        descriptors.close_child_ends()
        connection = Connection(descriptors.server_end.detach())
        handle = ChildHandle(
            name=name,
            process=process,
            channel=PipeChannel(connection, MAX_FRAME_BYTES),
            identity=process.start_identity,
            log_path=log_path,
            output_cap=self.output_cap,
            streams=[descriptors.stdout[0], descriptors.stderr[0]],
        )
        if on_exit is not None:
            handle.on_exit.append(on_exit)
        self.children[process.pid] = handle
        for stream in handle.streams:
            os.set_blocking(stream, False)
            self.loop.selector.register(
                stream, selectors.EVENT_READ, self._stream_reader(handle, stream)
            )
        return handle

    def stop(self, handle: ChildHandle, grace_s: float = 2.0) -> None:
        """SIGTERM the child's descendants and process group, then SIGKILL them after
        ``grace_s``."""
        if handle.exited:
            return
        self._terminate(handle)
        if handle.kill_timer is None:
            handle.kill_timer = self.loop.call_later(grace_s, lambda: self.kill(handle))

    def kill(self, handle: ChildHandle) -> None:
        """SIGKILL the child's whole process group and every descendant now (frozen first, so
        none escapes by forking)."""
        if handle.exited:
            return
        root = None if self._owned_by_forker(handle) else process_of(handle.identity)
        if root is not None:
            self._signal_group(handle, signal.SIGSTOP)
            handle.descendants += freeze_tree(root)
        self._signal_group(handle, signal.SIGKILL)
        signal_processes(handle.descendants, signal.SIGKILL)

    def poll(self) -> None:
        """Reap children that exited (called from a loop timer, on stream end-of-file and on
        the zygote's exit reports)."""
        for handle in list(self.children.values()):
            if handle.exited:
                continue
            if not handle.process.poll():
                continue
            self._finish(handle)

    def stop_all(self, grace_s: float = 2.0) -> None:
        """Stop every child and wait for each (server shutdown); the zygote goes last, since
        it reports the others' exits. The lifeline pipe is closed last: anything still tied
        to it ends itself."""
        forker = self.forker
        self._stop_and_wait(
            [h for h in self.children.values() if forker is None or not forker.owns(h)], grace_s
        )
        if forker is not None:
            forker.stop()
        self._stop_and_wait(list(self.children.values()), grace_s)
        if self._lifeline is not None:
            for descriptor in self._lifeline:
                with contextlib.suppress(OSError):
                    os.close(descriptor)
            self._lifeline = None

    def _stop_and_wait(self, handles: list[ChildHandle], grace_s: float) -> None:
        for handle in handles:
            self._terminate(handle)
        for handle in handles:
            if not handle.process.wait(grace_s):
                self.kill(handle)
                handle.process.wait(5)
            self._finish(handle)

    def _terminate(self, handle: ChildHandle) -> None:
        """SIGTERM the child's group and its descendants (remembered for its end)."""
        if handle.exited:
            return
        root = None if self._owned_by_forker(handle) else process_of(handle.identity)
        if root is not None:
            found = descendants(root)
            signal_processes(found, signal.SIGTERM)
            handle.descendants += found
        self._signal_group(handle, signal.SIGTERM)

    def _owned_by_forker(self, handle: ChildHandle) -> bool:
        return self.forker is not None and self.forker.owns(handle)

    def _lifeline_reader(self) -> int:
        if self._lifeline is None:
            # Both ends close on exec: only a child given the read end explicitly has it, and
            # no child ever holds the write end, so its end-of-file means this process is gone.
            self._lifeline = os.pipe()
        return self._lifeline[0]

    def _spawn(
        self, module: str, directory: str, descriptors: _Descriptors, lifeline: int
    ) -> SpawnedProcess:
        channel = descriptors.child_end.fileno()
        command = [sys.executable, "-m", module, "--fd", str(channel)]
        command += ["--lifeline-fd", str(lifeline), "--parent-pid", str(os.getpid())]
        popen = subprocess.Popen(
            command,
            pass_fds=(channel, lifeline),
            stdin=subprocess.DEVNULL,
            stdout=descriptors.stdout[1],
            stderr=descriptors.stderr[1],
            start_new_session=True,
            cwd=directory,
            env=_child_environment(),
        )
        return SpawnedProcess(popen)

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
            try:
                with open(handle.log_path, "ab") as log:
                    log.write(data[:room])
            except OSError as error:  # a full disk costs these bytes of output, nothing more
                log_failure(
                    f"capturing the output of {handle.name}",
                    state_error_of_os(error, "writing captured output"),
                )
        handle.captured += len(data)
        if handle.captured > handle.output_cap and not handle.flooded:
            handle.flooded = True
            self.kill(handle)

    def _signal_group(self, handle: ChildHandle, number: signal.Signals) -> None:
        if handle.exited:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, number)

    def _finish(self, handle: ChildHandle) -> None:
        if handle.exited:
            return
        handle.process.release()
        handle.exited = True
        if handle.kill_timer is not None:
            handle.kill_timer.cancel()
        # The group may still hold grandchildren, and descendants seen at a stop may have left
        # it: no process of a finished run survives it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, signal.SIGKILL)
        signal_processes([p for p in handle.descendants if not is_gone(p)], signal.SIGKILL)
        for stream in handle.streams:
            with contextlib.suppress(KeyError, ValueError):
                self.loop.selector.unregister(stream)
            with contextlib.suppress(OSError):
                os.close(stream)
        handle.streams = []
        self.children.pop(handle.pid, None)
        # The callbacks run while the channel is still open: a reply written just before the
        # exit can still be read there (the resolver's answer).
        try:
            for callback in handle.on_exit:
                callback(handle)
        finally:
            with contextlib.suppress(KeyError, ValueError):
                self.loop.selector.unregister(handle.channel.fd)
            handle.channel.close()


def _child_environment() -> dict[str, str]:
    """The child's environment: the server's, without fault injection meant for the server."""
    environment = dict(os.environ)
    for name in ("PIWF_FAULTS", "PIWF_FAULTS_LOG"):
        if name in environment and not environment.get("PIWF_CHILD_FAULTS"):
            environment.pop(name)
    if environment.get("PIWF_CHILD_FAULTS"):
        environment["PIWF_FAULTS"] = environment["PIWF_CHILD_FAULTS"]
    return environment
