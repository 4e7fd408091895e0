"""The launcher: start children, report their exits to the loop, stop and kill their trees.

One interface for every kind of child (DESIGN.md §1)::

    start(ChildSpec) -> ChildHandle    its own session and group, channel, captured output;
                                       returns before the child's pid is known
    started                            ChildSpec.on_started, called once from the loop when the
                                       pid and start identity are known
    stop(handle, grace_s)              SIGTERM its tree and group, SIGKILL after the grace
    kill(handle)                       freeze its tree, then SIGKILL all of it
    stop_all(grace_s)                  server shutdown: stop every child and wait (bounded)
    exits                              ChildSpec.on_exit, called once from the loop

``start`` gives the child one end of a ``multiprocessing.Pipe(duplex=True)`` (its channel, read
by the server without blocking through :class:`~piwf.server.children.pipes.PipeChannel`) and
the write ends of two pipes for its stdout and stderr, and starts it through the configured
start method (:mod:`piwf.server.children.start_methods`). The child's first act is its own
session and process group (:mod:`piwf.runner.bootstrap`).

**The pid comes later.** ``start`` returns as soon as the child is asked for: with
``forkserver`` its pid arrives on its sentinel once the fork server has forked it (with
``spawn`` it is known at once). Then its start identity (pid, create time, boot id) is taken
and ``on_started`` runs, from the loop, never inside ``start``, and always before ``on_exit``;
the caller records the identity there. Until then the handle's ``pid`` and ``identity`` are
None: a ``stop`` or ``kill`` asked for meanwhile is remembered and applied when the pid
arrives. A pid that does not come within the start deadline
(:attr:`~piwf.server.children.start_methods.ChildStarter.timeout_s`), or a fork server that
ends before it sends one, is a failed start: the fork server is replaced (when it did not
answer), ``start_failure`` says why, and ``on_exit`` runs with exit code 255 (no
``on_started``). The registry is keyed by the child's name, which exists before its pid.

**Exits.** ``Process.sentinel`` joins the selector. With ``forkserver`` it is exact: the fork
server writes the child's status there when it reaps it (or closes it when it dies itself:
status unknown, 255). With ``spawn`` it is the end-of-file of a pipe the child holds, and a
process that workflow code forked without ``exec`` holds it too, so the server, which is then
the child's parent, also acts on SIGCHLD (its handler only records; a loop wake duty reaps).

**Output** goes to a ``0600`` file under ``$PIWF_HOME/server/runners/`` and is bounded: what a
child writes past the cap is counted and dropped, and nothing is killed for it
(:mod:`piwf.server.children.capture`).

**Nothing a child started outlives it.** While the server lives:

- ``stop`` walks the child's process tree (from its proven start identity; children are
  subreapers on Linux, so daemons that left the group are still in it), sends SIGTERM to those
  descendants and to the group, remembers them, and SIGKILLs after a grace period;
- ``kill`` first freezes the tree (SIGSTOP the group, then every descendant, walking again until
  nothing new appears), so nothing forks between the walk and the SIGKILL of all of them;
- when a child is seen ended, whatever is left of its tree (all of it, if only its fork server
  died) is frozen and killed, with its group and every descendant remembered for it.

When the server dies, each child's lifeline ends it (:mod:`piwf.runner.lifeline`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

import psutil

from piwf.config import MAX_FRAME_BYTES, ensure_private_dir
from piwf.processes import (
    ChildKind,
    descendants,
    freeze_tree,
    is_gone,
    process_of,
    signal_processes,
    start_identity,
)
from piwf.server.children.capture import OutputCapture
from piwf.server.children.forkserver_launch import PidLaterProcess
from piwf.server.children.pipes import PipeChannel
from piwf.server.children.start_methods import (
    ChildStarter,
    ChildStartError,
    EarlyHelpers,
    StartMethod,
    default_start_method,
    timed_out,
)
from piwf.server.loop import EventLoop, Timer
from piwf.state.failures import os_reason

log = logging.getLogger("piwf.server")

DEFAULT_OUTPUT_CAP = 1024 * 1024
#: What the standard library's helper processes print (and a child before its first act).
HELPERS_LOG = "helpers.log"
#: How often a shutdown wait looks at exits a sentinel cannot show (see the module docstring).
_WAIT_SLICE_S = 0.05


@dataclass(frozen=True)
class ChildSpec:
    """What to start: ``name`` names it among the live children and names its log file,
    ``kind`` the entry it runs, ``cwd`` its working directory (``/`` when absent or not a
    directory), ``on_exit`` what to call once it has ended (from the loop, with the channel
    still open for a last read), ``on_started`` what to call once its pid and start identity
    are known (from the loop; see the module docstring)."""

    name: str
    kind: ChildKind
    cwd: Path | None = None
    on_exit: Callable[[ChildHandle], None] | None = None
    on_started: Callable[[ChildHandle], None] | None = None


@dataclass(eq=False)
class ChildHandle:
    """One supervised child."""

    name: str
    process: BaseProcess
    channel: PipeChannel
    output: OutputCapture
    #: The child's pid (also its process group and session id once it began); None until the
    #: start method has reported it, and for good when the start failed.
    pid: int | None = None
    #: ``pid:create_time:boot_id``, taken when the pid came; None before, or when the child had
    #: already ended then.
    identity: str | None = None
    #: Why the start failed (the child never ran, or is not known to have): its exit is 255.
    start_failure: str | None = None
    #: Whether ``on_started`` has been called.
    started: bool = False
    exited: bool = False
    #: Its exit status, kept once it is finished (the ``Process`` is closed then).
    exit_status: int | None = None
    kill_timer: Timer | None = None
    on_exit: list[Callable[[ChildHandle], None]] = field(default_factory=list)
    on_started: list[Callable[[ChildHandle], None]] = field(default_factory=list)
    #: Descendants seen when it was stopped: killed with it, even once reparented elsewhere.
    descendants: list[psutil.Process] = field(default_factory=list)
    #: The deadline of its pid (cancelled once the pid came).
    start_timer: Timer | None = None
    #: A stop (its grace) or a kill asked for before the pid was known, applied when it comes.
    stop_pending: float | None = None
    kill_pending: bool = False

    @property
    def returncode(self) -> int | None:
        """Exit code, ``-signal`` when a signal ended it (255 when its fork server died
        first, or its start failed); None while it runs or its pid has not come."""
        if self.exited:
            return self.exit_status
        # Polling a child whose pid has not come would read the pid behind the supervisor's
        # back: it acts on the pid when it reads it.
        return None if self.pid is None else self.process.exitcode

    @property
    def log_path(self) -> Path:
        """Where its output is captured."""
        return self.output.log_path

    @property
    def captured(self) -> int:
        """How many bytes it wrote to stdout and stderr."""
        return self.output.captured


class Supervisor:
    """Starts children into their own process groups and reports their exits to the loop."""

    def __init__(
        self,
        loop: EventLoop,
        log_dir: Path,
        *,
        method: StartMethod | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        early_helpers: EarlyHelpers | None = None,
    ) -> None:
        self.loop = loop
        self.log_dir = log_dir
        self.output_cap = output_cap
        self.method = method or default_start_method()
        #: Helpers started before the server's imports, adopted by :meth:`prepare`.
        self._early_helpers = early_helpers
        if early_helpers is not None and early_helpers.starter.method is not self.method:
            raise ValueError("the early start helpers use another start method")
        #: The live children by name (their pid may not be known yet).
        self.children: dict[str, ChildHandle] = {}
        self._starter: ChildStarter | None = None
        self._helpers: OutputCapture | None = None
        self._helpers_writer: int | None = None
        self._child_signalled = False
        self._poll_scheduled = False

    def prepare(self) -> None:
        """Install the exit wake-up and start the helper processes now (see
        :mod:`~piwf.server.children.start_methods`); :meth:`start` does it when not yet done."""
        if self._starter is not None:
            return
        ensure_private_dir(self.log_dir)
        early, self._early_helpers = self._early_helpers, None
        if early is None:
            reader, writer = os.pipe()
        else:
            reader, writer = early.output_reader, early.output_writer
        # One server's helpers' output, bounded like a child's: the file starts empty.
        self._helpers = OutputCapture(
            self.loop,
            self.log_dir / HELPERS_LOG,
            self.output_cap,
            label="the start helpers",
            fresh=True,
        )
        self._helpers.watch(reader)
        self._helpers_writer = writer
        self._starter = (
            ChildStarter(self.method, helpers_output=writer) if early is None else early.starter
        )
        signal.signal(signal.SIGCHLD, self._record_child_signal)
        signal.siginterrupt(signal.SIGCHLD, False)
        self.loop.on_wake.append(self._reap_signalled)
        if early is not None:
            return  # started already
        try:
            self._starter.start_helpers()
        except OSError as error:  # the first start tries again, and fails on its own
            log.warning("the start helpers could not be started: %s", os_reason(error))

    def start(self, spec: ChildSpec) -> ChildHandle:
        """Start the child ``spec`` describes and return at once, usually before its pid is
        known; the caller talks to it through ``handle.channel`` (what it writes waits in the
        pipe). Raises :class:`~piwf.server.children.start_methods.ChildStartError` (an
        ``OSError``) when it could not be asked for; a start that fails later ends through
        ``on_exit`` (see the module docstring)."""
        self.prepare()
        assert self._starter is not None
        if spec.name in self.children:
            raise ChildStartError(errno.EEXIST, f"a child named {spec.name} is running")
        ensure_private_dir(self.log_dir)
        output = OutputCapture(
            self.loop, self.log_dir / f"{spec.name}.log", self.output_cap, label=spec.name
        )
        server_end, child_end = self._starter.context.Pipe(duplex=True)
        out_reader, out_fd = os.pipe()
        err_reader, err_fd = os.pipe()
        # Write-only connections, so the start method passes them on like the channel.
        out_writer = Connection(out_fd, readable=False)
        err_writer = Connection(err_fd, readable=False)
        directory = str(spec.cwd) if spec.cwd is not None and spec.cwd.is_dir() else "/"
        try:
            process = self._starter.start(
                name=spec.name,
                kind=spec.kind.value,
                directory=directory,
                environment=_child_environment(),
                connections=(child_end, out_writer, err_writer),
            )
        except BaseException:
            server_end.close()
            for reader in (out_reader, err_reader):
                os.close(reader)
            raise
        finally:
            for end in (child_end, out_writer, err_writer):
                end.close()  # the child holds its own copies now
        handle = ChildHandle(
            name=spec.name,
            process=process,
            channel=PipeChannel(server_end, MAX_FRAME_BYTES),
            output=output,
        )
        if spec.on_exit is not None:
            handle.on_exit.append(spec.on_exit)
        if spec.on_started is not None:
            handle.on_started.append(spec.on_started)
        self.children[spec.name] = handle
        output.watch(out_reader, "stdout")
        output.watch(err_reader, "stderr")
        self.loop.selector.register(
            process.sentinel, selectors.EVENT_READ, lambda _mask: self._sentinel_ready(handle)
        )
        if process.pid is not None:  # spawned: its own, unreaped child, so the pid is its own
            self._pid_came(handle, process.pid)
        else:
            # Taken now: a start that found its fork server dead launched a new one.
            timeout_s = self._starter.timeout_s
            handle.start_timer = self.loop.call_later(
                timeout_s, lambda: self._start_overdue(handle, timeout_s)
            )
        # Starting polls every earlier child (the standard library's bookkeeping), which may
        # have read another child's pid: look at them all once this returns.
        self.loop.call_later(0, self._look_for_pids)
        return handle

    def stop(self, handle: ChildHandle, grace_s: float = 2.0) -> None:
        """SIGTERM the child's descendants and process group, then SIGKILL them after
        ``grace_s``."""
        if handle.exited:
            return
        if handle.pid is None:
            pending = handle.stop_pending
            handle.stop_pending = grace_s if pending is None else min(pending, grace_s)
            return
        self._terminate(handle)
        if handle.kill_timer is None:
            handle.kill_timer = self.loop.call_later(grace_s, lambda: self.kill(handle))

    def kill(self, handle: ChildHandle) -> None:
        """SIGKILL the child's whole process group and every descendant now (frozen first, so
        none escapes by forking)."""
        if handle.exited:
            return
        if handle.pid is None:
            handle.kill_pending = True
            return
        self._kill_tree(handle)

    def poll(self) -> None:
        """Finish every child that has ended now (the loop does it after a sentinel or a
        SIGCHLD; callers may at any time)."""
        for handle in list(self.children.values()):
            if not handle.exited and self._look_at(handle) is not None:
                self._finish(handle)

    def stop_all(self, grace_s: float = 2.0) -> None:
        """Stop every child and wait for each (server shutdown), then end the start helpers
        (the fork server and the resource tracker) and stop capturing their output."""
        handles = list(self.children.values())
        for handle in handles:
            if handle.pid is None:
                handle.stop_pending = grace_s
            self._terminate(handle)
        if not self._wait_exited(handles, grace_s):
            for handle in handles:
                if not handle.exited and self._look_at(handle) is None:
                    self.kill(handle)
            self._wait_exited(handles, 5.0)
        for handle in handles:
            if handle.pid is None and not handle.exited:
                self._fail_start(handle, "the server stopped before the child's pid came")
            self._finish(handle)
        if self._starter is not None:
            self._starter.stop_helpers()
        if self._helpers is not None:
            self._helpers.close()
            self._helpers = None
        if self._helpers_writer is not None:
            with contextlib.suppress(OSError):
                os.close(self._helpers_writer)
            self._helpers_writer = None
        if self._reap_signalled in self.loop.on_wake:
            self.loop.on_wake.remove(self._reap_signalled)

    # -- exits ------------------------------------------------------------------------------

    def _sentinel_ready(self, handle: ChildHandle) -> None:
        awaited_pid = handle.pid is None
        ended = self._look_at(handle) is not None
        if awaited_pid and handle.pid is not None and not ended:
            return  # it was the pid; the exit comes later on the same descriptor
        # Either way the sentinel can tell nothing more: the child ended, or (spawned) it
        # closed its end of its own sentinel, and then SIGCHLD tells.
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(handle.process.sentinel)
        if not handle.exited and ended:
            self._poll_after_io()

    # -- pids -------------------------------------------------------------------------------

    def _look_at(self, handle: ChildHandle) -> int | None:
        """The child's exit code, or None while it runs; acts on its pid if that came first
        (read by this look, or earlier by anyone's poll), or on a start that failed."""
        code = handle.process.exitcode  # reads a pending pid before the exit status
        if handle.pid is None and not handle.exited:
            pid = handle.process.pid
            if pid is not None:
                self._pid_came(handle, pid)
            elif code is not None:
                assert self._starter is not None
                self._starter.lost_fork_server()
                self._fail_start(handle, "the fork server ended before it started the child")
        return code

    def _look_for_pids(self) -> None:
        for handle in list(self.children.values()):
            if handle.pid is None and not handle.exited and self._look_at(handle) is not None:
                self._poll_after_io()

    def _pid_came(self, handle: ChildHandle, pid: int) -> None:
        """Take the start identity, apply a stop or kill asked for meanwhile, then (from the
        loop) tell ``on_started``."""
        handle.pid = pid
        # Taken before the exit is looked at: a child already reaped (its status came with its
        # pid) may have passed its pid on, so then its identity is dropped, and nothing is
        # signalled for it.
        identity = start_identity(pid)
        ended = handle.process.exitcode is not None
        handle.identity = None if ended else identity
        if handle.start_timer is not None:
            handle.start_timer.cancel()
            handle.start_timer = None
        if self._starter is not None:
            self._starter.forked()
        if not ended and handle.kill_pending:
            self._kill_tree(handle)
        elif not ended and handle.stop_pending is not None:
            self.stop(handle, handle.stop_pending)
        self.loop.call_later(0, lambda: self._report_started(handle))

    def _report_started(self, handle: ChildHandle) -> None:
        if handle.started or handle.exited:
            return  # an exit reported it first (see _finish)
        handle.started = True
        for callback in handle.on_started:
            callback(handle)

    def _start_overdue(self, handle: ChildHandle, timeout_s: float) -> None:
        """The pid did not come in time: replace the fork server, fail this start."""
        handle.start_timer = None
        if handle.exited or self._look_at(handle) is not None or handle.pid is not None:
            return  # it came after all (the loop was late), or the start failed already
        assert self._starter is not None
        self._starter.replace_fork_server()
        self._fail_start(handle, timed_out(timeout_s))
        self._finish(handle)

    def _fail_start(self, handle: ChildHandle, why: str) -> None:
        """Record why the start failed; the exit (255) follows through :meth:`_finish`."""
        if handle.start_failure is None:
            handle.start_failure = why
            log.warning("child %s could not be started: %s", handle.name, why)
        if isinstance(handle.process, PidLaterProcess):
            handle.process.abandon()

    def _record_child_signal(self, _number: int, _frame: FrameType | None) -> None:
        self._child_signalled = True

    def _reap_signalled(self) -> None:
        if self._child_signalled:
            self._child_signalled = False
            self._poll_after_io()

    def _poll_after_io(self) -> None:
        """Finish ended children once this loop turn's I/O is done: what a child wrote before
        it exited is in its pipe, readable in the same turn, and is served before its end."""
        if not self._poll_scheduled:
            self._poll_scheduled = True
            self.loop.call_later(0, self._scheduled_poll)

    def _scheduled_poll(self) -> None:
        self._poll_scheduled = False
        self.poll()

    def _wait_exited(self, handles: list[ChildHandle], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every handle's process has ended; True if all did."""
        deadline = time.monotonic() + timeout_s
        while True:
            running = [h for h in handles if not h.exited and self._look_at(h) is None]
            remaining = deadline - time.monotonic()
            if not running or remaining <= 0:
                return not running
            wait([h.process.sentinel for h in running], min(_WAIT_SLICE_S, remaining))

    def _finish(self, handle: ChildHandle) -> None:
        if handle.exited:
            return
        handle.exit_status = handle.process.exitcode
        handle.exited = True
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(handle.process.sentinel)
        for timer in (handle.kill_timer, handle.start_timer):
            if timer is not None:
                timer.cancel()
        # The group may still hold grandchildren, descendants seen at a stop may have left it,
        # and a child whose fork server died may still run: no process of it survives it.
        if handle.pid is not None:
            self._kill_tree(handle)
        handle.output.close()
        if self.children.get(handle.name) is handle:
            del self.children[handle.name]
        # The callbacks run while the channel is still open: a reply written just before the
        # exit can still be read there (the resolver's answer). A child that started is
        # reported started first.
        try:
            if handle.pid is not None and not handle.started:
                handle.started = True
                for callback in handle.on_started:
                    callback(handle)
            for callback in handle.on_exit:
                callback(handle)
        finally:
            with contextlib.suppress(KeyError, ValueError):
                self.loop.selector.unregister(handle.channel.fd)
            handle.channel.close()
            with contextlib.suppress(ValueError):
                handle.process.close()

    # -- signals ----------------------------------------------------------------------------

    def _terminate(self, handle: ChildHandle) -> None:
        """SIGTERM the child's group and its descendants (remembered for its end)."""
        if handle.exited or handle.pid is None:
            return
        root = process_of(handle.identity)
        if root is not None:
            found = descendants(root)
            signal_processes(found, signal.SIGTERM)
            handle.descendants += found
        self._signal_group(handle, signal.SIGTERM, root)

    def _kill_tree(self, handle: ChildHandle) -> None:
        root = process_of(handle.identity)
        if root is not None:
            self._signal_group(handle, signal.SIGSTOP, root)
            handle.descendants += freeze_tree(root)
        self._signal_group(handle, signal.SIGKILL, root)
        signal_processes([p for p in handle.descendants if not is_gone(p)], signal.SIGKILL)

    def _signal_group(
        self, handle: ChildHandle, number: signal.Signals, root: psutil.Process | None
    ) -> None:
        """Signal the child's process group; before its first act made it one, the child
        itself (it has started nothing yet)."""
        if handle.pid is None:
            return
        try:
            os.killpg(handle.pid, number)
        except ProcessLookupError:
            if root is not None:
                signal_processes([root], number)
        except PermissionError:
            pass


def _child_environment() -> dict[str, str | None]:
    """The variables a child sets first: the server's fault injection is not meant for it;
    ``PIWF_CHILD_FAULTS`` (when set) becomes its ``PIWF_FAULTS``."""
    child_faults = os.environ.get("PIWF_CHILD_FAULTS") or None
    return {
        "PIWF_FAULTS": child_faults,
        "PIWF_FAULTS_LOG": os.environ.get("PIWF_FAULTS_LOG") if child_faults else None,
    }
