"""The bounded runner pool: admit runs, start one child per run generation, keep their claims.

Duties, each driven by the server loop::

    schedule   while fewer than ``max_workers`` runs are launching or running, claim the next
               eligible run (generation + 1) and record the runner row in the loop turn's group
               commit (:mod:`piwf.server.runs.admissions`), then start the child and hand it to
               its :class:`~piwf.server.runs.session.RunnerSession`
    renew      the server (never the child) renews every active run claim on a timer, so a
               child that blocks its own interpreter cannot cost the run its claim; the same
               transaction moves the run's open active intervals forward (its agent command is
               still seen working), and a runner whose command's request was settled meanwhile
               is told so
    rescue     a run left executing with an absent or expired claim and no child of this server
               (its claim expired while the server was stopped or starved, a launch failed after
               its claim, an exit could not be recorded) is decided as startup recovery decides
               it: a new claim (generation + 1), then its effects; every ``poll_s``
    stop       control commands and shutdown stop children; an exit frees the slot

Capacity counts pending launches. Renewal, cancellation and cleanup never wait for a slot. What
one child says, and its exit, is its session's business (:mod:`piwf.server.runs.session`).

While the database cannot serve (a full disk, an I/O error: ``StateUnavailableError``) a launch
record is retried after a growing delay (0.1 s to 2 s); the periodic duties simply try again on
their next tick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from piwf.errors import ClaimLostError, PiwfError, StateUnavailableError
from piwf.lifecycle import Conflict
from piwf.processes import ChildKind, is_alive
from piwf.protocol.runner_v1 import Launch
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.failures import retry_later
from piwf.server.loop import EventLoop, Timer
from piwf.server.runs.admissions import Admission, RunAdmissions, started_process
from piwf.server.runs.agents import reap_runner_groups
from piwf.server.runs.content_transfer import ContentTransfer
from piwf.server.runs.runner_records import ProcessRecord
from piwf.server.runs.session import RunnerSession
from piwf.server.runs.spares import SpareRunners
from piwf.state import StateDatabase, Transaction
from piwf.state import execution as ex
from piwf.state.enums import ActorType, RunnerStatus
from piwf.state.execution import RunLaunch, active_time
from piwf.state.leases import Claim, renew_claim
from piwf.state.records import Actor
from piwf.state.server_epoch import ServerClaim, verify_server_claim

log = logging.getLogger("piwf.server")


class ValidationAdmission(Protocol):
    """Validation children of agent submissions: admitted first, sharing the pool's slots."""

    def admit_borrowers(self) -> None:
        """Start the ready validations whose run has a live runner (they borrow its slot)."""
        ...

    def admit(self) -> bool:
        """Start one ready validation in a free slot; False when none is ready."""
        ...

    def busy_slots(self) -> int:
        """Slots held by validation children now."""
        ...


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
    #: The server's agent command (``PIWF_AGENT_COMMAND``), for steps that name none.
    agent_command: tuple[str, ...] | None = None
    #: The state home, given to agent commands as their ``PIWF_HOME``.
    state_home: str | None = None
    #: Idle runner children kept started while slots are free (server/runs/spares.py).
    spare_runners: int = 1


