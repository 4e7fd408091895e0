"""An in-memory :class:`~piwf.workflow.port.WorkflowPort` for tests and dry runs.

It gives every port call the typed answer the server's execution store gives, minus
persistence, claims and a scheduler (``tests/contract`` runs one suite on both to keep it so):
one active visit per run, visit numbers that only grow, a retry attempt that follows the active
one, effects keyed by the engine's derived key with a request fingerprint check (same key + same
request adopts, another request conflicts), an effect applying under the active attempt is a
conflict while one found by a later attempt (its runner died) runs again (idempotent) or becomes
ambiguous (manual), equal repeats are adopted, and terminal runs accept nothing more. Test
helpers create runs and restarts, answer requests (as a person, by a decision's timeout policy or
by its deadline passing), submit agent outputs and resolve ambiguous effects. A failed visit's
failure record is kept as the store keeps it (:meth:`MemoryPort.failures_of`).

It is the test double of **one process**: :meth:`MemoryPort.submit` runs an agent's ``validate``
in-process through the function the server's validation child calls.

Nothing here survives the process; a "crash" in a test is an exception that escapes
:func:`~piwf.workflow.engine.execute` and leaves the port as the dead runner left it.
"""

from __future__ import annotations

import threading

from piwf.canonical import JsonValue
from piwf.clock import Clock
from piwf.lifecycle import (
    Adopted,
    Applied,
    CommandKind,
    Conflict,
    EffectStatus,
    Lineage,
    RecoveryRequired,
    RunStatus,
)
from piwf.workflow.agent_driver import AgentDriver
from piwf.workflow.commands import StartCommand
from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.context import CancellationSignal, Outcome
from piwf.workflow.definition import WorkflowDefinition
from piwf.workflow.engine import ExecutionResult, execute
from piwf.workflow.failure import AttemptFailure
from piwf.workflow.identity import request_fingerprint
from piwf.workflow.invoke import to_json
from piwf.workflow.memory_answers import MemoryAnswers
from piwf.workflow.memory_records import EffectRecord, MemoryRun, MemorySubmission
from piwf.workflow.memory_settings import MemorySettings
from piwf.workflow.nodes import Recovery
from piwf.workflow.port import (
    SETTINGS_CHANGED,
    ActiveVisit,
    Committed,
    EffectOutcome,
    EffectReservation,
    EffectSettlement,
    InteractionRequested,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    NotificationRequested,
    ParkReason,
    PendingRequest,
    PortResult,
    RunBegun,
    RunFinished,
    RunParked,
    SavedRun,
    SettingsCopy,
    SettledEffect,
    StepRecord,
    UpdatePublished,
)

#: The answer to a repeat of a committed change (the in-memory port names no revision for it).
_UNCHANGED: Adopted[Committed] = Adopted(Committed())


