"""Supervised source-resolver children, driven by the server loop without blocking it.

One child per resolution: the server starts it with the ``spawn`` context, sends one request
over a pipe, and waits (in the selector) for one reply, the child's exit or a deadline. A child
that overruns its deadline or sends an oversized or malformed reply is killed and the
resolution fails with a typed error; the server itself never imports the workflow.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import selectors
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import PiwfError, WorkflowLoadError
from piwf.runner.resolver import resolver_main
from piwf.server.loop import EventLoop, Timer
from piwf.server.pipes import PipeChannel, PipeClosedError, PipeOverflowError

log = logging.getLogger("piwf.server")

Done = Callable[[dict[str, JsonValue] | PiwfError], None]


class ResolverFailedError(WorkflowLoadError):
    """The resolver child died, timed out or answered nonsense (a retry may succeed)."""

    code = "resolverFailed"


@dataclass
class _Job:
    process: BaseProcess
    channel: PipeChannel
    done: Done
    deadline: Timer | None = None
    finished: bool = False


class ResolverJobs:
    """Starts resolver children and reports each one's reply exactly once."""

    def __init__(self, loop: EventLoop, timeout_s: float) -> None:
        self.loop = loop
        self.timeout_s = timeout_s
        self.context = multiprocessing.get_context("spawn")
        self.jobs: list[_Job] = []

    @property
    def active(self) -> int:
        """How many resolver children are running."""
        return len(self.jobs)

    def resolve(self, request: dict[str, JsonValue], done: Done) -> None:
        """Start a child for ``request``; ``done`` gets its reply dict or an error."""
        parent_end, child_end = self.context.Pipe(duplex=True)
        process = self.context.Process(
            target=resolver_main, args=(child_end,), name="piwf-resolver", daemon=True
        )
        process.start()
        child_end.close()
        channel = PipeChannel(parent_end, MAX_FRAME_BYTES)
        job = _Job(process, channel, done)
        job.deadline = self.loop.call_later(self.timeout_s, lambda: self._timed_out(job))
        self.jobs.append(job)
        self.loop.selector.register(channel.fd, selectors.EVENT_READ, lambda _m: self._read(job))
        try:
            channel.send(canonical.encode(request))
        except (PipeClosedError, PipeOverflowError) as error:
            self._finish(job, ResolverFailedError(f"the resolver could not be reached: {error}"))

    def stop_all(self) -> None:
        """Kill every running child (server shutdown)."""
        for job in list(self.jobs):
            self._finish(job, ResolverFailedError("the server is stopping"))

    def _read(self, job: _Job) -> None:
        try:
            messages = job.channel.read_messages()
        except PipeClosedError:
            self._finish(job, ResolverFailedError("the resolver exited without an answer"))
            return
        except PipeOverflowError:
            self._finish(job, ResolverFailedError("the resolver sent an oversized answer"))
            return
        if not messages:
            return
        try:
            reply = canonical.decode(messages[0])
        except PiwfError:
            self._finish(job, ResolverFailedError("the resolver sent a malformed answer"))
            return
        if not isinstance(reply, dict):
            self._finish(job, ResolverFailedError("the resolver sent a malformed answer"))
            return
        self._finish(job, reply)

    def _timed_out(self, job: _Job) -> None:
        self._finish(
            job, ResolverFailedError(f"loading the workflow took longer than {self.timeout_s:g} s")
        )

    def _finish(self, job: _Job, result: dict[str, JsonValue] | PiwfError) -> None:
        if job.finished:
            return
        job.finished = True
        if job.deadline is not None:
            job.deadline.cancel()
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.unregister(job.channel.fd)
        job.channel.close()
        self.jobs.remove(job)
        self._reap(job.process, kill=isinstance(result, PiwfError))
        job.done(result)

    def _reap(self, process: BaseProcess, *, kill: bool) -> None:
        """Collect the child without blocking the loop: now if it exited, else at its exit."""
        if kill and process.exitcode is None:
            process.kill()
        if process.exitcode is not None or not process.is_alive():
            process.join(timeout=0)
            process.close()
            return
        sentinel = process.sentinel

        def collect() -> None:
            # The sentinel closes a moment before the exit status can be collected.
            process.join(timeout=0)
            if process.exitcode is None:
                self.loop.call_later(0.01, collect)
                return
            process.close()

        def exited(_mask: int) -> None:
            self.loop.selector.unregister(sentinel)
            collect()

        self.loop.selector.register(sentinel, selectors.EVENT_READ, exited)