class Executor(RunAdmissions):
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
        #: Called when a runner registered or unregistered its agent process (the agent
        #: deadlines recompute their timer).
        self.on_agent_activity: Callable[[str], None] = lambda _run_id: None
        self.supervisor = supervisor
        self.active: dict[str, RunnerSession] = {}
        self.spares = SpareRunners(supervisor, loop, settings.spare_runners)
        #: The resource reconciles sharing this pool's capacity (set by the lifecycle).
        self.reconciler: ReconcileAdmission | None = None
        #: The validation children of agent submissions, admitted first (set by the lifecycle).
        self.validations: ValidationAdmission | None = None
        self._scheduling = False
        self._prefer_reconcile = False
        #: Admissions queued for the turn's commit; each holds a slot until it is decided.
        self.admitting: list[Admission] = []
        #: Within one scheduling pass: runs still claimable, and whether an agent deadline is
        #: due (then the pass admits in transactions of its own); None outside a pass.
        self._ready: tuple[int, bool] | None = None
        self._due_timer: Timer | None = None
        loop.every(settings.poll_s, self.schedule)
        loop.every(settings.poll_s, self.rescue_stranded_runs)
        loop.every(settings.renew_s, self.renew_claims)

    @property
    def owner_id(self) -> str:
        """The lease owner id of this server's run claims."""
        return self.server_claim().server_id

    @property
    def lease_ms(self) -> int:
        """How long a run claim lasts between renewals."""
        return self.settings.run_lease_ms

    def verify_server_claim(self, tx: Transaction) -> None:
        """Raise unless this server still holds its epoch (inside ``tx``)."""
        verify_server_claim(tx, self.server_claim())

    def is_current(self, session: RunnerSession) -> bool:
        """Whether ``session`` is still the generation this pool executes for its run."""
        return self.active.get(session.run_id) is session

    def schedule(self) -> None:
        """Fill free slots (pending launches count toward capacity).

        Ready validations of agent submissions come first (:class:`ValidationAdmission`; one
        whose run has a live runner borrows that runner's slot). Then admission alternates
        between the two kinds of work when both have some: after a workflow run the next slot
        is offered to a resource reconcile first, and the other way round
        (:class:`ReconcileAdmission`; the reconciles count toward the same capacity).
        """
        if self._scheduling or self.loop.stop_requested:
            return
        self._scheduling = True
        self._ready = None
        try:
            if self.validations is not None:
                self.validations.admit_borrowers()
            while self.busy_slots() < self.settings.max_workers:
                if self.validations is not None and self.validations.admit():
                    continue
                kinds = (
                    (self._admit_reconcile, self._admit_run)
                    if self._prefer_reconcile
                    else (self._admit_run, self._admit_reconcile)
                )
                admitted = next((admit for admit in kinds if admit()), None)
                if admitted is None:
                    break
                self._prefer_reconcile = admitted == self._admit_run
        finally:
            self._scheduling = False
            self._ready = None
        self.fill_spares()
        self._wake_when_due()

    def _wake_when_due(self) -> None:
        """Schedule the next pass for the instant the next parked run falls due (a timer's
        wake time, a retry's back-off), when that comes before the next poll."""
        try:
            with self.db.read() as tx:
                due_at = ex.next_due_at(tx)
        except PiwfError as error:
            log.warning("reading the next due run failed: %s", error)
            return
        if due_at is None:
            return
        delay_s = max(0.0, (due_at - self.db.clock.now_ms()) / 1000)
        if delay_s >= self.settings.poll_s:
            return
        if self._due_timer is not None:
            if self._due_timer.due <= time.monotonic() + delay_s:
                return  # an earlier (or the same) pass is already scheduled
            self._due_timer.cancel()
        self._due_timer = self.loop.call_later(delay_s, self._due)

    def _due(self) -> None:
        self._due_timer = None
        self.schedule()

    def fill_spares(self) -> None:
        """Keep spare runners for the free slots, once every launched runner is ready (a
        starting child gets the CPU first); after every schedule, so after every exit."""
        if not self.admitting and all(
            session.ready or session.ended for session in self.active.values()
        ):
            self.spares.fill(self.settings.max_workers - self.busy_slots())

    def busy_slots(self) -> int:
        """Slots in use: launching and running children of every kind."""
        reconciles = 0 if self.reconciler is None else self.reconciler.busy_slots()
        validations = 0 if self.validations is None else self.validations.busy_slots()
        return len(self.active) + len(self.admitting) + reconciles + validations

    def _admit_reconcile(self) -> bool:
        """The resource-manager side of the alternation (see :mod:`piwf.server.resources`)."""
        return self.reconciler is not None and self.reconciler.admit()

    def renew_claims(self) -> None:
        """Renew every active run claim; a lost claim stops its child without a failure.

        Runner calls queued for the group commit are committed first, so a runner whose last
        call ends its run reads ``ended`` here instead of losing a claim it no longer needs."""
        self.db.group.flush()
        for active in list(self.active.values()):
            if active.ended:
                continue
            try:
                with self.db.write() as tx:
                    active.claim = renew_claim(tx, active.claim, self.settings.run_lease_ms)
                    active_time.observe_run(tx, active.run_id)
                active.tell_if_settled()
            except ClaimLostError as error:
                log.warning("run %s lost its claim (%s)", active.run_id, error.reason)
                active.server_lost_claim = True
                self.stop(active, RunnerStatus.CLAIM_LOST)
            except PiwfError as error:
                log.warning("renewing run %s failed: %s", active.run_id, error)

    def request_settled(self, run_id: str) -> None:
        """A request of ``run_id`` stopped being pending (a submission was accepted, it expired):
        if this server's runner of that run is waiting on its agent command for it, tell it now
        rather than at the next renewal."""
        active = self.active.get(run_id)
        if active is not None:
            try:
                active.tell_if_settled()
            except PiwfError as error:
                log.warning("run %s: telling its runner failed: %s", run_id, error)

    def rescue_stranded_runs(self) -> None:
        """Recover runs whose claim expired or vanished while this server lives.

        A child of this server whose claim has expired is stopped (``claimLost``); its exit
        then recovers the run. A run marked executing that no child of this server executes is
        recovered here at once: a live runner row left behind is closed ``orphaned`` (its exact
        process killed if it still runs) and the run is decided from its effects under a new
        claim, exactly as :func:`~piwf.server.recovery.recover_previous_server` does at
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
                self.stop(active, RunnerStatus.CLAIM_LOST)
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
                    reap_runner_groups(tx, runner.runner_epoch)
                    # Not a child this server supervises any more: kill it only if it is still
                    # that exact process (start identity, never a bare pid).
                    identity = runner.process_start_identity
                    if runner.pid is not None and identity is not None and is_alive(identity):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(runner.pid, signal.SIGKILL)
                recovered = ex.close_runner_and_recover(
                    tx,
                    run.run_id,
                    None if runner is None else runner.runner_epoch,
                    RunnerStatus.ORPHANED,
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

    def has_live_runner(self, run_id: str) -> bool:
        """Whether a runner of this server executes ``run_id`` now (not being stopped)."""
        active = self.active.get(run_id)
        return active is not None and not active.ended and active.stop_reason is None

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
        self.stop(active, status)

    def stop_all(self) -> None:
        """Stop every child (server shutdown); their runs resume under the next server."""
        for active in self.active.values():
            active.stop_reason = active.stop_reason or RunnerStatus.ORPHANED
        self.supervisor.stop_all(self.settings.stop_grace_s)

    # -- launching -------------------------------------------------------------------------

    def _new_session(self, launch: RunLaunch, runner_epoch: str) -> RunnerSession:
        return RunnerSession(self, launch, launch.claim, runner_epoch, ContentTransfer(self.db))

    def _start(self, active: RunnerSession, envelope: Launch, spare: ChildHandle | None) -> None:
        """The launch is recorded: hand ``envelope`` to ``spare``, or to a child started for it
        (the envelope waits in the pipe while the fork server forks it)."""
        self.active[active.run_id] = active
        on_exit = lambda finished: self._runner_ended(active, finished)  # noqa: E731
        on_started = lambda _started: self._record_process(active)  # noqa: E731
        if spare is None:
            try:
                handle = self.supervisor.start(
                    ChildSpec(
                        active.runner_epoch,
                        ChildKind.WORKFLOW_RUNNER,
                        on_exit=on_exit,
                        on_started=on_started,
                    )
                )
            except OSError as error:
                self._not_started(active, error.strerror or "")
                return
        else:
            handle = spare
            handle.on_exit.append(on_exit)
            if not handle.started:
                handle.on_started.append(on_started)
        active.attach(handle, envelope.encode(), self.settings.ready_timeout_s)
        if handle.started and started_process(spare) is None:
            self._record_process(active)  # its pid is known, but was not recorded with the launch

    def _runner_ended(self, active: RunnerSession, handle: ChildHandle) -> None:
        if handle.start_failure is not None:
            self._not_started(active, handle.start_failure)
        else:
            active.exited(handle)

    def _not_started(self, active: RunnerSession, why: str) -> None:
        """No child (it could not be asked for, or its pid never came): the slot is freed and
        the claimed run waits for its claim to expire, then is rescued (``orphaned``), so a
        start that keeps failing is retried once per lease, not in a loop."""
        log.warning("run %s: its runner could not be started: %s", active.run_id, why)
        if active.ready_timer is not None:
            active.ready_timer.cancel()
        if self.is_current(active):
            self.active.pop(active.run_id, None)

    def _record_process(self, active: RunnerSession) -> None:
        """Record the child's pid and start identity once they are known (its ``on_started``),
        in the loop turn's group commit (``ProcessRecord``); a record refused stops the child
        (``claimLost``).

        While the database cannot serve, the record is retried later and the child goes on.
        Its messages may be served before this (the state accepts the record after ``ready``).
        """
        handle = active.handle
        assert handle is not None

        def refused(error: PiwfError) -> None:
            log.warning("run %s: recording its runner failed: %s", active.run_id, error)
            self.stop(active, RunnerStatus.CLAIM_LOST)

        self.db.group.defer(ProcessRecord(active, handle, refused))

    def retry_later(
        self,
        active: RunnerSession,
        what: str,
        error: StateUnavailableError,
        again: Callable[[], object],
    ) -> None:
        """Retry ``again`` later while ``active`` is still this run's generation here."""
        log.warning("run %s: %s failed (%s); retrying", active.run_id, what, error.code)
        wanted = lambda: self.is_current(active)  # noqa: E731
        retry_later(self.loop.call_later, active.state_retry, wanted, again)

    # -- stopping and reaping --------------------------------------------------------------

    def stop(self, active: RunnerSession, reason: RunnerStatus, *, kill: bool = False) -> None:
        """Stop ``active``'s child (``kill``: at once, else SIGTERM then a bounded SIGKILL).

        The first reason wins; a session whose child never started is forgotten at once.
        """
        active.stop_reason = active.stop_reason or reason
        if active.handle is None:
            self.active.pop(active.run_id, None)
            return
        if kill:
            self.supervisor.kill(active.handle)
        else:
            self.supervisor.stop(active.handle, self.settings.stop_grace_s)

    def agent_activity(self, run_id: str) -> None:
        """An agent process of ``run_id`` was registered or unregistered."""
        self.on_agent_activity(run_id)

    def ended(self, active: RunnerSession) -> None:
        """``active``'s exit is recorded: free its slot, tell waiters, schedule the next run."""
        self.active.pop(active.run_id, None)
        self.run_changed(active.run_id)
        self.loop.call_later(0, self.schedule)
        self.on_runner_exit()
