"""Run admissions in the loop turn's group commit: a claim and its launch record, one savepoint.

A scheduling pass (:meth:`~piwf.server.runs.pool.Executor.schedule`) reads once how many runs
could be claimed now, and queues one :class:`Admission` per free slot up to that number; each
holds its slot (and the spare runner it will hand its envelope to) until it is decided::

    schedule pass ─▶ read: runnable runs now, any agent deadline due?
                     (a due deadline: the pass admits in transactions of its own, so every
                      expiry comes before the next claim, DESIGN.md §6)
                  ─▶ queue one Admission per free slot, as many as runs are runnable
    the turn's transaction, each admission's own savepoint:
                     verify the server epoch, expire due agent requests, claim the next run
                     (generation + 1), record its runner row (with a spare's known process);
                     a refused launch record is undone alone and the claim kept (the run is
                     rescued as any run no child executes)
    after COMMIT:    fault points run.after_claim_commit, runner.after_launch_record; start the
                     child or hand the spare its envelope. Nothing claimed (another admission of
                     the same transaction took the last run): the slot and the spare are freed.

Queued with the runner calls, run starts and exit records of the same turn, an admission costs
no commit of its own: the fsync that records a runner's exit can also launch the next run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from piwf import faults
from piwf.errors import PiwfError, StateUnavailableError
from piwf.lifecycle import Conflict
from piwf.protocol.runner_v1 import Launch
from piwf.server.children.supervisor import ChildHandle
from piwf.server.runs.recorded_sources import workflow_source
from piwf.server.runs.spares import new_runner_epoch
from piwf.state import Transaction
from piwf.state import execution as ex
from piwf.state.enums import ActorType
from piwf.state.execution import RunLaunch, agents
from piwf.state.execution import runs as run_store
from piwf.state.records import Actor
from piwf.state.server_epoch import verify_server_claim

if TYPE_CHECKING:
    from piwf.server.loop import EventLoop
    from piwf.server.runs.pool import ExecutionSettings
    from piwf.server.runs.session import RunnerSession
    from piwf.server.runs.spares import SpareRunners
    from piwf.state import StateDatabase
    from piwf.state.server_epoch import ServerClaim

log = logging.getLogger("piwf.server")


@dataclass(eq=False)
class Admission:
    """One slot's admission, queued for the turn's commit (a ``DeferredWrite``)."""

    host: RunAdmissions
    #: The spare runner taken for this admission (None: a child is started for the run).
    spare: ChildHandle | None
    #: The runner epoch the launch is recorded under (a spare's name, or a new one).
    runner_epoch: str

    def apply(self, tx: Transaction) -> Callable[[], None]:
        launch, expired = self.host.claim_next(tx)
        recorded = (
            None
            if launch is None
            else self.host.record_launch(tx, launch, self.runner_epoch, self.spare)
        )
        return lambda: self.host.admitted(self, launch, expired, recorded)

    def refused(self, error: PiwfError) -> Callable[[], None]:
        return lambda: self.host.not_admitted(self, error)

    def unavailable(self, error: StateUnavailableError) -> None:
        self.host.not_admitted(self, error)


class RunAdmissions:
    """The pool's admission duties, mixed into :class:`~piwf.server.runs.pool.Executor`: queue
    admissions for a scheduling pass, claim and record launches inside the turn's transaction,
    and act on them once committed."""

    if TYPE_CHECKING:  # provided by the pool, which mixes this in
        db: StateDatabase
        loop: EventLoop
        spares: SpareRunners
        settings: ExecutionSettings
        active: dict[str, RunnerSession]
        admitting: list[Admission]
        _ready: tuple[int, bool] | None
        run_changed: Callable[[str], None]
        server_claim: Callable[[], ServerClaim]

        @property
        def owner_id(self) -> str:
            """The lease owner id of this server's run claims."""
            ...

        def schedule(self) -> None:
            """One scheduling pass."""
            ...

        def _new_session(self, launch: RunLaunch, runner_epoch: str) -> RunnerSession:
            """The session of a recorded launch, hosted by the pool."""
            ...

        def _start(
            self, active: RunnerSession, envelope: Launch, spare: ChildHandle | None
        ) -> None:
            """Start the recorded launch's child (or hand a spare its envelope)."""
            ...

    def _admit_run(self) -> bool:
        """Queue the admission of the next ready run for the turn's commit, holding its slot
        and a spare runner until then (server/runs/admissions.py); False when none is ready.

        A pass reads once how many runs are claimable now. While an agent deadline is due the
        pass admits as :meth:`_admit_run_now` does, so the expiry commits before any claim."""
        if self._ready is None:
            self._ready = self._ready_runs()
        runnable, deadline_due = self._ready
        if deadline_due:
            return self._admit_run_now()
        if runnable <= 0:
            return False
        self._ready = (runnable - 1, deadline_due)
        spare = self.spares.take()
        admission = Admission(self, spare, new_runner_epoch() if spare is None else spare.name)
        self.admitting.append(admission)
        self.db.group.defer(admission)
        return True

    def _ready_runs(self) -> tuple[int, bool]:
        """How many runs could be claimed now, and whether an agent deadline is due."""
        try:
            with self.db.read() as tx:
                due = any(deadline.due for deadline in ex.pending_agent_deadlines(tx))
                return ex.count_runnable(tx), due
        except PiwfError as error:
            log.warning("scheduling failed: %s", error)
            return 0, False

    def admitted(
        self,
        admission: Admission,
        launch: RunLaunch | None,
        expired: list[ex.Expiry],
        recorded: Launch | PiwfError | None,
    ) -> None:
        """An admission committed: start what it claimed, or free its slot (and spare)."""
        self.admitting.remove(admission)
        for expiry in expired:
            self.run_changed(expiry.run_id)
        if launch is None:
            self.spares.give_back(admission.spare)
            return
        faults.point("run.after_claim_commit")
        if not isinstance(recorded, Launch):
            # The claim committed without a runner row: the run is stranded, and
            # rescue_stranded_runs recovers it as it does any run no child executes.
            log.warning("launching run %s failed: %s", launch.run_id, recorded)
            self.spares.give_back(admission.spare)
            return
        faults.point("runner.after_launch_record")
        session = self._new_session(launch, admission.runner_epoch)
        self._start(session, recorded, admission.spare)

    def not_admitted(self, admission: Admission, error: PiwfError) -> None:
        """An admission changed nothing: free its slot and spare; the next pass tries again."""
        self.admitting.remove(admission)
        self.spares.give_back(admission.spare)
        log.warning("scheduling failed: %s", error)
        if not isinstance(error, StateUnavailableError):
            return
        self.loop.call_later(self.settings.poll_s, self.schedule)

    def _admit_run_now(self) -> bool:
        """Claim the next ready run and record its launch in one transaction of its own (one
        commit on the run's path), then hand its envelope to a spare runner or to a child
        started for it."""
        spare = self.spares.peek()
        runner_epoch = new_runner_epoch() if spare is None else spare.name
        try:
            with self.db.write() as tx:
                launch, expired = self.claim_next(tx)
                if launch is None:
                    recorded: Launch | PiwfError | None = None
                else:
                    recorded = self.record_launch(tx, launch, runner_epoch, spare)
        except PiwfError as error:
            log.warning("scheduling failed: %s", error)
            return False
        for expiry in expired:
            self.run_changed(expiry.run_id)
        if launch is None:
            return False
        faults.point("run.after_claim_commit")
        if not isinstance(recorded, Launch):
            # The claim committed without a runner row: the run is stranded, and
            # rescue_stranded_runs recovers it as it does any run no child executes.
            log.warning("launching run %s failed: %s", launch.run_id, recorded)
            return True
        faults.point("runner.after_launch_record")
        taken = self.spares.take() if spare is not None else None
        assert taken is spare, "the spare peeked at is the one taken (no loop turn between)"
        self._start(
            self._new_session(launch, runner_epoch),
            recorded,
            spare,
        )
        return True

    def claim_next(self, tx: Transaction) -> tuple[RunLaunch | None, list[ex.Expiry]]:
        """Inside the admission's transaction: expire due agent deadlines, then claim the next
        ready run (None when no run is ready)."""
        verify_server_claim(tx, self.server_claim())
        # Expired agent deadlines come before the next run (DESIGN.md §6): a run whose runner
        # was stopped at its deadline resumes into its timeout, never into another run of its
        # agent.
        expired = ex.expire_due_agent_requests(
            tx,
            actor=Actor(ActorType.POLICY, self.owner_id),
            control_owner_id=self.owner_id,
            lease_ms=self.settings.run_lease_ms,
        )
        launch = ex.claim_next_run(
            tx,
            owner_id=self.owner_id,
            lease_ms=self.settings.run_lease_ms,
            exclude=tuple(self.active),
        )
        return launch, expired

    def record_launch(
        self, tx: Transaction, launch: RunLaunch, runner_epoch: str, spare: ChildHandle | None
    ) -> Launch | PiwfError:
        """Record the runner row of ``launch`` in its own savepoint of ``tx`` (and a spare's
        known process with it); return the envelope, or the refusal (its changes undone, the
        claim kept)."""
        try:
            with tx.savepoint():
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
                # A spare's process is known already: recorded with its launch, one commit.
                known = started_process(spare)
                if known is not None:
                    process = ex.record_runner_process(
                        tx, launch.claim, runner_epoch, *known, lease_ms=self.settings.run_lease_ms
                    )
                    if isinstance(process, Conflict):
                        raise PiwfError(f"runner process refused: {process.evidence}")
        except StateUnavailableError:
            raise
        except PiwfError as error:
            return error
        return envelope

    def _envelope(self, tx: Transaction, launch: RunLaunch, runner_epoch: str) -> Launch:
        run = run_store.require_run(tx, launch.run_id)
        return Launch(
            runId=launch.run_id,
            generation=launch.generation,
            runnerEpoch=runner_epoch,
            serverEpoch=self.server_claim().epoch,
            projectPath=run.project_path,
            workflowSource=workflow_source(tx, launch.run_id),
            definitionDigest=run.definition_digest.hex(),
            executionMode=agents.execution_mode(tx, launch.run_id).value,
            runAgentCommand=_listed(agents.run_agent_command(tx, launch.run_id)),
            serverAgentCommand=_listed(self.settings.agent_command),
            stateHome=self.settings.state_home,
        )


def started_process(spare: ChildHandle | None) -> tuple[int, str] | None:
    """The pid and start identity of a spare whose process is known, else None."""
    if spare is None or not spare.started or spare.pid is None or spare.identity is None:
        return None
    return spare.pid, spare.identity


def _listed(command: tuple[str, ...] | None) -> list[str] | None:
    return None if command is None else list(command)
