"""Resource reconciles: admission, one supervised resource-runner child each, its calls, its end.

Duties, driven by the server loop (the :class:`~piwf.server.runs.pool.Executor` alternates
:meth:`Reconciler.admit` with workflow-run admission and counts :meth:`busy_slots` toward the
one shared capacity)::

    admit      claim the next due resource (generation + 1), record the runner row, start
               a resource-runner child (``ChildKind.RESOURCE_RUNNER``) in its own process
               group, send the launch envelope
    serve      check reconcileId and generation of every child message before its payload;
               answer effect, workflow and result calls, each one fenced transaction
    renew      the server renews each open reconcile claim on a timer
    deadline   a child still running ``timeout_ms`` + grace after launch is killed and its
               resource requeued with backoff, whether or not its code looked at the signal
    reap       a child that exits without a committed result fails its reconcile (backoff);
               one stopped by the server's shutdown is requeued at once
    wake       child runs that ended enqueue their parent resource (after every run change and
               on the poll timer, so a crash in between only delays the wake-up)

The server never imports manager code: only the resource runner and the source resolver do.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import ClaimLostError, PiwfError
from piwf.lifecycle import Conflict
from piwf.processes import ChildKind
from piwf.protocol.resource_v1 import (
    PAYLOADS,
    ChildFrame,
    ReconcileLaunch,
    ResponseFrame,
    StartFrame,
    WorkflowEnsure,
)
from piwf.server.children.link import ChildLink
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.loop import EventLoop, Timer
from piwf.server.resources.calls import apply_call, conflict_code
from piwf.state import StateDatabase
from piwf.state.enums import ResourceRunnerStatus
from piwf.state.leases import Claim, renew_claim
from piwf.state.resources import calls as calls
from piwf.state.resources import managed
from piwf.state.resources import reconciles as rc
from piwf.state.resources import runners as runners
from piwf.state.server_epoch import ServerClaim, verify_server_claim

log = logging.getLogger("piwf.server")


@dataclass(frozen=True)
class ReconcileSettings:
    """Timing of reconciles (tests shorten them)."""

    lease_ms: int = 30_000
    renew_s: float = 10.0
    poll_s: float = 2.0
    ready_timeout_s: float = 30.0
    #: How long past its deadline a reconcile may keep running before it is killed.
    deadline_grace_s: float = 1.0
    stop_grace_s: float = 2.0


@dataclass
class ActiveReconcile:
    """One reconcile the server is running."""

    launch: rc.ReconcileLaunch
    claim: Claim
    reconcile_id: str
    handle: ChildHandle | None = None
    link: ChildLink | None = None
    ready: bool = False
    ended: bool = False
    result_committed: bool = False
    server_lost_claim: bool = False
    stop_reason: ResourceRunnerStatus | None = None
    timers: list[Timer] = field(default_factory=list)

    @property
    def uid(self) -> str:
        """The resource this reconcile works on."""
        return self.launch.uid


class Reconciler:
    """The resource-reconcile half of the execution pool of one server process."""

    def __init__(
        self,
        *,
        db: StateDatabase,
        loop: EventLoop,
        supervisor: Supervisor,
        server_claim: Callable[[], ServerClaim],
        home: Path,
        settings: ReconcileSettings,
        wake_scheduler: Callable[[], None],
    ) -> None:
        self.db = db
        self.loop = loop
        self.supervisor = supervisor
        self.server_claim = server_claim
        self.home = home
        self.settings = settings
        self.wake_scheduler = wake_scheduler
        self.active: dict[str, ActiveReconcile] = {}
        loop.every(settings.renew_s, self.renew_claims)
        loop.every(settings.poll_s, self.wake_parents)

    @property
    def owner_id(self) -> str:
        """The lease owner id of this server's reconcile claims."""
        return self.server_claim().server_id

    def busy_slots(self) -> int:
        """Slots held by reconciles (launching or running)."""
        return len(self.active)

    def admit(self) -> bool:
        """Claim and launch the next due reconcile; False when none is due."""
        if self.loop.stop_requested:
            return False
        try:
            # A read first: an idle scheduler tick must not take the write lock.
            with self.db.read() as tx:
                if not rc.count_ready_reconciles(tx, tuple(self.active)):
                    return False
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                launch = rc.claim_next_reconcile(
                    tx,
                    owner_id=self.owner_id,
                    lease_ms=self.settings.lease_ms,
                    exclude=tuple(self.active),
                )
        except PiwfError as error:
            log.warning("reconcile scheduling failed: %s", error)
            return False
        if launch is None:
            return False
        self._launch(launch)
        return True

    def has_work(self) -> bool:
        """Whether a reconcile runs or any resource waits in the queue (keeps the server up)."""
        if self.active:
            return True
        with self.db.read() as tx:
            return managed.has_queued(tx)

    def renew_claims(self) -> None:
        """Renew every open reconcile claim; a lost claim stops its child without a failure."""
        for active in list(self.active.values()):
            if active.result_committed or active.server_lost_claim:
                continue
            try:
                with self.db.write() as tx:
                    active.claim = renew_claim(tx, active.claim, self.settings.lease_ms)
            except ClaimLostError as error:
                log.warning("reconcile %s lost its claim (%s)", active.reconcile_id, error.reason)
                active.server_lost_claim = True
                self._stop(active, ResourceRunnerStatus.CLAIM_LOST)
            except PiwfError as error:
                log.warning("renewing reconcile %s failed: %s", active.reconcile_id, error)

    def wake_parents(self) -> None:
        """Enqueue the parent resource of every child run that ended since the last look."""
        try:
            with self.db.read() as tx:
                if not calls.has_finished_children(tx):
                    return
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                woken = calls.notify_finished_children(tx)
        except PiwfError as error:
            log.warning("waking parent resources failed: %s", error)
            return
        if woken:
            self.wake_scheduler()

    def stop_all(self) -> None:
        """Mark every reconcile stopped by shutdown; the shared supervisor stops the children
        and each exit requeues its resource at once (no error counted)."""
        for active in self.active.values():
            active.stop_reason = active.stop_reason or ResourceRunnerStatus.ORPHANED

    # -- launching -------------------------------------------------------------------------

    def _launch(self, launch: rc.ReconcileLaunch) -> None:
        reconcile_id = f"{runners.RECONCILE_ID_PREFIX}{secrets.token_hex(8)}"
        active = ActiveReconcile(launch, launch.claim, reconcile_id)
        self.active[launch.uid] = active
        epoch = self.server_claim().epoch
        try:
            with self.db.write() as tx:
                active.claim = rc.record_reconcile_launch(
                    tx,
                    launch,
                    reconcile_id=reconcile_id,
                    server_epoch=epoch,
                    lease_ms=self.settings.lease_ms,
                )
        except PiwfError as error:
            log.warning("launching reconcile of %s failed: %s", launch.uid, error)
            self.active.pop(launch.uid, None)
            return
        envelope = ReconcileLaunch(
            reconcile_id=reconcile_id,
            generation=launch.claim.generation,
            server_epoch=epoch,
            manager=launch.manager,
            project_path=launch.project_path,
            state_home=str(self.home),
            deadline_ms=self.db.clock.now_ms() + launch.timeout_ms,
            resource=launch.snapshot,
        )
        project = launch.project_path
        try:
            handle = self.supervisor.start(
                ChildSpec(
                    reconcile_id,
                    ChildKind.RESOURCE_RUNNER,
                    cwd=Path(project) if project else None,
                    on_exit=lambda finished: self._runner_ended(active, finished),
                    on_started=lambda _started: self._record_process(active),
                )
            )
        except OSError as error:
            # No child: the slot is freed and the claimed reconcile waits for its claim to
            # expire, as a run's does.
            log.warning("reconcile %s: its runner could not be started: %s", reconcile_id, error)
            self.active.pop(launch.uid, None)
            return
        active.handle = handle
        active.link = ChildLink(
            self.loop,
            handle,
            lambda messages: self._received(active, messages),
            lambda why: self._broken(active, why),
        )
        active.link.watch()
        active.timers.append(
            self.loop.call_later(self.settings.ready_timeout_s, lambda: self._ready_overdue(active))
        )
        deadline_s = launch.timeout_ms / 1000 + self.settings.deadline_grace_s
        active.timers.append(self.loop.call_later(deadline_s, lambda: self._overdue(active)))
        # The envelope waits in the pipe while the fork server forks the child.
        self._send(active, envelope.encode())

    def _runner_ended(self, active: ActiveReconcile, handle: ChildHandle) -> None:
        if handle.start_failure is None:
            self._exited(active, handle)
            return
        # No child after all: as when it could not be asked for (above).
        log.warning(
            "reconcile %s: its runner could not be started: %s",
            active.reconcile_id,
            handle.start_failure,
        )
        self._forget(active)

    def _record_process(self, active: ActiveReconcile) -> None:
        """Record the child's pid and start identity once they are known (its ``on_started``);
        a record refused stops the child (``claimLost``). Its messages may be served before
        this (the state accepts the record while the runner is live)."""
        handle = active.handle
        assert handle is not None
        if handle.pid is None or handle.identity is None:
            return
        if active.result_committed or active.server_lost_claim:
            # A quick child's result can be served before its pid arrives: its claim is
            # released (or lost) by then, so there is nothing left to fence, and the record
            # would be refused and stop a child that succeeded.
            return
        try:
            with self.db.write() as tx:
                active.claim = runners.record_reconcile_process(
                    tx,
                    active.claim,
                    active.reconcile_id,
                    handle.pid,
                    handle.identity,
                    lease_ms=self.settings.lease_ms,
                )
        except PiwfError as error:
            log.warning(
                "reconcile %s: recording its process failed: %s", active.reconcile_id, error
            )
            self._stop(active, ResourceRunnerStatus.CLAIM_LOST)

    # -- serving the child -----------------------------------------------------------------

    def _received(self, active: ActiveReconcile, messages: list[bytes]) -> None:
        for raw in messages:
            if active.stop_reason is not None:
                return
            self._serve(active, raw)

    def _broken(self, active: ActiveReconcile, why: str) -> None:
        if why == "overflow":
            log.warning("reconcile %s: its runner sent an oversized frame", active.reconcile_id)
            self._stop(active, ResourceRunnerStatus.CRASHED)

    def _serve(self, active: ActiveReconcile, raw: bytes) -> None:
        try:
            frame = ChildFrame.model_validate(canonical.decode(raw))
        except (PiwfError, ValidationError):
            log.warning("reconcile %s: its runner sent a malformed message", active.reconcile_id)
            self._stop(active, ResourceRunnerStatus.CRASHED)
            return
        if frame.reconcile_id != active.reconcile_id or frame.generation != active.claim.generation:
            if frame.kind == "call" and frame.message_id:
                self._respond(active, frame.message_id, "claimLost", error="stale generation")
            self._stop(active, ResourceRunnerStatus.CLAIM_LOST)
            return
        if frame.kind == "ready":
            self._ready(active, frame.source_digest)
        elif frame.kind == "call":
            self._call(active, frame)
        else:
            active.ended = True

    def _ready(self, active: ActiveReconcile, source_digest: str | None) -> None:
        if active.ready:
            return
        active.ready = True
        if source_digest is not None:
            try:
                with self.db.write() as tx:
                    active.claim = runners.mark_reconcile_running(
                        tx,
                        active.claim,
                        active.reconcile_id,
                        source_digest,
                        lease_ms=self.settings.lease_ms,
                    )
            except ClaimLostError:
                active.server_lost_claim = True
                self._stop(active, ResourceRunnerStatus.CLAIM_LOST)
                return
        self._send(active, StartFrame().encode())

    def _call(self, active: ActiveReconcile, frame: ChildFrame) -> None:
        message_id = frame.message_id or "-"
        operation = frame.operation or ""
        if frame.message_id is None or operation not in PAYLOADS:
            self._respond(active, message_id, "rejected", error="a call needs an id and operation")
            return
        if active.result_committed:
            self._respond(active, message_id, "rejected", error="the reconcile already ended")
            return
        try:
            payload: Any = PAYLOADS[operation].model_validate(frame.payload or {})
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "payload"
            message = f"{operation}: {where}: {first['msg']}"
            code = "invalidPayload"
            if operation == "reconcile.finish":
                code = "resourceStatus"
                self._fail(active, f"invalid reconcile result: {message}")
            self._respond(active, message_id, "rejected", error=message, code=code)
            return
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                result = apply_call(
                    tx,
                    payload,
                    claim=active.claim,
                    reconcile_id=active.reconcile_id,
                    uid=active.uid,
                    project_path=active.launch.project_path,
                    lease_ms=self.settings.lease_ms,
                )
        except ClaimLostError:
            self._respond(active, message_id, "claimLost", error="claim lost")
            active.server_lost_claim = True
            self._stop(active, ResourceRunnerStatus.CLAIM_LOST)
            return
        except PiwfError as error:
            self._respond(active, message_id, "rejected", error=str(error), code=error.code)
            return
        except (LookupError, ValueError, TypeError, AssertionError) as error:
            # A payload the store cannot use (an unknown effect, a malformed resolved workflow):
            # refused, nothing written (the transaction rolled back).
            self._respond(active, message_id, "rejected", error=f"{operation}: {error}")
            return
        if isinstance(result, Conflict):
            self._respond(
                active,
                message_id,
                "rejected",
                error=result.evidence,
                code=conflict_code(operation),
            )
            return
        self._respond(active, message_id, "accepted", result)
        if operation in ("reconcile.finish", "reconcile.fail"):
            active.result_committed = True
            self.wake_scheduler()
        elif isinstance(payload, WorkflowEnsure) and payload.resolved is not None:
            self.wake_scheduler()  # a child run was just queued

    def _fail(self, active: ActiveReconcile, error: str, *, count_error: bool = True) -> None:
        """Record a failed reconcile now (its claim must still be live)."""
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                rc.fail_reconcile(
                    tx,
                    active.claim,
                    active.reconcile_id,
                    error,
                    lease_ms=self.settings.lease_ms,
                    count_error=count_error,
                )
        except ClaimLostError:
            active.server_lost_claim = True
            return
        except (PiwfError, LookupError) as failure:
            log.warning(
                "reconcile %s: recording its failure failed: %s", active.reconcile_id, failure
            )
            return
        active.result_committed = True

    def _respond(
        self,
        active: ActiveReconcile,
        message_id: str,
        outcome: str,
        result: JsonValue = None,
        *,
        error: str | None = None,
        code: str | None = None,
    ) -> None:
        response = ResponseFrame(
            message_id=message_id,
            outcome=outcome,  # type: ignore[arg-type]
            result=result,
            error=None if error is None else error[:1000],
            error_code=code,
        )
        self._send(active, response.encode())

    def _send(self, active: ActiveReconcile, data: bytes) -> None:
        if active.link is not None:
            active.link.send(data)

    # -- stopping and reaping --------------------------------------------------------------

    def _ready_overdue(self, active: ActiveReconcile) -> None:
        if not active.ready and self.active.get(active.uid) is active:
            log.warning("reconcile %s: its runner did not report ready", active.reconcile_id)
            self._stop(active, ResourceRunnerStatus.TIMED_OUT)

    def _overdue(self, active: ActiveReconcile) -> None:
        if self.active.get(active.uid) is not active or active.handle is None:
            return
        if active.handle.exited:
            return
        log.warning(
            "reconcile %s of %s overran its %d ms deadline; stopping it",
            active.reconcile_id,
            active.uid,
            active.launch.timeout_ms,
        )
        self._stop(active, ResourceRunnerStatus.TIMED_OUT)

    def _stop(self, active: ActiveReconcile, reason: ResourceRunnerStatus) -> None:
        active.stop_reason = active.stop_reason or reason
        if active.handle is None:
            self._forget(active)
            return
        self.supervisor.kill(active.handle)

    def _exited(self, active: ActiveReconcile, handle: ChildHandle) -> None:
        status = self._classify(active, handle)
        code = handle.returncode
        try:
            with self.db.write() as tx:
                runners.record_reconcile_exit(
                    tx,
                    active.reconcile_id,
                    status,
                    exit_code=code if code is not None and code >= 0 else None,
                    signal=None if code is None or code >= 0 else f"signal {-code}",
                )
        except PiwfError as error:
            log.warning("reconcile %s: recording its exit failed: %s", active.reconcile_id, error)
        # Claim loss is a handoff: a reconcile whose claim is gone writes no failure.
        if not active.result_committed and not active.server_lost_claim:
            reason = _exit_reason(status, active.launch.timeout_ms, code)
            if not active.ready:
                reason = f"the resource runner never reported ready ({status.value})"
            self._fail(
                active,
                reason,
                count_error=status is not ResourceRunnerStatus.ORPHANED,
            )
        self._forget(active)
        self.loop.call_later(0, self.wake_scheduler)

    def _forget(self, active: ActiveReconcile) -> None:
        for timer in active.timers:
            timer.cancel()
        if self.active.get(active.uid) is active:
            self.active.pop(active.uid, None)

    def _classify(self, active: ActiveReconcile, handle: ChildHandle) -> ResourceRunnerStatus:
        if active.stop_reason is not None:
            return active.stop_reason
        if handle.returncode == 0 and (active.ended or active.result_committed):
            return ResourceRunnerStatus.EXITED
        return ResourceRunnerStatus.CRASHED


def _exit_reason(status: ResourceRunnerStatus, timeout_ms: int, code: int | None) -> str:
    if status is ResourceRunnerStatus.TIMED_OUT:
        return f"the reconcile overran its {timeout_ms} ms deadline and was stopped"
    if status is ResourceRunnerStatus.ORPHANED:
        return "the server stopped while the reconcile ran"
    how = "no exit status" if code is None else (f"signal {-code}" if code < 0 else f"code {code}")
    return f"the resource runner exited without a result ({how})"
