"""The bounded runner pool: admit runs, supervise one child per run generation, apply its calls.

Duties, each driven by the server loop::

    schedule   while fewer than ``max_workers`` runs are launching or running, claim the next
               eligible run (generation + 1), record the runner row, spawn the child
    serve      answer each child message after checking run id, generation and runner epoch;
               state-changing calls go through stored runner receipts in one fenced transaction
    renew      the server (never the child) renews every active run claim on a timer, so a
               child that blocks its own interpreter cannot cost the run its claim
    reap       on a child's exit record its one outcome; a run it left unfinished is decided by
               the no-progress rule (unchanged revision: park ``runnerNoProgress``; progress:
               claimable again, uncertain effects decided by their recovery policy)
    rescue     a run left executing with an absent or expired claim and no child of this server
               (its claim expired while the server was stopped or starved, a launch failed after
               its claim, an exit could not be recorded) is decided as startup recovery decides
               it: a new claim (generation + 1), then its effects; every ``poll_s``

Capacity counts pending launches. Renewal, cancellation and cleanup never wait for a slot.

While the database cannot serve (a full disk, an I/O error: ``StateUnavailableError``) a
child's call, its ready report, its launch records and its exit record are retried after a
growing delay (0.1 s to 2 s) instead of being answered or dropped: the child waits, keeps its
slot, and goes on once space is back; the periodic duties simply try again on their next tick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import selectors
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from piwf import canonical, faults
from piwf.canonical import JsonValue
from piwf.errors import ClaimLostError, PiwfError, StateUnavailableError
from piwf.processes import ChildKind, is_alive
from piwf.protocol import content
from piwf.protocol.runner_v1 import CallResponse, ChildMessage, Command, Launch
from piwf.server.children.pipes import PipeClosedError, PipeOverflowError
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.failures import RetryDelay, retry_later
from piwf.server.loop import EventLoop, Timer
from piwf.server.runs.content_transfer import ContentTransfer
from piwf.state import Conflict, StateDatabase, Transaction
from piwf.state import execution as ex
from piwf.state.enums import ActorType, RunnerMessageOutcome, RunnerStatus
from piwf.state.execution import RunLaunch
from piwf.state.execution.runs import list_run_sources
from piwf.state.leases import Claim, renew_claim
from piwf.state.records import Actor, read_revision
from piwf.state.server_epoch import ServerClaim, verify_server_claim
from piwf.workflow import port
from piwf.workflow.commands import (
    RestartCommand,
    ResumeCommand,
    StartCommand,
    command_to_json,
)
from piwf.workflow.port_codec import result_to_json, to_json

log = logging.getLogger("piwf.server")

#: How long past a node's deadline the server waits for the engine's own timeout before it
#: kills the child.
DEADLINE_GRACE_S = 2.0


class ReconcileAdmission(Protocol):
    """The other kind of work that shares the pool's slots (resource reconciles)."""

    def admit(self) -> bool:
        """Claim and launch one due reconcile; False when none is due."""
        ...

    def busy_slots(self) -> int:
        """Slots held by reconciles now (launching or running)."""
        ...


@dataclass(frozen=True)
class ExecutionSettings:
    """Timing and capacity of the pool (tests shorten them)."""

    max_workers: int = 4
    run_lease_ms: int = 30_000
    renew_s: float = 10.0
    poll_s: float = 2.0
    ready_timeout_s: float = 30.0
    stop_grace_s: float = 2.0


@dataclass
class ActiveRun:
    """One run generation the server is executing."""

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

    @property
    def run_id(self) -> str:
        """The run this generation executes."""
        return self.launch.run_id