class MemoryPort(MemoryAnswers, MemorySettings):
    """A thread-safe in-memory port; every accepted message is appended to ``messages``.

    Answering its requests from outside (a person, a submission, a timeout) is
    :class:`~piwf.workflow.memory_answers.MemoryAnswers`'s part."""

    def __init__(self) -> None:
        MemorySettings.__init__(self)
        self._lock = threading.RLock()
        self._runs: dict[str, MemoryRun] = {}
        self.effects: dict[str, EffectRecord] = {}
        self.updates: dict[tuple[str, str, str], UpdatePublished] = {}
        self._update_attempts: dict[tuple[str, str, str], ActiveVisit] = {}
        self.notifications: dict[str, NotificationRequested] = {}
        self.requests: dict[str, InteractionRequested] = {}
        self.submissions: list[MemorySubmission] = []
        self.failures: dict[str, list[AttemptFailure]] = {}
        self.messages: list[object] = []

    # Helpers for tests and dry runs ------------------------------------------------------

    def create_run(
        self, run_id: str, input: JsonValue = None, *, definition_digest: str | None = None
    ) -> None:
        """Queue a new root run; raises ``ValueError`` if ``run_id`` exists."""
        with self._lock:
            if run_id in self._runs:
                raise ValueError(f"run {run_id} already exists")
            self._runs[run_id] = MemoryRun(
                run_id, RunStatus.QUEUED, to_json(input), Lineage.ROOT, None, 0, definition_digest
            )

    def create_restart(self, parent_run_id: str, run_id: str) -> None:
        """Queue a restart of ``parent_run_id`` with its input and definition digest.

        Like the server's ``run restart`` it copies nothing else; unlike it, it does not check
        the parent's status, so tests can send invalid restart commands to the engine.
        """
        with self._lock:
            parent = self._runs[parent_run_id]
            if run_id in self._runs:
                raise ValueError(f"run {run_id} already exists")
            self._runs[run_id] = MemoryRun(
                run_id,
                RunStatus.QUEUED,
                parent.input,
                Lineage.RESTART,
                parent_run_id,
                parent.restart_number + 1,
                parent.definition_digest,
            )

    def resolve_effect(
        self,
        effect_key: str,
        outcome: EffectOutcome,
        result: JsonValue = None,
        error: str | None = None,
    ) -> None:
        """Operator recovery: settle an ambiguous effect as applied or rejected."""
        with self._lock:
            record = self.effects[effect_key]
            if record.status is not EffectStatus.AMBIGUOUS or outcome is EffectOutcome.AMBIGUOUS:
                raise ValueError(f"effect {effect_key} is {record.status.value}, not ambiguous")
            record.status = EffectStatus(outcome.value)
            record.result, record.error = to_json(result), error

    def failures_of(self, run_id: str) -> list[AttemptFailure]:
        """Return the failure records of the run's failed attempts, oldest first."""
        with self._lock:
            return list(self.failures.get(run_id, ()))

    def effects_of(self, run_id: str) -> list[EffectRecord]:
        """Return the effects of ``run_id`` in reservation order."""
        with self._lock:
            return [record for record in self.effects.values() if record.run_id == run_id]

    # The port -----------------------------------------------------------------------------

    def read_run(self, run_id: str) -> SavedRun | None:
        """Return a snapshot of the saved run, or ``None``.

        A run that has begun but opened no visit yet still reads ``queued`` (it is fresh, so a
        start fits again after its runner died), as the server's store reads it.
        """
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return None
            begun_only = run.status is RunStatus.RUNNING and not run.visits
            return SavedRun(
                run_id=run.run_id,
                status=RunStatus.QUEUED if begun_only else run.status,
                input=run.input,
                lineage=run.lineage,
                parent_run_id=run.parent_run_id,
                restart_number=run.restart_number,
                definition_digest=run.definition_digest,
                steps=tuple(run.steps),
                visits=dict(run.visits),
                active=run.active,
                pending=run.pending,
                park_reason=run.park_reason,
                output=run.output,
                error=run.error,
            )

    def begin_run(self, message: RunBegun) -> PortResult:
        """Mark the run running for a command that fits it (``Adopted`` when nothing is new).

        Start and restart need a run of that lineage with no visit yet; resume and continue a
        run that has one. Only an empty title is filled. The status change is the scheduler's
        part on the server, so it does not count as something new here either.
        """
        with self._lock:
            run = self._runs.get(message.run_id)
            if run is None or run.status.terminal:
                return Conflict(f"run {message.run_id} is missing or terminal")
            if run.definition_digest not in (None, message.definition_digest):
                return Conflict("definition digest differs from the run's")
            command, fresh = message.command.value, not run.visits
            if message.command in (CommandKind.START, CommandKind.RESTART):
                restart = message.command is CommandKind.RESTART
                if not fresh:
                    return Conflict(f"{command}: run {run.run_id} has already executed")
                if (run.lineage is Lineage.RESTART) is not restart:
                    return Conflict(f"{command}: run {run.run_id} has another lineage")
            elif fresh:
                return Conflict(f"{command}: run {run.run_id} has not started")
            run.definition_digest = message.definition_digest
            run.status, run.park_reason = RunStatus.RUNNING, None
            if message.title is None or run.title is not None:
                return _UNCHANGED
            run.title = message.title
            return self._accept(message)

    def node_started(self, message: NodeStarted) -> PortResult:
        """Open a visit, or the next attempt of the unfinished one (not while it waits)."""
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            active = run.active
            if active is not None:
                if (active.path, active.visit) != (message.path, message.visit):
                    return Conflict(f"visit {active.visit} of {active.path!r} is still active")
                if message.attempt == active.attempt and not run.try_pending:
                    return Adopted(Committed(settings=active.settings))
                if message.attempt != active.attempt + (0 if run.try_pending else 1):
                    return Conflict(f"attempt {message.attempt} does not follow {active.attempt}")
                if run.pending is not None:
                    return Conflict(f"visit {active.visit} of {active.path!r} waits on a request")
            elif message.visit != run.visits.get(message.path, 0) + 1 or message.attempt != 1:
                return Conflict(f"visit {message.visit} attempt {message.attempt} is not next")
            run.active = ActiveVisit(
                message.path,
                message.visit,
                message.attempt,
                message.started_at_ms,
                message.deadline_ms,
                message.wake_at_ms,
                0 if active is None else active.failed_tries,
                self._settings_copy(message.run_id, message.settings),
            )
            run.try_pending = False
            run.visits[message.path] = message.visit
            return self._accept(message, settings=run.active.settings)

    def node_finished(self, message: NodeFinished) -> PortResult:
        """Close the active attempt ``ok`` (closing its answered request, which it must name)."""
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            active = self._active(run, message.path, message.visit, message.attempt)
            if isinstance(active, Conflict):
                return active
            pending = run.pending
            if pending is not None and (
                pending.request_id != message.request_id or not pending.answered
            ):
                return Conflict(f"request {pending.request_id} is still open")
            if pending is None and message.request_id is not None:
                return Conflict(f"request {message.request_id} is not open")
            newest = self._settings_newest(message.run_id, _mount_of(message.path))
            chosen = message.settings_change_number
            if chosen is not None and newest is not None and newest.change_number != chosen:
                return Conflict(f"{SETTINGS_CHANGED}: change {newest.change_number} is newer")
            self._close_visit(run, active, message, Outcome.OK, message.output, None)
            return self._accept(message)

    def node_failed(self, message: NodeFailed) -> PortResult:
        """Close the active attempt with a failure outcome (dropping any open request)."""
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            if message.outcome is Outcome.OK:
                return Conflict("outcome ok is not a failure")
            active = self._active(run, message.path, message.visit, message.attempt)
            if isinstance(active, Conflict):
                return active
            if run.try_pending:
                return Conflict(f"attempt {message.attempt} has not started")
            if message.retry_at_ms is None:
                self._close_visit(run, active, message, message.outcome, None, message.error)
            else:  # the visit stays open: its next try is pending until retry_at
                run.active = ActiveVisit(
                    message.path,
                    message.visit,
                    message.attempt + 1,
                    message.finished_at_ms,
                    None,
                    message.retry_at_ms,
                    active.failed_tries + 1,
                )
                run.try_pending, run.pending = True, None
            if message.failure is not None:
                failed = AttemptFailure(
                    message.path, message.visit, message.attempt, message.outcome, message.failure
                )
                self.failures.setdefault(run.run_id, []).append(failed)
            return self._accept(message)

    @staticmethod
    def _close_visit(
        run: MemoryRun,
        active: ActiveVisit,
        message: NodeFinished | NodeFailed,
        outcome: Outcome,
        output: JsonValue,
        error: str | None,
    ) -> None:
        run.steps.append(
            StepRecord(
                message.path,
                message.visit,
                message.attempt,
                outcome,
                output,
                error,
                active.started_at_ms,
                message.finished_at_ms,
            )
        )
        run.active, run.pending, run.try_pending = None, None, False

    def reserve_effect(self, message: EffectReservation) -> PortResult:
        """Reserve, adopt, refuse or send to recovery, by key and request fingerprint.

        An effect still applying under the active attempt is a ``Conflict`` (its action may be
        running); found by a later attempt (the runner died) it runs again (idempotent) or
        becomes ambiguous (manual), as the server's recovery would have decided.
        """
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            active = self._active(run, message.path, message.visit)
            if isinstance(active, Conflict):
                return active
            if request_fingerprint(message.request) != message.request_fingerprint:
                return Conflict("request fingerprint does not match the request")
            record = self.effects.get(message.effect_key)
            if record is None:
                self.effects[message.effect_key] = EffectRecord(
                    key=message.effect_key,
                    run_id=message.run_id,
                    path=message.path,
                    visit=message.visit,
                    effect_type=message.effect_type,
                    recovery=message.recovery,
                    request=message.request,
                    fingerprint=message.request_fingerprint,
                    applying_attempt=active.attempt,
                )
                return self._accept(message)
            if (record.fingerprint, record.recovery) != (
                message.request_fingerprint,
                message.recovery,
            ):
                return Conflict(f"managed effect key {record.key} was reused with another request")
            if record.status in (EffectStatus.APPLIED, EffectStatus.REJECTED):
                outcome = EffectOutcome(record.status.value)
                return Adopted(
                    Committed(settled=SettledEffect(outcome, record.result, record.error))
                )
            if record.status is EffectStatus.APPLYING:
                if record.applying_attempt == active.attempt:
                    return Conflict(f"effect {record.key} is applying under this attempt")
                if record.recovery is Recovery.IDEMPOTENT:
                    record.attempts += 1
                    record.applying_attempt = active.attempt
                    return _UNCHANGED
                record.status = EffectStatus.AMBIGUOUS
            return RecoveryRequired("effectAmbiguous")

    def settle_effect(self, message: EffectSettlement) -> PortResult:
        """Settle the applying effect attempt (a repeat of the same settlement is adopted)."""
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            record = self.effects.get(message.effect_key)
            if record is None or record.run_id != message.run_id:
                return Conflict(f"effect {message.effect_key} is not reserved by this run")
            if record.status is not EffectStatus.APPLYING:
                same = (record.status.value, record.result) == (
                    message.outcome.value,
                    message.result,
                )
                return _UNCHANGED if same else Conflict(f"effect is {record.status.value}")
            record.status = EffectStatus(message.outcome.value)
            record.result, record.error = message.result, message.error
            return self._accept(message)

    def publish_update(self, message: UpdatePublished) -> PortResult:
        """Keep the latest update per ``(run, type, key)``; the same data again is adopted."""
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            if not (1 <= len(message.update_type) <= 256 and 1 <= len(message.key) <= 256):
                return Conflict("update type and key must have 1..256 characters")
            active = self._active(run, message.path, message.visit)
            if isinstance(active, Conflict):
                return active
            slot = (message.run_id, message.update_type, message.key)
            if (self.updates.get(slot), self._update_attempts.get(slot)) == (message, active):
                return _UNCHANGED
            self.updates[slot], self._update_attempts[slot] = message, active
            return self._accept(message)

    def notify(self, message: NotificationRequested) -> PortResult:
        """Store a notification of the active visit once per stable id."""
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            existing = self.notifications.get(message.notification_id)
            if existing is not None:
                return _UNCHANGED if existing == message else Conflict("another notification")
            active = self._active(run, message.path, message.visit)
            if isinstance(active, Conflict):
                return active
            self.notifications[message.notification_id] = message
            return self._accept(message)

    def request_interaction(self, message: InteractionRequested) -> PortResult:
        """Open the one request of the active visit (adopting an identical repeat)."""
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            active = self._active(run, message.path, message.visit)
            if isinstance(active, Conflict):
                return active
            existing = self.requests.get(message.request_id)
            if existing is not None:
                return _UNCHANGED if existing == message else Conflict("another request content")
            if run.pending is not None:
                return Conflict(f"visit already has request {run.pending.request_id}")
            self.requests[message.request_id] = message
            run.pending = PendingRequest(
                message.request_id, message.path, message.visit, message.kind, message.content
            )
            return self._accept(message)

    def park(self, message: RunParked) -> PortResult:
        """Park the run ``waiting`` on its open request, or ``parked`` on an ambiguous effect
        or on the active visit's wake time (a timer: :meth:`wake` or a resume at that time)."""
        with self._lock:
            run = self._running(message.run_id)
            if isinstance(run, Conflict):
                return run
            active = self._active(run, message.path, message.visit)
            if isinstance(active, Conflict):
                return active
            waiting = message.reason is ParkReason.WAITING
            if message.reason is ParkReason.TIMER:
                if message.wake_at_ms is None or message.wake_at_ms != active.wake_at_ms:
                    return Conflict(
                        f"visit {message.visit} of {message.path!r} has no such wake time"
                    )
            elif waiting and (
                run.pending is None or message.request_id not in (None, run.pending.request_id)
            ):
                return Conflict(f"visit {message.visit} of {message.path!r} has no open request")
            elif not waiting and not any(
                record.status is EffectStatus.AMBIGUOUS for record in self.effects_of(run.run_id)
            ):
                return Conflict(f"run {run.run_id} has no ambiguous effect")
            run.status = RunStatus.WAITING if waiting else RunStatus.PARKED
            run.park_reason = message.reason
            return self._accept(message)

    def finish(self, message: RunFinished) -> PortResult:
        """Give the run its terminal status; an effect still applying becomes ambiguous."""
        with self._lock:
            run = self._runs.get(message.run_id)
            if run is None:
                return Conflict(f"run {message.run_id} does not exist")
            if run.status.terminal:
                same = (run.status, run.output) == (message.status, message.output)
                return _UNCHANGED if same else Conflict(f"run is already {run.status.value}")
            if not message.status.terminal:
                return Conflict(f"{message.status.value} is not a terminal status")
            if message.status is RunStatus.COMPLETED and run.active is not None:
                return Conflict(f"run {run.run_id} still has an active visit")
            for record in self.effects_of(run.run_id):
                if record.status is EffectStatus.APPLYING:
                    record.status = EffectStatus.AMBIGUOUS
            run.status, run.output, run.error = message.status, message.output, message.error
            run.active, run.pending, run.park_reason = None, None, None
            run.try_pending = False
            return self._accept(message)

    # Internals ----------------------------------------------------------------------------

    def _accept(
        self, message: object, *, settings: SettingsCopy | None = None
    ) -> Applied[Committed]:
        self.messages.append(message)
        return Applied(Committed(len(self.messages), settings=settings))

    def _running(self, run_id: str) -> MemoryRun | Conflict:
        run = self._runs.get(run_id)
        if run is None:
            return Conflict(f"run {run_id} does not exist")
        if run.status is not RunStatus.RUNNING:
            return Conflict(f"run {run_id} is {run.status.value}, not running")
        return run

    @staticmethod
    def _active(
        run: MemoryRun, path: str, visit: int, attempt: int | None = None
    ) -> ActiveVisit | Conflict:
        active = run.active
        if active is None or (active.path, active.visit) != (path, visit):
            return Conflict(f"visit {visit} of {path!r} is not the active visit")
        if attempt is not None and attempt != active.attempt:
            return Conflict(f"attempt {attempt} is not the active attempt {active.attempt}")
        return active

    def _run_with_request(self, request_id: str) -> MemoryRun:
        for run in self._runs.values():
            if run.pending is not None and run.pending.request_id == request_id:
                return run
        raise ValueError(f"no run is waiting on request {request_id}")


def run_in_memory(
    workflow: CompiledWorkflow | WorkflowDefinition,
    input: JsonValue = None,
    *,
    run_id: str = "dry-run",
    port: MemoryPort | None = None,
    clock: Clock | None = None,
    cancel: CancellationSignal | None = None,
    agents: AgentDriver | None = None,
) -> tuple[ExecutionResult, MemoryPort]:
    """Dry-run ``workflow`` on a fresh (or given) in-memory port with a start command.

    Returns the execution result and the port, whose records show every proposed change.
    ``agents`` fulfils agent requests (see :mod:`piwf.workflow.agent_driver`).
    """
    compiled = workflow if isinstance(workflow, CompiledWorkflow) else compile_workflow(workflow)
    memory = port or MemoryPort()
    memory.create_run(run_id, input, definition_digest=compiled.digest)
    start = StartCommand(run_id)
    result = execute(start, compiled, memory, clock=clock, cancel=cancel, agents=agents)
    return result, memory


def _mount_of(path: str) -> str:
    """The mount path of the scope that declares the node at ``path``."""
    return path.rpartition("/")[0]
