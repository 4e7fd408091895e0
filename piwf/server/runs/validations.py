"""Supervised validation children: every agent submission is validated in one, never here.

A ``validating`` submission (:mod:`piwf.state.execution.submissions`) waits in :attr:`Validations
.ready` until the pool admits it; then one child (``ChildKind.VALIDATOR``,
:mod:`piwf.runner.validator`) validates it and its reply settles it::

    request(submission)  ─▶ ready ─admit (pool capacity)─▶ begin_validation: a new validation id
      ─▶ start the child ─validate (piwf.validator.v1)─▶ child
      child ─read─▶ a part of a context too large for one frame
      child ─result─▶ settle_accepted | settle_rejected, fenced by that validation id
      child exits without a result, or overruns ─▶ rejected: "validation stopped before it
                                                   reported: ...; submit again"

**Admission** (docs/EXECUTION.md, "Capacity"): ready validations are admitted before runs and
reconciles. A validation for a run whose runner is live here borrows that runner's slot (the
runner waits, idle, on the request: without the borrow a full pool would wait on itself); every
other validation takes a slot like a runner, for as long as its child lives.

**Deadline**: ``validate`` itself is bounded in the child (``timeout_s``, 30 s by default); the
server kills a child still alive ``grace_s`` after that. **Shutdown** leaves the submissions
``validating``: startup recovery (step 9) validates each again, once, in a new child.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from piwf.canonical import JsonValue
from piwf.errors import PiwfError, StateUnavailableError
from piwf.lifecycle import Conflict
from piwf.processes import ChildKind
from piwf.protocol import content
from piwf.protocol.validator_v1 import Part, Read, Validate, child_message
from piwf.server.children.link import ChildLink
from piwf.server.children.pipes import PipeClosedError, PipeOverflowError
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.failures import RetryDelay, retry_later
from piwf.server.loop import EventLoop, Timer
from piwf.server.runs.content_transfer import ContentTransfer
from piwf.server.runs.recorded_sources import workflow_source
from piwf.state import StateDatabase
from piwf.state.enums import ActorType
from piwf.state.execution import submissions as sub
from piwf.state.failures import os_reason
from piwf.state.records import Actor
from piwf.state.server_epoch import ServerClaim, verify_server_claim
from piwf.workflow.port_codec import to_json

log = logging.getLogger("piwf.server")

#: How a candidate whose child stopped before it reported is rejected (the reason follows).
STOPPED = "validation stopped before it reported: {why}; submit again"


@dataclass(frozen=True)
class ValidationSettings:
    """How long ``validate`` may run in the child, and the server's grace after that."""

    timeout_s: float = 30.0
    grace_s: float = 10.0


@dataclass(eq=False)
class _Job:
    submission_id: str
    run_id: str
    validation_id: str
    borrows: bool
    transfer: ContentTransfer
    handle: ChildHandle | None = None
    link: ChildLink | None = None
    deadline: Timer | None = None
    finished: bool = False
    retry: RetryDelay = field(default_factory=RetryDelay)


