"""One runner session: the server's whole conversation with one run generation's child.

The pool (:mod:`piwf.server.runs.pool`) claims a run, records the launch, starts the child and
hands it to a :class:`RunnerSession`, which from then on owns everything that child says and
everything said to it::

    launch envelope ─▶ child
    child ─ready──────────▶ mark ready (one run change) ─▶ the one command ─▶ child
    child ─sourceChanged──▶ park the run sourceChanged
    child ─call───────────▶ content.read | content.part    parts of values too large for a frame
                            read_run | steps.read         the run's own saved state (or a parent's):
                                                          its first steps, then pages of the rest
                                                          (server/runs/saved_reads.py)
                            a state change (or a batch)   decoded, applied in the loop turn's
                                                          group commit under this generation's
                                                          own claim, answered after the commit
                                                          (server/runs/state_calls.py)
                            process.register | process.unregister   its headless agent
                                                          command (server/runs/agents.py)
    child ─exiting────────▶ noted; the exit itself comes from the supervisor
    server ─interaction.settled─▶ child   once, when its command's request stops being pending
    child exits ──────────▶ reap the agent groups it left registered, record its one outcome
                            and decide the run, in the loop turn's group commit
                            (server/runs/runner_records.py)

Every message is checked for this run, generation and runner epoch before its payload is read:
another run is a protocol violation (the child is killed, the run parks ``protocolRejected``);
another generation is a stale runner (one ``claimLost`` answer, then it is stopped). Deadlines:
the child must report ``ready`` in time, and a node still running a grace period past its
deadline is killed (the engine's own timeout comes first).

While the database cannot serve (``StateUnavailableError``) a call, the ready report or the exit
record is retried after a growing delay instead of being answered or dropped: the child waits and
keeps its slot.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import ClaimLostError, PiwfError, StateUnavailableError
from piwf.lifecycle import CommandKind, Conflict
from piwf.protocol import content
from piwf.protocol.runner_v1 import (
    AGENT_OPERATION,
    CONTENT_OPERATIONS,
    CallResponse,
    ChildMessage,
)
from piwf.server.children.pipes import PipeClosedError, PipeOverflowError
from piwf.server.children.supervisor import ChildHandle
from piwf.server.failures import RetryDelay
from piwf.server.loop import EventLoop, Timer
from piwf.server.runs.agents import AgentCalls
from piwf.server.runs.attempt_output import AttemptOutput
from piwf.server.runs.content_transfer import ContentTransfer
from piwf.server.runs.runner_records import ExitRecord
from piwf.server.runs.saved_reads import SAVED_RUN_OPERATIONS, answer_read, command_frame
from piwf.server.runs.state_calls import ReadyReport, serve_state_call
from piwf.state import StateDatabase, Transaction
from piwf.state import execution as ex
from piwf.state.enums import ActorType, RunnerStatus
from piwf.state.execution import attempts
from piwf.state.execution.core import RunLaunch
from piwf.state.leases import Claim
from piwf.state.records import Actor
from piwf.workflow import port
from piwf.workflow.commands import RestartCommand, ResumeCommand, StartCommand, command_to_json
from piwf.workflow.shell_runner import KILL_GRACE_S
from piwf.workflow.sources import SourceDrift

log = logging.getLogger("piwf.server")

#: How long past a node's deadline the server waits for the engine's own timeout before it
#: kills the child. The engine needs up to the shell node's SIGTERM-to-SIGKILL grace to stop a
#: command that ignores SIGTERM, then a moment to report; a backstop that fired first would
#: turn that timeout into a killed runner, and a crash retry would run the command again.
DEADLINE_GRACE_S = KILL_GRACE_S + 3.0


class SessionHost(Protocol):
    """What a session needs from the pool that runs it."""

    db: StateDatabase
    loop: EventLoop

    @property
    def owner_id(self) -> str:
        """The lease owner id of this server's run claims."""
        ...

    @property
    def lease_ms(self) -> int:
        """How long a run claim lasts between renewals."""
        ...

    def verify_server_claim(self, tx: Transaction) -> None:
        """Raise unless this server still holds its epoch (inside ``tx``)."""
        ...

    def is_current(self, session: RunnerSession) -> bool:
        """Whether ``session`` is still the generation the pool executes for its run."""
        ...

    def stop(self, session: RunnerSession, reason: RunnerStatus, *, kill: bool = False) -> None:
        """Stop the session's child (``kill``: at once) and remember why."""
        ...

    def retry_later(
        self,
        session: RunnerSession,
        what: str,
        error: StateUnavailableError,
        again: Callable[[], object],
    ) -> None:
        """Run ``again`` after a growing delay while ``session`` is still current."""
        ...

    def run_changed(self, run_id: str) -> None:
        """Tell the clients waiting on ``run_id`` that it changed."""
        ...

    def ended(self, session: RunnerSession) -> None:
        """The session's exit is recorded: free its slot and schedule the next run."""
        ...

    def fill_spares(self) -> None:
        """A runner became ready: start spare runners for the free slots (spares.py)."""
        ...

    def agent_activity(self, run_id: str) -> None:
        """An agent process of ``run_id`` was registered or unregistered: its active time
        started or stopped counting (the deadline timer is recomputed)."""
        ...


