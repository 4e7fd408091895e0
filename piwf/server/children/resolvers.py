"""Supervised source-resolver children, driven by the server loop without blocking it.

One child per resolution (``ChildKind.RESOLVER``), started by the supervisor like a runner,
in its own session and process group: the server sends one request frame on the child's
channel (at once: it waits in the pipe while the child is forked) and waits (in the selector)
for one reply frame, the child's exit or a deadline. A child that could not be started,
overruns its deadline, is killed by a signal, or sends an oversized or malformed reply is
killed and the resolution fails with :class:`ResolverFailedError` (the caller answers
``unavailable`` and stores no receipt: a retry may succeed); the server itself never imports
the workflow. A child that **exits by itself** without an answer (the module called
``os._exit`` at import, or an exception the child could not answer for ended it) would do the
same again: the resolution gets a refusal reply naming what it loaded and the exit code
(``workflowLoad``, or the resource manager's load error), like any import failure. A channel
that ends before the exit is seen waits for the exit (its code decides), at most
``_EXIT_WAIT_S``. A resolver's captured output is kept in
``$PIWF_HOME/server/runners/resolver-*.log`` only when it wrote something; a refusal whose
child printed a traceback there (the user's code raised) names that file.

A workflow whose sources are unchanged since an earlier resolution forks no child: its answer
comes from :class:`~piwf.server.children.definition_cache.DefinitionCache` (still from the
loop, after :meth:`ResolverJobs.resolve` returns).
"""

from __future__ import annotations

import logging
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import PiwfError, WorkflowLoadError
from piwf.processes import ChildKind
from piwf.resource.errors import ResourceManagerLoadError
from piwf.server.children.definition_cache import DefinitionCache
from piwf.server.children.link import ChildLink
from piwf.server.children.pipes import PipeClosedError, PipeOverflowError
from piwf.server.children.start_methods import ChildStartError
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.loop import EventLoop, Timer
from piwf.state.failures import os_reason

log = logging.getLogger("piwf.server")

Done = Callable[[dict[str, JsonValue] | PiwfError], None]

#: How long a resolution whose child's channel ended waits for the child's exit to be seen.
_EXIT_WAIT_S = 5.0


class ResolverFailedError(WorkflowLoadError):
    """The resolver child died, timed out or answered nonsense (a retry may succeed)."""

    code = "resolverFailed"


@dataclass
class _Job:
    done: Done
    request: dict[str, JsonValue]
    handle: ChildHandle | None = None
    link: ChildLink | None = None
    deadline: Timer | None = None
    finished: bool = False