class Validations:
    """The validation children of one server and the submissions waiting for one."""

    def __init__(
        self,
        *,
        db: StateDatabase,
        loop: EventLoop,
        supervisor: Supervisor,
        server_claim: Callable[[], ServerClaim],
        settings: ValidationSettings,
        has_live_runner: Callable[[str], bool],
        settled: Callable[[sub.SubmissionRow], None],
        freed: Callable[[], None],
    ) -> None:
        self.db = db
        self.loop = loop
        self.supervisor = supervisor
        self.server_claim = server_claim
        self.settings = settings
        #: Whether this server runs a live runner for a run (its validations borrow its slot).
        self.has_live_runner = has_live_runner
        #: Called once a submission's outcome is durable (reply to its waiters).
        self.settled = settled
        #: Called when a child ended (its slot is free: schedule).
        self.freed = freed
        #: Submissions waiting for admission, oldest first: (submission id, run id).
        self.ready: deque[tuple[str, str]] = deque()
        self.jobs: dict[str, _Job] = {}
        self.stopping = False

    # -- admission (driven by the pool's schedule) ---------------------------------------------

    def request(self, submission_id: str, run_id: str) -> None:
        """Queue ``submission_id`` for a validation child (once; the pool admits it)."""
        queued = any(waiting == submission_id for waiting, _ in self.ready)
        running = any(job.submission_id == submission_id for job in self.jobs.values())
        if not (queued or running):
            self.ready.append((submission_id, run_id))

    def busy_slots(self) -> int:
        """Slots held by validation children that took one (borrowers hold none)."""
        return sum(1 for job in self.jobs.values() if not job.borrows)

    def admit_borrowers(self) -> None:
        """Start every ready validation whose run has a live runner here (no slot needed)."""
        for submission_id, run_id in list(self.ready):
            if self.has_live_runner(run_id):
                self.ready.remove((submission_id, run_id))
                if not self._start(submission_id, run_id, borrows=True):
                    return

    def admit(self) -> bool:
        """Start the oldest ready validation in a free slot; False when none is ready (or the
        database cannot record its start now: it stays ready for the pool's next pass)."""
        if self.stopping or not self.ready:
            return False
        submission_id, run_id = self.ready.popleft()
        return self._start(submission_id, run_id, borrows=self.has_live_runner(run_id))

    def stop_all(self) -> None:
        """Server shutdown: kill every child and leave its submission ``validating`` (the
        next server validates it again)."""
        self.stopping = True
        self.ready.clear()
        for job in list(self.jobs.values()):
            job.finished = True
            if job.handle is not None and not job.handle.exited:
                self.supervisor.kill(job.handle)

    # -- one child ----------------------------------------------------------------------------

    def _start(self, submission_id: str, run_id: str, *, borrows: bool) -> bool:
        """Give the submission to a new child; False when it was put back to wait."""
        validation_id = f"validation-{secrets.token_hex(8)}"
        job = _Job(submission_id, run_id, validation_id, borrows, ContentTransfer(self.db))
        source: dict[str, object] = {}
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                begun = sub.begin_validation(tx, submission_id, validation_id)
                if isinstance(begun, sub.ValidationStart):
                    source = workflow_source(tx, begun.request.run_id)
        except StateUnavailableError as error:
            # Nothing was written: it waits again, and the pool's next pass admits it.
            log.warning("submission %s: its validation waits (%s)", submission_id, error.code)
            self.ready.appendleft((submission_id, run_id))
            return False
        except PiwfError as error:
            log.warning("submission %s: starting its validation failed: %s", submission_id, error)
            return True
        if isinstance(begun, sub.SubmissionRow):
            self.settled(begun)  # nothing left to validate: it settled (or its request closed)
            return True
        if begun is None:
            return True
        try:
            envelope = self._envelope(job, begun, source)
        except StateUnavailableError as error:  # storing a large context failed: wait again
            log.warning("submission %s: its validation waits (%s)", submission_id, error.code)
            self.ready.appendleft((submission_id, run_id))
            return False
        project = begun.project_path
        try:
            handle = self.supervisor.start(
                ChildSpec(
                    validation_id,
                    ChildKind.VALIDATOR,
                    cwd=Path(project) if project else None,
                    on_exit=lambda exited: self._exited(job, exited),
                )
            )
        except OSError as error:
            reason = os_reason(error)
            log.warning("a validation child could not be started: %s", reason)
            self._reject(
                job, STOPPED.format(why=f"the validation child could not start ({reason})")
            )
            return True
        self.jobs[validation_id] = job
        job.handle = handle
        job.link = ChildLink(
            self.loop,
            handle,
            lambda messages: self._received(job, messages),
            lambda why: self._broken(job, why),
        )
        job.link.watch()
        overrun_s = self.settings.timeout_s + self.settings.grace_s
        job.deadline = self.loop.call_later(overrun_s, lambda: self._overran(job))
        job.link.send(envelope)
        return True

    def _envelope(self, job: _Job, begun: sub.ValidationStart, source: dict[str, object]) -> bytes:
        context = {"savedRun": to_json(begun.saved), "candidate": begun.candidate}
        fields = {
            "validationId": job.validation_id,
            "runId": begun.request.run_id,
            "requestId": begun.request.request_id,
            "projectPath": begun.project_path,
            "workflowSource": source,
            "definitionDigest": begun.definition_digest,
            "timeoutMs": max(1, int(self.settings.timeout_s * 1000)),
        }
        frame = Validate.model_validate({**fields, "context": context}).encode()
        if len(frame) <= content.INLINE_LIMIT:
            return frame
        # A run whose saved state passes one frame: the child reads it back in parts.
        return Validate.model_validate({**fields, "context": job.transfer.offer(context)}).encode()

    def _received(self, job: _Job, messages: list[bytes]) -> None:
        for raw in messages:
            if job.finished:
                return
            try:
                message = child_message(raw)
            except (PiwfError, ValidationError):
                self._stop(job, "it sent a malformed message")
                return
            if message.validation_id != job.validation_id:
                self._stop(job, "it sent a message of another validation")
                return
            if isinstance(message, Read):
                self._serve_part(job, message)
                continue
            job.finished = True
            if message.outcome == "accepted":
                self._settle(job, accepted=True, value=message.value)
            else:
                self._settle(job, accepted=False, error=message.error or "rejected by validate")

    def _serve_part(self, job: _Job, read: Read) -> None:
        try:
            part = job.transfer.read_part({"sha256": read.sha256, "offset": read.offset})
        except content.ContentError as error:
            self._stop(job, f"its content read was refused: {error}")
            return
        reply = Part.model_validate({"validationId": job.validation_id, **part})
        if job.link is not None:
            job.link.send(reply.encode())

    def _broken(self, job: _Job, why: str) -> None:
        if why == "overflow":
            self._stop(job, "it sent a reply larger than one frame")
        # A closed pipe is the child ending: its exit decides (a result may still be read).

    def _exited(self, job: _Job, handle: ChildHandle) -> None:
        if job.deadline is not None:
            job.deadline.cancel()
        self.jobs.pop(job.validation_id, None)
        if not job.finished and not self.stopping:
            try:  # a result written just before the exit may not have been read yet
                messages = handle.channel.read_messages()
            except (PipeClosedError, PipeOverflowError):
                messages = []
            if messages:
                self._received(job, messages)
            if not job.finished:
                status = handle.returncode
                how = f"the validation child exited ({_exit_text(status)})"
                self._reject(job, STOPPED.format(why=how))
        self.freed()

    def _overran(self, job: _Job) -> None:
        limit = self.settings.timeout_s + self.settings.grace_s
        self._stop(job, f"it ran longer than {limit:g} s")

    def _stop(self, job: _Job, why: str) -> None:
        """Kill ``job``'s child and reject its candidate (unless it already reported)."""
        if not job.finished:
            job.finished = True
            self._reject(job, STOPPED.format(why=why))
        if job.handle is not None and not job.handle.exited:
            self.supervisor.kill(job.handle)

    def _reject(self, job: _Job, error: str) -> None:
        job.finished = True
        self._settle(job, accepted=False, error=error)

    def _settle(
        self, job: _Job, *, accepted: bool, value: JsonValue = None, error: str | None = None
    ) -> None:
        actor = Actor(ActorType.SERVER, self.server_claim().server_id)
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                if accepted:
                    settled = sub.settle_accepted(
                        tx, job.submission_id, job.validation_id, value, actor=actor
                    )
                else:
                    settled = sub.settle_rejected(
                        tx, job.submission_id, job.validation_id, error or "rejected"
                    )
        except StateUnavailableError as error_:
            log.warning(
                "submission %s: settling failed (%s); retrying", job.submission_id, error_.code
            )
            retry_later(
                self.loop.call_later,
                job.retry,
                lambda: not self.stopping,
                lambda: self._settle(job, accepted=accepted, value=value, error=error),
            )
            return
        except PiwfError as error_:
            log.warning("submission %s: settling failed: %s", job.submission_id, error_)
            return
        if isinstance(settled, Conflict):
            log.info("submission %s: a stale validation reply was ignored", job.submission_id)
            return
        log.info("submission %s: %s", job.submission_id, settled.outcome.value)
        self.settled(settled)


def _exit_text(status: int | None) -> str:
    if status is None:
        return "status unknown"
    if status < 0:
        return f"killed by signal {-status}"
    return f"exit status {status}"