@dataclass(eq=False)
class RunnerSession:
    """One run generation the server is executing, and its child's conversation."""

    host: SessionHost
    launch: RunLaunch
    claim: Claim
    runner_epoch: str
    #: Values too large for one frame moving to and from this child.
    transfer: ContentTransfer
    handle: ChildHandle | None = None
    ready: bool = False
    ended: bool = False
    stop_reason: RunnerStatus | None = None
    #: True once this server's own claim check failed for this runner (expired, or another
    #: owner has the run now); the exit then decides the run only if no newer generation does.
    server_lost_claim: bool = False
    #: Set when the runner broke the runner protocol: the broken rule, never a payload value.
    protocol_rejection: str | None = None
    ready_timer: Timer | None = None
    #: Delays between retries of this generation's writes while the database cannot serve.
    state_retry: RetryDelay = field(default_factory=RetryDelay)
    #: Its headless agent command's calls and request (set on first use).
    agents: AgentCalls | None = None
    #: Where its captured output goes: each node attempt's own log (set when attached).
    attempt_output: AttemptOutput | None = None
    #: The state-change call waiting for this loop turn's group commit, if any.
    queued_call: ChildMessage | None = None

    @property
    def run_id(self) -> str:
        """The run this generation executes."""
        return self.launch.run_id

    # -- the child's pipe ------------------------------------------------------------------

    def attach(self, handle: ChildHandle, envelope: bytes, ready_timeout_s: float) -> None:
        """Watch the started child's pipe, start its ready deadline, send its launch envelope."""
        self.handle = handle
        # The state home is the database's directory (piwf.config.state_path).
        home = self.host.db.path.parent
        self.attempt_output = AttemptOutput(home, handle.output, self.run_id)
        self.host.loop.selector.register(handle.channel.fd, selectors.EVENT_READ, self._io())
        self.ready_timer = self.host.loop.call_later(ready_timeout_s, self._ready_overdue)
        self._send(envelope)

    def _io(self) -> Callable[[int], None]:
        """The selector callback of the child's pipe: flush queued output, then read."""

        def on_event(mask: int) -> None:
            if mask & selectors.EVENT_WRITE:
                self._flush()
            if mask & selectors.EVENT_READ:
                self._readable()

        return on_event

    def _readable(self) -> None:
        handle = self.handle
        assert handle is not None
        try:
            messages = handle.channel.read_messages()
        except PipeClosedError:
            self.unregister()
            return
        except PipeOverflowError:
            self.unregister()
            self.reject_protocol("the runner sent a frame over the 1 MiB frame limit")
            return
        for raw in messages:
            if self.queued_call is not None:
                # A later message is judged after the earlier one is committed and answered
                # (which may have stopped this runner).
                self.host.db.group.flush()
            if self.stop_reason is not None:
                # Being stopped (claim loss, protocol violation, deadline, cancel, shutdown):
                # nothing it sends from now on is applied, even what was already in the pipe,
                # but an agent group it shut down may still be unregistered.
                if _is_unregister(raw):
                    self._serve(raw)
                    continue
                return
            self._serve(raw)

    def _send(self, data: bytes) -> None:
        handle = self.handle
        if handle is None or handle.exited:
            return
        try:
            handle.channel.send(data)
        except (PipeClosedError, PipeOverflowError):
            self.unregister()
            return
        self._watch_output()

    def _flush(self) -> None:
        handle = self.handle
        if handle is None or handle.exited:
            return
        try:
            handle.channel.flush()
        except PipeClosedError:
            self.unregister()
            return
        self._watch_output()

    def _watch_output(self) -> None:
        """Ask the selector for writability only while output waits (a large frame)."""
        handle = self.handle
        assert handle is not None
        events = selectors.EVENT_READ
        if handle.channel.wants_write:
            events |= selectors.EVENT_WRITE
        with contextlib.suppress(KeyError, ValueError):
            self.host.loop.selector.modify(handle.channel.fd, events, self._io())

    def unregister(self) -> None:
        """Stop watching the child's pipe (it closed, or the child is being stopped)."""
        if self.handle is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.host.loop.selector.unregister(self.handle.channel.fd)

    # -- serving the child -----------------------------------------------------------------

    def _serve(self, raw: bytes) -> None:
        try:
            message = ChildMessage.model_validate(canonical.decode(raw))
        except (PiwfError, ValidationError):
            self.reject_protocol("the runner sent a message that is not runner.v1")
            return
        if message.run_id != self.run_id:
            if message.kind == "call" and message.message_id:
                self.respond(message.message_id, "rejected", error="protocolRejected: not this run")
            self.reject_protocol("a runner message named another run than its own")
            return
        if (
            message.generation != self.launch.generation
            or message.runner_epoch != self.runner_epoch
        ):
            if message.kind == "call" and message.message_id:
                self.respond(message.message_id, "claimLost", error="stale generation")
            self.host.stop(self, RunnerStatus.CLAIM_LOST)
            return
        if message.kind == "ready":
            self._ready()
        elif message.kind == "sourceChanged":
            self._source_changed(
                SourceDrift(tuple(message.files or ()), tuple(message.missing or ()))
            )
        elif message.kind == "call":
            self._call(message)
        elif message.kind == "exiting":
            self.ended = True

    def _ready(self) -> None:
        if self.ready_timer is not None:
            self.ready_timer.cancel()
        self.queue_ready_report()

    def queue_ready_report(self) -> None:
        """Mark the runner ready (a repeat is adopted) in the loop turn's group commit; its one
        command is sent once that committed (server/runs/state_calls.py, ``ReadyReport``)."""
        self.host.db.group.defer(ReadyReport(self))

    def ready_committed(
        self, result: object, revision: int, saved: ex.SavedRunHead | None = None
    ) -> None:
        """The ready report committed (``result`` as :func:`ex.mark_runner_ready` returned it,
        ``revision`` the run's revision after it, ``saved`` the run as that revision left it,
        with its first steps): send the one command, with ``saved`` when the frame stays
        inline."""
        if isinstance(result, Conflict):
            log.warning("run %s: runner not ready: %s", self.run_id, result.evidence)
            self.host.stop(self, RunnerStatus.CRASHED)
            return
        if self.ended:
            return
        self.ready = True
        launch = self.launch
        command: Any
        if launch.command is CommandKind.START:
            command = StartCommand(launch.run_id)
        elif launch.command is CommandKind.RESTART:
            assert launch.parent_run_id is not None
            command = RestartCommand(launch.run_id, launch.parent_run_id)
        else:
            command = ResumeCommand(launch.run_id)
        self._send(command_frame(command_to_json(command), revision, saved))
        self.host.fill_spares()  # its start no longer needs the CPU: the next run's child may

    def ready_refused(self, error: PiwfError) -> None:
        """The ready report was refused: a lost claim stops the runner quietly, anything else
        stops it as crashed (the run is then recovered from its exit)."""
        if isinstance(error, ClaimLostError):
            self.server_lost_claim = True
            self.host.stop(self, RunnerStatus.CLAIM_LOST)
            return
        log.warning("run %s: marking its runner ready failed: %s", self.run_id, error)
        self.host.stop(self, RunnerStatus.CRASHED)

    def _source_changed(self, drift: SourceDrift) -> None:
        log.warning(
            "run %s: %d source file(s) changed, %d missing; parked",
            self.run_id,
            len(drift.changed),
            len(drift.missing),
        )
        try:
            with self.host.db.write() as tx:
                ex.park_for_source_change(
                    tx,
                    self.run_id,
                    runner_epoch=self.runner_epoch,
                    actor=Actor(ActorType.SERVER, self.host.owner_id),
                    owner_id=self.host.owner_id,
                    lease_ms=self.host.lease_ms,
                    claim=self.claim,
                    detail=drift.describe(),
                )
        except PiwfError as error:
            log.warning("run %s: parking for a source change failed: %s", self.run_id, error)
        self.ended = True
        self.host.run_changed(self.run_id)

    def _call(self, message: ChildMessage) -> None:
        """Serve one call; while the database cannot serve, the child waits for its answer
        and the same call is served again later (it committed nothing)."""
        try:
            self._serve_call(message)
        except StateUnavailableError as error:
            what = f"serving {message.operation}"
            self.host.retry_later(self, what, error, lambda: self._call(message))

    def _serve_call(self, message: ChildMessage) -> None:
        assert message.message_id is not None
        operation = message.operation
        payload = message.payload or {}
        if operation in CONTENT_OPERATIONS:
            self._content(message.message_id, operation, payload)
            return
        if operation in AGENT_OPERATION:
            self._agent_call(message)
            return
        try:
            payload = self.transfer.resolve(payload)
        except StateUnavailableError:
            raise
        except PiwfError as error:
            self.respond(message.message_id, "rejected", error=str(error))
            return
        if operation in SAVED_RUN_OPERATIONS:
            readable = (self.run_id, self.launch.parent_run_id)
            answer = answer_read(self.host.db, operation, payload, readable)
            self.respond(message.message_id, answer.outcome, answer.result, answer.error)
            if answer.violation is not None:
                self.reject_protocol(answer.violation)
            return
        # The authority is always the claim this runner was launched with: a payload naming
        # another run is a protocol violation, never a way into that run. Applied with the other
        # runner calls of this loop turn, in one transaction, and answered after it committed.
        serve_state_call(self, message, payload, lambda: self._call(message))

    def agent_calls(self) -> AgentCalls:
        """This runner's agent calls (created on first use)."""
        if self.agents is None:
            self.agents = AgentCalls(self.host.db, self.run_id, self.runner_epoch)
        return self.agents

    def _agent_call(self, message: ChildMessage) -> None:
        """Serve ``process.register`` / ``process.unregister`` (server/runs/agents.py)."""
        assert message.message_id is not None
        answer = self.agent_calls().serve(
            message,
            self.claim,
            None if self.handle is None else self.handle.pid,
            lease_ms=self.host.lease_ms,
            verify_server_claim=self.host.verify_server_claim,
        )
        if answer.turn_of_attempt is not None and self.attempt_output is not None:
            # A resumed turn has no node_started before it: its output is its attempt's too.
            self.attempt_output.follow_turn(self.host.db, answer.turn_of_attempt)
        self.respond(message.message_id, answer.outcome, answer.result, answer.error)
        self.host.agent_activity(self.run_id)
        if answer.violation is not None:
            self.reject_protocol(answer.violation)
        elif answer.claim_lost:
            self.server_lost_claim = True
            self.host.stop(self, RunnerStatus.CLAIM_LOST)

    def tell_if_settled(self) -> None:
        """Send ``interaction.settled`` once the request its agent command works on is no
        longer pending (the runner then stops the command after a short grace)."""
        if self.agents is None or self.ended or self.stop_reason is not None:
            return
        notice = self.agents.check_settled()
        if notice is not None:
            self._send(notice)

    def _content(self, message_id: str, operation: str, payload: dict[str, Any]) -> None:
        """Serve ``content.read`` parts of offered values; take ``content.part`` uploads."""
        try:
            if operation == "content.read":
                result = self.transfer.read_part(payload)
            else:
                self.transfer.receive_part(payload)
                result = {"received": True}
        except StateUnavailableError:
            raise
        except PiwfError as error:
            self.respond(message_id, "rejected", error=str(error))
            return
        self.respond(message_id, "accepted", result)

    def reject_protocol(self, detail: str) -> None:
        """Stop a runner that broke the runner protocol; its run parks ``protocolRejected``.

        ``detail`` names the broken rule, never a payload value; it becomes the queue's error
        text, so ``piwf run show`` can say why the run stopped.
        """
        log.warning("run %s: its runner broke the runner protocol; stopped", self.run_id)
        if self.protocol_rejection is None:
            self.protocol_rejection = detail[:500]
        self.host.stop(self, RunnerStatus.CRASHED, kill=True)

    def respond(
        self,
        message_id: str,
        outcome: str,
        result: JsonValue = None,
        error: str | None = None,
    ) -> None:
        response = CallResponse(
            messageId=message_id,
            outcome=outcome,  # type: ignore[arg-type]
            result=result,
            error=None if error is None else error[:1000],
        )
        data = response.encode()
        if len(data) > content.INLINE_LIMIT:
            # Too large for one frame: the child reads it back in parts.
            reference = self.transfer.offer(result)
            data = response.model_copy(update={"result": reference}).encode()
        self._send(data)

    # -- deadlines -------------------------------------------------------------------------

    def watch_deadline(self, started: port.NodeStarted) -> None:
        """Back up the engine's own node timeout: a child still on this attempt a grace period
        after its deadline (frozen, or stuck where the engine cannot interrupt it) is killed."""
        if started.deadline_ms is None:
            return
        now_ms = self.host.db.clock.now_ms()
        delay_s = max(0.0, (started.deadline_ms - now_ms) / 1000) + DEADLINE_GRACE_S
        attempt = (started.path, started.visit, started.attempt)

        def overdue() -> None:
            if not self.host.is_current(self) or self.ended:
                return
            with self.host.db.read() as tx:
                running = attempts.running_attempt(tx, self.run_id)
            if running is not None and (running.path, running.visit, running.attempt) == attempt:
                log.warning("run %s: node %s overran its deadline", self.run_id, attempt[0])
                self.host.stop(self, RunnerStatus.TIMED_OUT, kill=True)

        self.host.loop.call_later(delay_s, overdue)

    def _ready_overdue(self) -> None:
        if not self.ready:
            log.warning("run %s: its runner did not report ready in time", self.run_id)
            self.host.stop(self, RunnerStatus.TIMED_OUT, kill=True)

    # -- the exit --------------------------------------------------------------------------

    def exited(self, handle: ChildHandle) -> None:
        """Record the child's one outcome and decide its run, then free the slot: in the loop
        turn's group commit (server/runs/runner_records.py, ``ExitRecord``).

        While the database cannot serve, the slot and the claim (renewed meanwhile) are kept
        and the record is retried.
        """
        if self.queued_call is not None:
            self.host.db.group.flush()  # a call it made before it ended is decided first
        self.host.db.group.defer(ExitRecord(self, handle))

    def exit_outcome(self, handle: ChildHandle) -> RunnerStatus:
        """The one outcome the exited child's runner row records."""
        if self.stop_reason is not None:
            return self.stop_reason
        if handle.returncode == 0 and self.ended:
            return RunnerStatus.EXITED
        return RunnerStatus.CRASHED


def _is_unregister(raw: bytes) -> bool:
    """Whether a raw child frame is a ``process.unregister`` call (cheap: no validation)."""
    if b"process.unregister" not in raw:
        return False
    try:
        body = canonical.decode(raw)
    except PiwfError:
        return False
    return isinstance(body, dict) and body.get("operation") == "process.unregister"