class ResolverJobs:
    """Starts resolver children and reports each one's reply exactly once."""

    def __init__(self, loop: EventLoop, supervisor: Supervisor, timeout_s: float) -> None:
        self.loop = loop
        self.supervisor = supervisor
        self.timeout_s = timeout_s
        self.jobs: list[_Job] = []
        self.cache = DefinitionCache()

    @property
    def active(self) -> int:
        """How many resolutions are waiting for their child."""
        return len(self.jobs)

    def resolve(self, request: dict[str, JsonValue], done: Done) -> None:
        """Start a child for ``request``; ``done`` gets its reply dict or an error (later, from
        the loop, never before this returns). Unchanged sources are answered from the cache."""
        cached = self.cache.lookup(request)
        if cached is not None:
            self.loop.call_later(0, lambda: done(cached))
            return
        job = _Job(done, request)
        self.jobs.append(job)
        project = request.get("projectPath")
        try:
            handle = self.supervisor.start(
                ChildSpec(
                    f"resolver-{secrets.token_hex(6)}",
                    ChildKind.RESOLVER,
                    cwd=Path(project) if isinstance(project, str) else None,
                    on_exit=lambda exited: self._exited(job, exited),
                )
            )
        except OSError as error:  # its text names the project directory: a payload field
            reason = error.strerror if isinstance(error, ChildStartError) else os_reason(error)
            log.warning("a resolver child could not be started: %s", reason)
            failure = ResolverFailedError(f"the resolver could not be started: {reason}")
            self.loop.call_later(0, lambda: self._finish(job, failure))
            return
        job.handle = handle
        job.link = ChildLink(
            self.loop,
            handle,
            lambda messages: self._received(job, messages),
            lambda why: self._broken(job, why),
        )
        job.link.watch()
        job.deadline = self.loop.call_later(self.timeout_s, lambda: self._timed_out(job))
        job.link.send(canonical.encode(request))

    def stop_all(self) -> None:
        """Fail every waiting resolution and kill its child (server shutdown)."""
        for job in list(self.jobs):
            self._finish(job, ResolverFailedError("the server is stopping"))

    def _received(self, job: _Job, messages: list[bytes]) -> None:
        try:
            reply = canonical.decode(messages[0])
        except PiwfError:
            self._finish(job, ResolverFailedError("the resolver sent a malformed answer"))
            return
        if not isinstance(reply, dict):
            self._finish(job, ResolverFailedError("the resolver sent a malformed answer"))
            return
        self._finish(job, self._pointed_at_log(job, reply))

    def _pointed_at_log(self, job: _Job, reply: dict[str, JsonValue]) -> dict[str, JsonValue]:
        """A refusal whose child printed a traceback (user code raised) says where it is: the
        child wrote it to stderr before its reply, so draining the capture now puts it in the
        log file. The message names the line; the traceback (source lines, values) stays in
        that private file."""
        error = reply.get("error")
        handle = job.handle
        if reply.get("ok") is not False or not isinstance(error, dict) or handle is None:
            return reply
        handle.output.drain()
        try:
            printed = handle.log_path.stat().st_size > 0
        except OSError:
            printed = False
        message = error.get("message")
        if not printed or not isinstance(message, str):
            return reply
        pointed = f"{message}; the traceback is in {handle.log_path}"
        return {**reply, "error": {**error, "message": pointed}}

    def _broken(self, job: _Job, why: str) -> None:
        if why == "overflow":
            self._finish(job, ResolverFailedError("the resolver sent an oversized answer"))
        elif job.handle is not None and not job.handle.exited:
            self._await_exit(job)
        else:
            self._finish(job, self._no_answer(job))

    def _await_exit(self, job: _Job) -> None:
        """The channel ended first: its exit (seen after this loop turn's I/O) decides; a child
        that closed its channel and lives on is killed after ``_EXIT_WAIT_S``."""
        if job.deadline is not None:
            job.deadline.cancel()
        subject, _ = _loading(job.request)
        closed = ResolverFailedError(
            f"the resolver child closed its channel without an answer while loading {subject}"
        )
        job.deadline = self.loop.call_later(_EXIT_WAIT_S, lambda: self._finish(job, closed))

    def _no_answer(self, job: _Job) -> dict[str, JsonValue] | PiwfError:
        """What a resolution whose child ended without an answer gets: a refusal naming what
        it loaded when the child exited by itself (loading again would end the same way), else
        (a signal, or no status) a :class:`ResolverFailedError` (a retry may succeed)."""
        subject, code = _loading(job.request)
        handle = job.handle
        returncode = None if handle is None else handle.returncode
        printed = ""
        if handle is not None and handle.log_path.exists():
            printed = f"; what it printed is in {handle.log_path}"
        if returncode is None or returncode < 0:
            how = "ended" if returncode is None else f"was killed by {_signal_name(-returncode)}"
            message = f"the resolver child {how} without an answer while loading {subject}"
            return ResolverFailedError(message + printed)
        when = (
            "at import or in its initial_status"
            if job.request.get("kind") == "resourceManager"
            else "at import"
        )
        message = (
            f"the resolver child exited with code {returncode} while loading {subject} (does "
            f"the module call os._exit or exit {when}?){printed}"
        )
        return {"ok": False, "error": {"code": code, "message": message}}

    def _exited(self, job: _Job, handle: ChildHandle) -> None:
        if job.deadline is not None:
            job.deadline.cancel()
        if not job.finished and handle.start_failure is not None:
            failure = f"the resolver could not be started: {handle.start_failure}"
            self._finish(job, ResolverFailedError(failure))
        if not job.finished:
            # The answer may have been written just before the exit and not read yet.
            try:
                messages = handle.channel.read_messages()
            except PipeOverflowError:
                self._broken(job, "overflow")
            except PipeClosedError:
                self._broken(job, "closed")
            else:
                if messages:
                    self._received(job, messages)
                else:
                    self._broken(job, "closed")

    def _timed_out(self, job: _Job) -> None:
        subject, _ = _loading(job.request)
        blocks = (
            "its module or initial_status"
            if job.request.get("kind") == "resourceManager"
            else "its module, when imported,"
        )
        message = (
            f"loading {subject} took longer than {self.timeout_s:g} s and was stopped; does "
            f"{blocks} wait on something (a network call, a sleep, a lock)? Fix that and try "
            "again, or give the server more time with PIWF_RESOLVER_TIMEOUT_S"
        )
        self._finish(job, ResolverFailedError(message))
        # Also a child that answered but never exited: it is not left behind.
        if job.handle is not None and not job.handle.exited:
            self.supervisor.kill(job.handle)

    def _finish(self, job: _Job, result: dict[str, JsonValue] | PiwfError) -> None:
        if job.finished:
            return
        job.finished = True
        if job in self.jobs:
            self.jobs.remove(job)
        if isinstance(result, PiwfError) and job.handle is not None:
            self.supervisor.kill(job.handle)
        if not isinstance(result, PiwfError):
            self.cache.remember(job.request, result)
        job.done(result)


def _loading(request: dict[str, JsonValue]) -> tuple[str, str]:
    """What a resolver request loads, for a message, and the code of a refusal to load it."""
    if request.get("kind") == "resourceManager":
        return f"resource manager {request.get('manager')!r}", ResourceManagerLoadError.code
    if request.get("kind") == "settingsCheck":
        return "the run's workflow sources", WorkflowLoadError.code
    return str(request.get("workflow")), WorkflowLoadError.code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