class Executor:
    """The runner pool of one server process."""

    def __init__(
        self,
        *,
        db: StateDatabase,
        loop: EventLoop,
        server_claim: Callable[[], ServerClaim],
        supervisor: Supervisor,
        settings: ExecutionSettings,
        run_changed: Callable[[str], None],
    ) -> None:
        self.db = db
        self.loop = loop
        self.server_claim = server_claim
        self.settings = settings
        self.run_changed = run_changed
        #: Called after every runner exit (the server asks for a retention sweep there).
        self.on_runner_exit: Callable[[], None] = lambda: None
        self.supervisor = supervisor
        self.active: dict[str, ActiveRun] = {}
        #: The resource reconciles sharing this pool's capacity (set by the lifecycle).
        self.reconciler: ReconcileAdmission | None = None
        self._scheduling = False
        self._prefer_reconcile = False
        loop.every(settings.poll_s, self.schedule)
        loop.every(settings.poll_s, self.rescue_stranded_runs)
        loop.every(settings.renew_s, self.renew_claims)

    @property
    def owner_id(self) -> str:
        """The lease owner id of this server's run claims."""
        return self.server_claim().server_id

    def schedule(self) -> None:
        """Fill free slots (pending launches count toward capacity).

        Admission alternates between the two kinds of work when both have some: after a
        workflow run the next slot is offered to a resource reconcile first, and the other way
        round (:class:`ReconcileAdmission`; the reconciles count toward the same capacity).
        """
        if self._scheduling or self.loop.stop_requested:
            return
        self._scheduling = True
        try:
            while self.busy_slots() < self.settings.max_workers:
                kinds = (
                    (self._admit_reconcile, self._admit_run)
                    if self._prefer_reconcile
                    else (self._admit_run, self._admit_reconcile)
                )
                admitted = next((admit for admit in kinds if admit()), None)
                if admitted is None:
                    return
                self._prefer_reconcile = admitted == self._admit_run
        finally:
            self._scheduling = False

    def busy_slots(self) -> int:
        """Slots in use: launching and running children of every kind."""
        reconciles = 0 if self.reconciler is None else self.reconciler.busy_slots()
        return len(self.active) + reconciles

    def _admit_run(self) -> bool:
        launch = self._claim_next()
        if launch is None:
            return False
        faults.point("run.after_claim_commit")
        self._launch(launch)
        return True

    def _admit_reconcile(self) -> bool:
        """The resource-manager side of the alternation (see :mod:`piwf.server.resources`)."""
        return self.reconciler is not None and self.reconciler.admit()

    def renew_claims(self) -> None:
        """Renew every active run claim; a lost claim stops its child without a failure."""
        for active in list(self.active.values()):
            if active.ended:
                continue
            try:
                with self.db.write() as tx:
                    active.claim = renew_claim(tx, active.claim, self.settings.run_lease_ms)
            except ClaimLostError as error:
                log.warning("run %s lost its claim (%s)", active.run_id, error.reason)
                active.server_lost_claim = True
                self._stop(active, RunnerStatus.CLAIM_LOST)
            except PiwfError as error:
                log.warning("renewing run %s failed: %s", active.run_id, error)

    def rescue_stranded_runs(self) -> None:
        """Recover runs whose claim expired or vanished while this server lives.

        A child of this server whose claim has expired is stopped (``claimLost``); its exit
        then recovers the run. A run marked executing that no child of this server executes is
        recovered here at once: a live runner row left behind is closed ``orphaned`` (its exact
        process killed if it still runs) and the run is decided from its effects under a new
        claim, exactly as :func:`~piwf.server.runs.recovery.recover_previous_server` does at
        startup. Claim loss to a newer generation stays a handoff: recovery changes nothing
        for a run another owner holds.
        """
        if self.loop.stop_requested:
            return
        try:
            with self.db.read() as tx:
                now = tx.now
                stranded = [r for r in ex.expired_running_runs(tx) if r.run_id not in self.active]
        except PiwfError as error:
            log.warning("finding stranded runs failed: %s", error)
            return
        for active in list(self.active.values()):
            if not active.ended and active.stop_reason is None and active.claim.expires_at <= now:
                log.warning("run %s: its claim expired under its runner", active.run_id)
                active.server_lost_claim = True
                self._stop(active, RunnerStatus.CLAIM_LOST)
        for run in stranded:
            self._rescue(run)
        if stranded:
            self.loop.call_later(0, self.schedule)

    def _rescue(self, run: ex.ExpiredRun) -> None:
        actor = Actor(ActorType.SERVER, self.owner_id)
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                runner = ex.live_runner(tx, run.run_id)
                if runner is not None:
                    # Not a child this server supervises any more: kill it only if it is still
                    # that exact process (start identity, never a bare pid).
                    identity = runner.process_start_identity
                    if runner.pid is not None and identity is not None and is_alive(identity):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(runner.pid, signal.SIGKILL)
                    ex.record_runner_exit(tx, runner.runner_epoch, RunnerStatus.ORPHANED)
                recovered = ex.recover_after_runner_exit(
                    tx,
                    run.run_id,
                    runner_epoch=None if runner is None else runner.runner_epoch,
                    actor=actor,
                    owner_id=self.owner_id,
                    lease_ms=self.settings.run_lease_ms,
                )
        except PiwfError as error:
            log.warning("run %s: recovering its expired claim failed: %s", run.run_id, error)
            return
        if not isinstance(recovered, Conflict):
            log.info("run %s: recovered after its claim expired", run.run_id)
            self.run_changed(run.run_id)

    def claim_of_run(self, run_id: str) -> Claim | None:
        """The live claim this server holds on ``run_id``, if it executes it now."""
        active = self.active.get(run_id)
        return None if active is None else active.claim

    def stop_run(self, run_id: str, reason: str) -> None:
        """Stop the child of ``run_id`` after a control command committed (its claim is gone)."""
        active = self.active.get(run_id)
        if active is None:
            return
        status = RunnerStatus.CANCELLED if reason == "cancelled" else RunnerStatus.ORPHANED
        active.ended = True
        self._stop(active, status)

    def stop_all(self) -> None:
        """Stop every child (server shutdown); their runs resume under the next server."""
        for active in self.active.values():
            active.stop_reason = active.stop_reason or RunnerStatus.ORPHANED
        self.supervisor.stop_all(self.settings.stop_grace_s)

    # -- launching -------------------------------------------------------------------------

    def _claim_next(self) -> RunLaunch | None:
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                return ex.claim_next_run(
                    tx,
                    owner_id=self.owner_id,
                    lease_ms=self.settings.run_lease_ms,
                    exclude=tuple(self.active),
                )
        except PiwfError as error:
            log.warning("scheduling failed: %s", error)
            return None

    def _launch(self, launch: RunLaunch, retried: ActiveRun | None = None) -> None:
        active = retried or ActiveRun(
            launch, launch.claim, f"runner-{secrets.token_hex(8)}", ContentTransfer(self.db)
        )
        runner_epoch = active.runner_epoch
        self.active[launch.run_id] = active
        try:
            with self.db.write() as tx:
                envelope = self._envelope(tx, launch, runner_epoch)
                recorded = ex.record_runner_launch(
                    tx,
                    launch,
                    runner_epoch=runner_epoch,
                    server_epoch=self.server_claim().epoch,
                    envelope=envelope.model_dump(by_alias=True, exclude_none=True),
                    lease_ms=self.settings.run_lease_ms,
                )
            if isinstance(recorded, Conflict):
                raise PiwfError(f"runner launch refused: {recorded.evidence}")
        except StateUnavailableError as error:
            self._retry_later(
                active, "recording its launch", error, lambda: self._launch(launch, active)
            )
            return
        except PiwfError as error:
            log.warning("launching run %s failed: %s", launch.run_id, error)
            self.active.pop(launch.run_id, None)
            return
        faults.point("runner.after_launch_record")
        project = envelope.project_path
        try:
            handle = self.supervisor.start(
                ChildSpec(
                    runner_epoch,
                    ChildKind.WORKFLOW_RUNNER,
                    cwd=Path(project) if project else None,
                    on_exit=lambda finished: self._exited(active, finished),
                )
            )
        except OSError as error:
            # No child: the slot is freed and the claimed run waits for its claim to expire.
            log.warning(
                "run %s: its runner could not be started: %s", launch.run_id, error.strerror
            )
            self.active.pop(launch.run_id, None)
            return
        active.handle = handle
        if not self._record_process(active):
            return
        self.loop.selector.register(handle.channel.fd, selectors.EVENT_READ, self._io(active))
        active.ready_timer = self.loop.call_later(
            self.settings.ready_timeout_s, lambda: self._ready_overdue(active)
        )
        self._send(active, envelope.encode())

    def _record_process(self, active: ActiveRun) -> bool:
        """Record the child's pid and start identity; False when the child is being stopped.

        While the database cannot serve, the record is retried later and the child goes on.
        """
        handle = active.handle
        assert handle is not None
        try:
            with self.db.write() as tx:
                active.claim = renew_claim(tx, active.claim, self.settings.run_lease_ms)
                if handle.identity is not None:
                    ex.record_runner_process(
                        tx,
                        active.claim,
                        active.runner_epoch,
                        handle.pid,
                        handle.identity,
                        lease_ms=self.settings.run_lease_ms,
                    )
        except StateUnavailableError as error:
            self._retry_later(
                active, "recording its runner", error, lambda: self._record_process(active)
            )
        except PiwfError as error:
            log.warning("run %s: recording its runner failed: %s", active.run_id, error)
            self._stop(active, RunnerStatus.CLAIM_LOST)
            return False
        return True

    def _retry_later(
        self,
        active: ActiveRun,
        what: str,
        error: StateUnavailableError,
        again: Callable[[], object],
    ) -> None:
        """Retry ``again`` later while ``active`` is still this run's generation here."""
        log.warning("run %s: %s failed (%s); retrying", active.run_id, what, error.code)
        wanted = lambda: self.active.get(active.run_id) is active  # noqa: E731
        retry_later(self.loop.call_later, active.state_retry, wanted, again)

    def _envelope(self, tx: Transaction, launch: RunLaunch, runner_epoch: str) -> Launch:
        sources = list_run_sources(tx, launch.run_id)
        root = next(source for source in sources if source.mount_path == "")
        mounted = [
            {"location": source.source_ref, "sha256": source.source_revision}
            for source in sources
            if source.mount_path != ""
        ]
        row = tx.one(
            "SELECT p.canonical_path, r.definition_digest FROM runs r"
            " LEFT JOIN projects p ON p.project_id = r.project_id WHERE r.run_id = ?",
            (launch.run_id,),
        )
        assert row is not None
        return Launch(
            runId=launch.run_id,
            generation=launch.generation,
            runnerEpoch=runner_epoch,
            serverEpoch=self.server_claim().epoch,
            projectPath=row[0],
            workflowSource={
                "root": {"location": root.source_ref, "sha256": root.source_revision},
                "mounted": mounted,
            },
            definitionDigest=bytes(row[1]).hex(),
        )

    # -- serving the child -----------------------------------------------------------------

    def _readable(self, active: ActiveRun) -> None:
        handle = active.handle
        assert handle is not None
        try:
            messages = handle.channel.read_messages()
        except PipeClosedError:
            self._unregister(active)
            return
        except PipeOverflowError:
            self._unregister(active)
            self._reject_protocol(active, "the runner sent a frame over the 1 MiB frame limit")
            return
        for raw in messages:
            if active.stop_reason is not None:
                # Being stopped (claim loss, protocol violation, deadline, cancel, shutdown):
                # nothing it sends from now on is applied, even what was already in the pipe.
                return
            self._serve(active, raw)

    def _serve(self, active: ActiveRun, raw: bytes) -> None:
        try:
            message = ChildMessage.model_validate(canonical.decode(raw))
        except (PiwfError, ValidationError):
            self._reject_protocol(active, "the runner sent a message that is not runner.v1")
            return
        if message.run_id != active.run_id:
            if message.kind == "call" and message.message_id:
                self._respond(
                    active, message.message_id, "rejected", error="protocolRejected: not this run"
                )
            self._reject_protocol(active, "a runner message named another run than its own")
            return
        if (
            message.generation != active.launch.generation
            or message.runner_epoch != active.runner_epoch
        ):
            if message.kind == "call" and message.message_id:
                self._respond(active, message.message_id, "claimLost", error="stale generation")
            self._stop(active, RunnerStatus.CLAIM_LOST)
            return
        if message.kind == "ready":
            self._ready(active)
        elif message.kind == "sourceChanged":
            self._source_changed(active, message.files or [])
        elif message.kind == "call":
            self._call(active, message)
        elif message.kind == "exiting":
            active.ended = True

    def _ready(self, active: ActiveRun) -> None:
        if active.ready_timer is not None:
            active.ready_timer.cancel()
        try:
            self._send_command(active)
        except StateUnavailableError as error:  # the child waits for its command meanwhile
            self._retry_later(active, "marking it ready", error, lambda: self._ready(active))

    def _send_command(self, active: ActiveRun) -> None:
        """Mark the runner ready (a repeat is adopted) and send its one command."""
        try:
            with self.db.write() as tx:
                result = ex.mark_runner_ready(
                    tx, active.claim, active.runner_epoch, lease_ms=self.settings.run_lease_ms
                )
        except ClaimLostError:
            active.server_lost_claim = True
            self._stop(active, RunnerStatus.CLAIM_LOST)
            return
        if isinstance(result, Conflict):
            log.warning("run %s: runner not ready: %s", active.run_id, result.evidence)
            self._stop(active, RunnerStatus.CRASHED)
            return
        active.ready = True
        launch = active.launch
        command: Any
        if launch.command.value == "start":
            command = StartCommand(launch.run_id)
        elif launch.command.value == "restart":
            assert launch.parent_run_id is not None
            command = RestartCommand(launch.run_id, launch.parent_run_id)
        else:
            command = ResumeCommand(launch.run_id)
        with self.db.read() as tx:
            revision = read_revision(tx, active.claim.resource_id) or 0
        self._send(active, Command(command=command_to_json(command), revision=revision).encode())

    def _source_changed(self, active: ActiveRun, files: list[str]) -> None:
        log.warning("run %s: %d source file(s) changed; parked", active.run_id, len(files))
        try:
            with self.db.write() as tx:
                ex.park_for_source_change(
                    tx,
                    active.run_id,
                    runner_epoch=active.runner_epoch,
                    actor=Actor(ActorType.SERVER, self.owner_id),
                    owner_id=self.owner_id,
                    lease_ms=self.settings.run_lease_ms,
                    claim=active.claim,
                    detail=", ".join(files)[:1000],
                )
        except PiwfError as error:
            log.warning("run %s: parking for a source change failed: %s", active.run_id, error)
        active.ended = True
        self.run_changed(active.run_id)

    def _call(self, active: ActiveRun, message: ChildMessage) -> None:
        """Serve one call; while the database cannot serve, the child waits for its answer
        and the same call is served again later (it committed nothing)."""
        try:
            self._serve_call(active, message)
        except StateUnavailableError as error:
            what = f"serving {message.operation}"
            self._retry_later(active, what, error, lambda: self._call(active, message))

    def _serve_call(self, active: ActiveRun, message: ChildMessage) -> None:
        assert message.message_id is not None
        operation = message.operation
        payload = message.payload or {}
        if operation in ("content.read", "content.part"):
            self._content(active, message.message_id, operation, payload)
            return
        try:
            payload = active.transfer.resolve(payload)
        except StateUnavailableError:
            raise
        except PiwfError as error:
            self._respond(active, message.message_id, "rejected", error=str(error))
            return
        if operation == "read_run":
            self._read_run(active, message.message_id, payload)
            return
        # The authority is always the claim this runner was launched with: a payload naming
        # another run is a protocol violation, never a way into that run.
        try:
            call = ex.decode_runner_call(active.claim, operation, payload)
        except ex.RunnerCallRejectedError as error:
            self._respond(active, message.message_id, "rejected", error=f"{error.code}: {error}")
            self._reject_protocol(active, str(error))
            return
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                reply = ex.apply_runner_call(
                    tx,
                    active.claim,
                    active.runner_epoch,
                    message.message_id,
                    call,
                    expected_revision=message.expected_revision,
                    lease_ms=self.settings.run_lease_ms,
                )
        except ClaimLostError:
            self._respond(active, message.message_id, "claimLost", error="claim lost")
            active.server_lost_claim = True
            self._stop(active, RunnerStatus.CLAIM_LOST)
            return
        except StateUnavailableError:
            raise
        except PiwfError as error:
            self._respond(active, message.message_id, "rejected", error=str(error))
            return
        faults.point("runner.after_message_commit")
        result = None if reply.result is None else result_to_json(reply.result)
        self._respond(active, message.message_id, reply.outcome.value, result, reply.error)
        if reply.outcome is RunnerMessageOutcome.CLAIM_LOST:
            active.server_lost_claim = True
            self._stop(active, RunnerStatus.CLAIM_LOST)
        elif operation in ("park", "finish") and reply.outcome.value in ("accepted", "adopted"):
            active.ended = True
            self.run_changed(active.run_id)
        elif isinstance(call.message, port.NodeStarted):
            self._watch_deadline(active, call.message)

    def _read_run(self, active: ActiveRun, message_id: str, payload: dict[str, Any]) -> None:
        """A runner reads its own run, and a restart also reads the run it restarts."""
        wanted = payload.get("run_id")
        if wanted not in (active.run_id, active.launch.parent_run_id) or wanted is None:
            self._respond(active, message_id, "rejected", error="protocolRejected: not this run")
            self._reject_protocol(active, "read_run names another run than the runner's own")
            return
        with self.db.read() as tx:
            saved = ex.read_saved_run(tx, str(wanted))
        self._respond(active, message_id, "accepted", None if saved is None else to_json(saved))

    def _reject_protocol(self, active: ActiveRun, detail: str) -> None:
        """Stop a runner that broke the runner protocol; its run parks ``protocolRejected``.

        ``detail`` names the broken rule, never a payload value; it becomes the queue's error
        text, so ``piwf run show`` can say why the run stopped.
        """
        log.warning("run %s: its runner broke the runner protocol; stopped", active.run_id)
        if active.protocol_rejection is None:
            active.protocol_rejection = detail[:500]
        self._stop(active, RunnerStatus.CRASHED, kill=True)

    def _respond(
        self,
        active: ActiveRun,
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
            reference = active.transfer.offer(result)
            data = response.model_copy(update={"result": reference}).encode()
        self._send(active, data)

    def _content(
        self, active: ActiveRun, message_id: str, operation: str, payload: dict[str, Any]
    ) -> None:
        """Serve ``content.read`` parts of offered values; take ``content.part`` uploads."""
        try:
            if operation == "content.read":
                result = active.transfer.read_part(payload)
            else:
                active.transfer.receive_part(payload)
                result = {"received": True}
        except StateUnavailableError:
            raise
        except PiwfError as error:
            self._respond(active, message_id, "rejected", error=str(error))
            return
        self._respond(active, message_id, "accepted", result)

    def _io(self, active: ActiveRun) -> Callable[[int], None]:
        """The selector callback of one child's pipe: flush queued output, then read."""

        def on_event(mask: int) -> None:
            if mask & selectors.EVENT_WRITE:
                self._flush(active)
            if mask & selectors.EVENT_READ:
                self._readable(active)

        return on_event

    def _send(self, active: ActiveRun, data: bytes) -> None:
        handle = active.handle
        if handle is None or handle.exited:
            return
        try:
            handle.channel.send(data)
        except (PipeClosedError, PipeOverflowError):
            self._unregister(active)
            return
        self._watch_output(active)

    def _flush(self, active: ActiveRun) -> None:
        handle = active.handle
        if handle is None or handle.exited:
            return
        try:
            handle.channel.flush()
        except PipeClosedError:
            self._unregister(active)
            return
        self._watch_output(active)

    def _watch_output(self, active: ActiveRun) -> None:
        """Ask the selector for writability only while output waits (a large frame)."""
        handle = active.handle
        assert handle is not None
        events = selectors.EVENT_READ
        if handle.channel.wants_write:
            events |= selectors.EVENT_WRITE
        with contextlib.suppress(KeyError, ValueError):
            self.loop.selector.modify(handle.channel.fd, events, self._io(active))

    # -- stopping and reaping --------------------------------------------------------------

    def _watch_deadline(self, active: ActiveRun, started: port.NodeStarted) -> None:
        """Back up the engine's own node timeout: a child still on this attempt a grace period
        after its deadline (frozen, or stuck where the engine cannot interrupt it) is killed."""
        if started.deadline_ms is None:
            return
        delay_s = max(0.0, (started.deadline_ms - self.db.clock.now_ms()) / 1000) + DEADLINE_GRACE_S
        attempt = (started.path, started.visit, started.attempt)

        def overdue() -> None:
            if self.active.get(active.run_id) is not active or active.ended:
                return
            with self.db.read() as tx:
                row = tx.one(
                    "SELECT node_path, visit, attempt_number FROM node_attempts"
                    " WHERE run_id = ? AND status IN ('pending', 'running')",
                    (active.run_id,),
                )
            if row is not None and tuple(row) == attempt:
                log.warning("run %s: node %s overran its deadline", active.run_id, attempt[0])
                self._stop(active, RunnerStatus.TIMED_OUT, kill=True)

        self.loop.call_later(delay_s, overdue)

    def _ready_overdue(self, active: ActiveRun) -> None:
        if not active.ready:
            log.warning("run %s: its runner did not report ready in time", active.run_id)
            self._stop(active, RunnerStatus.TIMED_OUT, kill=True)

    def _stop(self, active: ActiveRun, reason: RunnerStatus, *, kill: bool = False) -> None:
        active.stop_reason = active.stop_reason or reason
        if active.handle is None:
            self.active.pop(active.run_id, None)
            return
        if kill:
            self.supervisor.kill(active.handle)
        else:
            self.supervisor.stop(active.handle, self.settings.stop_grace_s)

    def _unregister(self, active: ActiveRun) -> None:
        if active.handle is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.loop.selector.unregister(active.handle.channel.fd)

    def _exited(self, active: ActiveRun, handle: ChildHandle) -> None:
        status = self._classify(active, handle)
        code = handle.returncode
        try:
            with self.db.write() as tx:
                ex.record_runner_exit(
                    tx,
                    active.runner_epoch,
                    status,
                    exit_code=code if code is not None and code >= 0 else None,
                    signal=None if code is None or code >= 0 else f"signal {-code}",
                    diagnostic="output flood" if handle.flooded else active.protocol_rejection,
                )
                # Claim loss is a handoff: when a newer generation owns the run, the recovery
                # below is a no-op (it checks the generation). When this server's own claim
                # merely expired (the server was stopped or starved past the run lease), no one
                # else holds the run: recovery takes a new claim (generation + 1) and decides
                # the run from its effects, as startup recovery would.
                ex.recover_after_runner_exit(
                    tx,
                    active.run_id,
                    runner_epoch=active.runner_epoch,
                    actor=Actor(ActorType.SERVER, self.owner_id),
                    owner_id=self.owner_id,
                    lease_ms=self.settings.run_lease_ms,
                    claim=None if active.server_lost_claim else active.claim,
                    protocol_rejection=active.protocol_rejection,
                )
        except StateUnavailableError as error:
            # Keep the slot and the claim (renewed meanwhile) until the exit is recorded.
            again = lambda: self._exited(active, handle)  # noqa: E731
            self._retry_later(active, "recording its runner exit", error, again)
            return
        except PiwfError as error:
            log.warning("run %s: recording its runner exit failed: %s", active.run_id, error)
        faults.point("runner.after_exit_commit")
        self.active.pop(active.run_id, None)
        self.run_changed(active.run_id)
        self.loop.call_later(0, self.schedule)
        self.on_runner_exit()

    def _classify(self, active: ActiveRun, handle: ChildHandle) -> RunnerStatus:
        if active.stop_reason is not None:
            return active.stop_reason
        if handle.flooded:
            return RunnerStatus.CRASHED
        if handle.returncode == 0 and active.ended:
            return RunnerStatus.EXITED
        return RunnerStatus.CRASHED
