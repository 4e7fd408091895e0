"""The server's end of the zygote (:mod:`piwf.runner.zygote`): start it, ask it for forks, hear
its children's exits, and restart it when it dies.

::

    idle ──first forkable start──▶ starting ──{"kind": "ready"}──▶ ready ──fork──▶ forked child
      ▲                               │                              │
      └── backoff 0.5 s, 1 s, … 30 s ─┴──── zygote exit / EOF / broken frame / fork timeout
                                            (five zygotes that never got ready: spawn only)

The zygote is started lazily, by the first start of an entry module, through the supervisor's
spawn path like any child (own session, children's environment, captured output); until it
reports ready, and whenever it is gone, :meth:`ZygoteForker.fork` returns None and the
supervisor spawns. A fork request is one blocking round trip on the control socket (bounded by
:data:`FORK_REPLY_TIMEOUT_S`): the request frame and the child's three descriptors in one
``sendmsg``, then the ``forked`` answer; exit reports read meanwhile are delivered in order.

A forked child's exit comes from the zygote's report. If the zygote dies first, its children
are orphans of the server's view: each is reported ended, status unknown, once its exact
process (start identity) is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import selectors
import socket
import struct
import time
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import PiwfError
from piwf.processes import is_alive, start_identity
from piwf.runner.zygote import ENTRY_MODULES
from piwf.server.children.pipes import PipeClosedError, PipeOverflowError
from piwf.server.children.supervisor import ChildHandle, Supervisor
from piwf.server.loop import EventLoop, Timer

log = logging.getLogger("piwf.server")

ZYGOTE_MODULE = "piwf.runner.zygote"
#: How long one fork request may take before the zygote is given up (and the child spawned).
FORK_REPLY_TIMEOUT_S = 2.0
#: How long a new zygote may take to import everything.
READY_TIMEOUT_S = 30.0
#: Restart delays after a zygote dies: doubling from the first, capped at the second.
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
#: A zygote that served this long before it died starts the backoff afresh.
STABLE_S = 60.0
#: Zygotes in a row that die before they are ready: then this server only spawns.
MAX_FAILED_STARTS = 5

_HEADER = struct.Struct("!i")


class ZygoteError(Exception):
    """A fork request got no usable answer; the zygote is given up."""


@dataclass
class ForkedProcess:
    """A child forked by the zygote; its exit status arrives as the zygote's report."""

    pid: int
    start_identity: str | None
    forker: ZygoteForker
    returncode: int | None = None
    ended: bool = False
    #: Its zygote died: no report will come, so its end is seen by its identity alone.
    orphaned: bool = False

    def poll(self) -> bool:
        """Whether it has ended (reported, or an orphan whose process is gone)."""
        if not self.ended and self.orphaned and _gone(self.pid, self.start_identity):
            self.ended = True
        return self.ended

    def wait(self, timeout_s: float) -> bool:
        """Read the zygote's reports (or watch an orphan) for up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.poll():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.orphaned:
                select.select([], [], [], min(0.02, remaining))
            else:
                self.forker.pump(min(0.1, remaining))
        return True

    def release(self) -> None:
        """Nothing to collect: the zygote (or, for an orphan, init) reaped it."""


class ZygoteForker:
    """Implements :class:`~piwf.server.children.supervisor.Forker` with one zygote process."""

    def __init__(self, loop: EventLoop, supervisor: Supervisor) -> None:
        self.loop = loop
        self.supervisor = supervisor
        self.handle: ChildHandle | None = None
        #: A second descriptor of the control socket, for ``sendmsg`` with SCM_RIGHTS.
        self.control: socket.socket | None = None
        self.ready = False
        self.ready_at = 0.0
        self.disabled = False
        self.stopping = False
        self.failed_starts = 0
        self.deaths = 0
        self.processes: dict[int, ForkedProcess] = {}
        self._restart: Timer | None = None
        self._ready_timer: Timer | None = None
        self._next_id = 0
        self._backlog: list[dict[str, JsonValue]] = []

    # -- the Forker protocol ------------------------------------------------------------------

    def fork(
        self, module: str, directory: str, descriptors: tuple[int, int, int]
    ) -> ForkedProcess | None:
        """Fork ``module`` from the zygote, or return None (spawn instead): not an entry
        module, no zygote ready yet (one is started), or the request failed."""
        if module not in ENTRY_MODULES or self.stopping or self.disabled:
            return None
        if not self.ready or self.control is None:
            self._start_if_idle()
            return None
        self._next_id += 1
        request: dict[str, JsonValue] = {
            "kind": "fork",
            "id": self._next_id,
            "module": module,
            "cwd": directory,
        }
        try:
            pid, identity = self._request(request, descriptors)
        except ZygoteError as error:
            log.warning("zygote: %s; spawning instead", error)
            self._give_up()
            return None
        except _RefusedError as error:
            log.warning("zygote refused to fork %s: %s; spawning instead", module, error)
            return None
        process = ForkedProcess(pid, identity, self)
        self.processes[pid] = process
        if self._backlog:
            # Reports read after the answer (this child's exit among them) are delivered once
            # the supervisor holds its handle.
            self.loop.call_later(0, self._deliver_backlog)
        return process

    def owns(self, handle: ChildHandle) -> bool:
        """Whether ``handle`` is the zygote itself."""
        return handle is self.handle

    def stop(self) -> None:
        """Close the control socket's sending side: the zygote exits at that end-of-file."""
        self.stopping = True
        self.ready = False
        for timer in (self._restart, self._ready_timer):
            if timer is not None:
                timer.cancel()
        if self.control is not None:
            with contextlib.suppress(OSError):
                self.control.shutdown(socket.SHUT_WR)

    # -- reports ----------------------------------------------------------------------------

    def pump(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the zygote's frames and handle them (shutdown waits)."""
        handle = self.handle
        if handle is None or handle.exited:
            self._lost("the zygote is gone")
            return
        readable, _, _ = select.select([handle.channel.fd], [], [], timeout_s)
        if readable:
            self._readable(selectors.EVENT_READ)

    def _readable(self, _mask: int) -> None:
        handle = self.handle
        if handle is None:
            return
        self._deliver_backlog()
        try:
            messages = handle.channel.read_messages()
        except PipeClosedError:
            self._lost("its control socket closed")
            return
        except PipeOverflowError:
            self._lost("it sent an oversized frame")
            return
        for raw in messages:
            frame = _decode(raw)
            if frame is None:
                self._lost("it sent a malformed frame")
                return
            self._dispatch(frame)

    def _dispatch(self, frame: dict[str, JsonValue]) -> None:
        kind = frame.get("kind")
        if kind == "ready":
            self._became_ready()
        elif kind == "exited":
            self._exited(frame)
        # A late answer to an abandoned request cannot arrive: that zygote was given up.

    def _exited(self, frame: dict[str, JsonValue]) -> None:
        pid = frame.get("pid")
        process = self.processes.pop(pid, None) if isinstance(pid, int) else None
        if process is None:
            return
        code, number = frame.get("exitCode"), frame.get("signal")
        if isinstance(code, int):
            process.returncode = code
        elif isinstance(number, int):
            process.returncode = -number
        process.ended = True
        self.loop.call_later(0, self.supervisor.poll)

    def _deliver_backlog(self) -> None:
        backlog, self._backlog = self._backlog, []
        for frame in backlog:
            self._dispatch(frame)

    # -- one fork request -------------------------------------------------------------------

    def _request(
        self, request: dict[str, JsonValue], descriptors: tuple[int, int, int]
    ) -> tuple[int, str | None]:
        handle, control = self.handle, self.control
        assert handle is not None
        assert control is not None
        body = canonical.encode(request)
        frame = _HEADER.pack(len(body)) + body
        try:
            sent = socket.send_fds(control, [frame], list(descriptors))
        except OSError as error:
            raise ZygoteError(f"the fork request could not be sent ({error})") from None
        if sent != len(frame):
            raise ZygoteError("the fork request was cut short")
        deadline = time.monotonic() + FORK_REPLY_TIMEOUT_S
        answer: dict[str, JsonValue] | None = None
        while answer is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ZygoteError(f"no fork answer in {FORK_REPLY_TIMEOUT_S:g} s")
            readable, _, _ = select.select([handle.channel.fd], [], [], remaining)
            if not readable:
                continue
            try:
                messages = handle.channel.read_messages()
            except (PipeClosedError, PipeOverflowError):
                raise ZygoteError("the zygote went away during a fork request") from None
            for raw in messages:
                frame_in = _decode(raw)
                if frame_in is None:
                    raise ZygoteError("the zygote sent a malformed frame")
                if answer is not None:
                    self._backlog.append(frame_in)
                elif frame_in.get("id") == request["id"]:
                    answer = frame_in
                else:
                    self._dispatch(frame_in)
        if answer.get("kind") == "refused":
            raise _RefusedError(str(answer.get("error")))
        pid, identity = answer.get("pid"), answer.get("identity")
        if answer.get("kind") != "forked" or not isinstance(pid, int) or pid <= 0:
            raise ZygoteError("the zygote answered a fork request with nonsense")
        return pid, identity if isinstance(identity, str) else None

    # -- the zygote's own life --------------------------------------------------------------

    def _start_if_idle(self) -> None:
        if self.handle is not None or self._restart is not None:
            return
        self._start()

    def _start(self) -> None:
        self._restart = None
        if self.stopping or self.disabled or self.handle is not None:
            return
        try:
            handle = self.supervisor.start("zygote", ZYGOTE_MODULE, on_exit=self._zygote_exited)
        except Exception as error:  # children are spawned meanwhile
            log.warning("zygote: not started (%s)", error)
            self._schedule_restart(ready=False)
            return
        self.handle = handle
        self.control = socket.socket(fileno=os.dup(handle.channel.fd))
        self.control.setblocking(False)
        self.loop.selector.register(handle.channel.fd, selectors.EVENT_READ, self._readable)
        self._ready_timer = self.loop.call_later(READY_TIMEOUT_S, self._ready_overdue)

    def _became_ready(self) -> None:
        if self.handle is None or self.stopping:
            return
        self.ready = True
        self.ready_at = time.monotonic()
        self.failed_starts = 0
        if self._ready_timer is not None:
            self._ready_timer.cancel()
        log.info("zygote ready: pid %d", self.handle.pid)

    def _ready_overdue(self) -> None:
        if self.handle is not None and not self.ready:
            self._lost(f"it was not ready in {READY_TIMEOUT_S:g} s")

    def _zygote_exited(self, handle: ChildHandle) -> None:
        if handle is not self.handle:
            return
        # Reports written just before it died are still in the socket: deliver them first.
        with contextlib.suppress(PipeClosedError, PipeOverflowError):
            for raw in handle.channel.read_messages():
                frame = _decode(raw)
                if frame is not None:
                    self._dispatch(frame)
        how = "no status" if handle.returncode is None else f"status {handle.returncode}"
        self._lost(f"it exited ({how})")

    def _give_up(self) -> None:
        self._lost("a fork request failed")

    def _lost(self, why: str) -> None:
        """Forget the zygote: kill it if it still runs, orphan its children, maybe restart."""
        handle = self.handle
        if handle is None:
            return
        if not handle.exited:
            # While it is still this forker's handle: the supervisor then signals the zygote's
            # group only, never the tree of forked children it would otherwise walk.
            self.supervisor.kill(handle)
        was_ready = self.ready
        self.handle = None
        self.ready = False
        if self._ready_timer is not None:
            self._ready_timer.cancel()
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(handle.channel.fd)
        if self.control is not None:
            self.control.close()
            self.control = None
        for process in self.processes.values():
            process.orphaned = True
        self.processes.clear()
        self._backlog.clear()
        if self.stopping:
            return
        log.warning("zygote lost: %s", why)
        if was_ready and time.monotonic() - self.ready_at >= STABLE_S:
            self.deaths = 0
        self._schedule_restart(ready=was_ready)
        self.loop.call_later(0, self.supervisor.poll)

    def _schedule_restart(self, *, ready: bool) -> None:
        if not ready:
            self.failed_starts += 1
            if self.failed_starts >= MAX_FAILED_STARTS:
                log.warning(
                    "zygote: %d in a row never got ready; children are spawned from now on",
                    self.failed_starts,
                )
                self.disabled = True
                return
        self.deaths += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self.deaths - 1))
        self._restart = self.loop.call_later(delay, self._start)


class _RefusedError(Exception):
    """The zygote answered ``refused``: this child is spawned, the zygote stays."""


def _decode(raw: bytes) -> dict[str, JsonValue] | None:
    try:
        frame = canonical.decode(raw)
    except PiwfError:
        return None
    return frame if isinstance(frame, dict) else None


def _gone(pid: int, identity: str | None) -> bool:
    if identity is not None:
        return not is_alive(identity)
    return start_identity(pid) is None
