"""The two ports the engine runs on, behind one test interface (this module holds no tests).

The contract suite runs every test twice: on the in-memory port (:class:`MemoryUnderTest`,
``piwf.workflow.memory``) and on the server's store path (:class:`StoreUnderTest`: the real
engine, each port call crossing its JSON form into ``decode_runner_call`` +
``apply_runner_call`` through :class:`~tests.state.test_execution_support.StorePort`, the
functions the server applies a runner call with, on a real SQLite file). Each side plays its
own server: the store side claims the run, records the runner up to ready, records its exit
and lets the store decide the run (``recover_after_runner_exit``) exactly as the runner pool
does; the memory side has no server and only executes the command.

Where the two legitimately differ, this docstring is the one place that says so; the
subclasses implement each difference and no test branches on the port:

- **Claims, runners, the scheduler.** The memory port has none. A command always executes
  there, so :meth:`PortUnderTest.run` returns None only on the store, when the scheduler would
  not start the run (a blocking park, an unanswered request, an ambiguous effect). Tests assert
  the saved run either way. The memory side picks the command the scheduler would (start or
  restart for a fresh run, else resume) from the saved run; the store side takes it from the
  claim.
- **A runner's death.** On the store the server records the exit and decides the run (requeue,
  wait for an answer, park ``effectAmbiguous``); an applying effect is settled then. The memory
  port keeps what the dead runner left, and the next reservation of the applying effect does
  what recovery would have done (an idempotent one runs again, a manual one becomes ambiguous).
  Either way the next command sees the same saved run and effect.
- **Operators.** Resolving an ambiguous effect is ``resolve_effect`` on the memory port and
  ``effects.resolve_ambiguous`` + ``resume_run`` on the store (the store also needs the
  explicit resume that clears the park). A deadline passing is ``expire_request`` on the
  memory port and the clock passing the deadline + ``expire_due_decisions`` on the store.
- **Answers.** Checkpoints and decisions are answered on both; agent requests only on the memory
  port (the store takes agent submissions with the session feature), so agent flows stay in
  ``tests/workflow``. The store checks a decision's answer against its choices when it is
  submitted; the memory port accepts any answer and the engine refuses an invalid one when the
  command starts (``tests/workflow/test_commands.py``).
- **Revisions** in ``Applied``/``Adopted`` are each port's own counter; tests compare result
  types and settlements, never revision numbers.
- **Restarts.** The memory port queues a restart without checking its parent (so the engine's
  own refusal can be tested); the store's ``restart_run`` refuses a non-terminal parent.

Every test ends with its port's own invariants (:meth:`PortUnderTest.check`): on the store those
of ``state verify``, on the memory port that every accepted message is canonical JSON.

Two drifts are known and left to the modules that own them (the suite asserts neither side):

- After an answer the store reads the run ``parked`` (it is ``running`` with its queue row
  parked), the memory port ``waiting``; ``ContinueCommand`` needs ``waiting``, so only
  ``resume`` (what the server sends) continues a run on the store.
- The store keeps the latest update per (attempt, type, key), the memory port per (run, type,
  key); :meth:`PortUnderTest.updates` shows the latest per (type, key) of the run on both.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import pytest

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.clock import FakeClock
from piwf.errors import RunCommandError
from piwf.state import StateDatabase, blobs
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.enums import RunnerStatus, SubmissionOutcome, SubmissionSource
from piwf.state.results import Applied as StateApplied
from piwf.workflow import port as p
from piwf.workflow.commands import RestartCommand, ResumeCommand, RunCommand, StartCommand
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.context import CancellationSignal
from piwf.workflow.engine import ExecutionResult, execute
from piwf.workflow.memory import MemoryPort
from tests.state.test_execution_support import (
    LEASE_MS,
    OPERATOR,
    SERVER,
    SERVER_ID,
    StorePort,
    command_for,
    create,
    exit_and_recover,
    launch_if_runnable,
    violations,
)

RUN = "run-1"
M = TypeVar("M")


class Crash(BaseException):
    """Stands for the runner process dying: it escapes the engine like a kill would."""


@dataclass(frozen=True)
class Call:
    """One port call the engine made and the typed result it got."""

    message: object
    result: p.PortResult


@dataclass(frozen=True)
class DieAfter:
    """Kill the runner right after the port committed a message of ``kind`` (for ``path``)."""

    kind: type
    path: str | None = None

    def matches(self, message: object) -> bool:
        return isinstance(message, self.kind) and self.path in (
            None,
            getattr(message, "path", None),
        )


class RecordingPort:
    """Delegates every call to a real port, records it, and may die once a chosen call commits.

    Nothing here decides a result: each call is the delegate's, so what a test sees is what the
    port under test answered.
    """

    def __init__(self, delegate: Any, calls: list[Call], die_after: DieAfter | None) -> None:
        self.delegate = delegate
        self.calls = calls
        self.die_after = die_after

    def _call(self, method: Callable[[M], p.PortResult], message: M) -> p.PortResult:
        result = method(message)
        self.calls.append(Call(message, result))
        if self.die_after is not None and self.die_after.matches(message):
            self.die_after = None
            raise Crash(f"runner died after {type(message).__name__}")
        return result

    def read_run(self, run_id: str) -> p.SavedRun | None:
        saved: p.SavedRun | None = self.delegate.read_run(run_id)
        return saved

    def begin_run(self, message: p.RunBegun) -> p.PortResult:
        return self._call(self.delegate.begin_run, message)

    def node_started(self, message: p.NodeStarted) -> p.PortResult:
        return self._call(self.delegate.node_started, message)

    def node_finished(self, message: p.NodeFinished) -> p.PortResult:
        return self._call(self.delegate.node_finished, message)

    def node_failed(self, message: p.NodeFailed) -> p.PortResult:
        return self._call(self.delegate.node_failed, message)

    def reserve_effect(self, message: p.EffectReservation) -> p.PortResult:
        return self._call(self.delegate.reserve_effect, message)

    def settle_effect(self, message: p.EffectSettlement) -> p.PortResult:
        return self._call(self.delegate.settle_effect, message)

    def publish_update(self, message: p.UpdatePublished) -> p.PortResult:
        return self._call(self.delegate.publish_update, message)

    def notify(self, message: p.NotificationRequested) -> p.PortResult:
        return self._call(self.delegate.notify, message)

    def request_interaction(self, message: p.InteractionRequested) -> p.PortResult:
        return self._call(self.delegate.request_interaction, message)

    def reject_answer(self, message: p.AnswerRejected) -> p.PortResult:
        return self._call(self.delegate.reject_answer, message)

    def park(self, message: p.RunParked) -> p.PortResult:
        return self._call(self.delegate.park, message)

    def finish(self, message: p.RunFinished) -> p.PortResult:
        return self._call(self.delegate.finish, message)


# Port-neutral views of what each port stored ------------------------------------------------


@dataclass(frozen=True)
class EffectView:
    """One managed effect as either port stores it (``status`` and ``recovery`` by value)."""

    key: str
    effect_type: str
    recovery: str
    status: str
    attempts: int
    result: JsonValue
    error: str | None


@dataclass(frozen=True)
class NotificationView:
    """One stored notification."""

    notification_id: str
    path: str
    visit: int
    kind: str
    message: str


@dataclass(frozen=True)
class RequestView:
    """One interactive request as the runner proposed it."""

    request_id: str
    path: str
    visit: int
    kind: str
    content: JsonValue
    on_timeout: JsonValue


class PortUnderTest(ABC):
    """One port with just enough of a server around it to run commands the way the server does.

    Workflows are registered per run by :meth:`create`; :meth:`run` executes the next command
    for a run and returns the engine's result (None: the store's scheduler would not start it).
    """

    name: ClassVar[str]

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[Call] = []
        self.workflows: dict[str, CompiledWorkflow] = {}

    # Running commands ----------------------------------------------------------------------

    def create(
        self, workflow: CompiledWorkflow, input: JsonValue = None, run_id: str = RUN
    ) -> None:
        """Queue a root run of ``workflow``."""
        self.workflows[run_id] = workflow
        self._create(workflow, input, run_id)

    def start(
        self, workflow: CompiledWorkflow, input: JsonValue = None, run_id: str = RUN
    ) -> ExecutionResult:
        """Queue a run and execute its start command."""
        self.create(workflow, input, run_id)
        result = self.run(run_id)
        assert result is not None, f"{self.name}: a fresh run was not started"
        return result

    @abstractmethod
    def run(
        self,
        run_id: str = RUN,
        *,
        die_after: DieAfter | None = None,
        cancel: CancellationSignal | None = None,
    ) -> ExecutionResult | None:
        """Execute the next command of ``run_id`` to its end (park or terminal status)."""

    def crash(
        self, run_id: str = RUN, *, after: type | None = None, path: str | None = None
    ) -> None:
        """Run the next command and let its runner die (after a committed ``after`` message, or
        where workflow code raises :class:`Crash`); the server then handles the exit."""
        with pytest.raises(Crash):
            self.run(run_id, die_after=None if after is None else DieAfter(after, path))
        self._runner_died(run_id)

    def refuse(self, command: RunCommand, workflow: CompiledWorkflow | None = None) -> str:
        """Execute ``command`` (for ``workflow``, default the run's) expecting the engine to
        refuse it with :class:`RunCommandError` before it proposes anything.

        Returns the refusal text. The port the engine gets can only read, and any proposal
        would be recorded, so a refusal after a change cannot pass.
        """
        before = len(self.calls)
        port = RecordingPort(self._reader(), self.calls, None)
        chosen = workflow or self.workflows[command.run_id]
        with pytest.raises(RunCommandError) as refused:
            execute(command, chosen, port, clock=self.clock)
        assert self.calls[before:] == [], "the engine proposed a change before refusing"
        return str(refused.value)

    @contextmanager
    def direct(self, run_id: str = RUN) -> Iterator[RecordingPort]:
        """A port to propose messages by hand, as the runner of the run's next command would.

        On the store this is a launched runner under its own claim, whose exit the server
        records afterwards; on the memory port it is the port itself.
        """
        with self._direct(run_id) as delegate:
            yield RecordingPort(delegate, self.calls, None)

    # Operators and answers -----------------------------------------------------------------

    @abstractmethod
    def answer(self, request_id: str, answer: JsonValue) -> None:
        """A person answers the checkpoint or decision ``request_id``."""

    @abstractmethod
    def expire(self, request_id: str) -> None:
        """The deadline of decision ``request_id`` passes with nobody answering."""

    @abstractmethod
    def resolve_applied(self, run_id: str, effect_key: str) -> None:
        """An operator saw the ambiguous effect apply; the run may go on."""

    @abstractmethod
    def restart(self, parent_run_id: str, run_id: str) -> None:
        """Queue a restart of the terminal run ``parent_run_id`` as ``run_id``."""

    # What the port stored ------------------------------------------------------------------

    def saved(self, run_id: str = RUN) -> p.SavedRun:
        """The saved run as the engine reads it at the start of a command."""
        saved = self._reader().read_run(run_id)
        assert saved is not None, f"{self.name}: run {run_id} does not exist"
        return saved  # type: ignore[no-any-return]

    def sent(self, kind: type[M], path: str | None = None) -> list[M]:
        """Every message of ``kind`` the engine proposed (for ``path``), in order."""
        return [
            call.message
            for call in self.calls
            if isinstance(call.message, kind)
            and path in (None, getattr(call.message, "path", None))
        ]

    def results(self, kind: type) -> list[p.PortResult]:
        """The typed results the port gave to messages of ``kind``, in order."""
        return [call.result for call in self.calls if isinstance(call.message, kind)]

    @abstractmethod
    def effects(self, run_id: str = RUN) -> list[EffectView]:
        """The run's managed effects, ordered by key."""

    @abstractmethod
    def notifications(self, run_id: str = RUN) -> list[NotificationView]:
        """The run's notifications, ordered by (path, visit)."""

    @abstractmethod
    def requests(self, run_id: str = RUN) -> list[RequestView]:
        """Every request the run opened, ordered by (path, visit)."""

    @abstractmethod
    def updates(self, run_id: str = RUN) -> dict[tuple[str, str], JsonValue]:
        """The latest update data per (type, key) of the run's attempts."""

    def effect(self, run_id: str = RUN) -> EffectView:
        """The run's one managed effect."""
        (only,) = self.effects(run_id)
        return only

    # Differences -----------------------------------------------------------------------------

    @abstractmethod
    def _create(self, workflow: CompiledWorkflow, input: JsonValue, run_id: str) -> None: ...

    @abstractmethod
    def _runner_died(self, run_id: str) -> None: ...

    @abstractmethod
    def _direct(self, run_id: str) -> AbstractContextManager[Any]: ...

    @abstractmethod
    def _reader(self) -> Any:
        """A port that can read runs; it must never be asked to write."""

    @abstractmethod
    def check(self) -> None:
        """Invariants that must hold at the end of every test on this port."""


class MemoryUnderTest(PortUnderTest):
    """``piwf.workflow.memory.MemoryPort``: no server, no claims, nothing durable."""

    name = "memory"

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.port = MemoryPort()

    def _create(self, workflow: CompiledWorkflow, input: JsonValue, run_id: str) -> None:
        self.port.create_run(run_id, input, definition_digest=workflow.digest)

    def run(
        self,
        run_id: str = RUN,
        *,
        die_after: DieAfter | None = None,
        cancel: CancellationSignal | None = None,
    ) -> ExecutionResult | None:
        saved = self.saved(run_id)
        command: RunCommand
        if not saved.fresh:
            command = ResumeCommand(run_id)
        elif saved.lineage is p.Lineage.RESTART:
            assert saved.parent_run_id is not None
            command = RestartCommand(run_id, saved.parent_run_id)
        else:
            command = StartCommand(run_id)
        port = RecordingPort(self.port, self.calls, die_after)
        return execute(command, self.workflows[run_id], port, clock=self.clock, cancel=cancel)

    def _runner_died(self, run_id: str) -> None:
        """Nothing happens: the port keeps what the dead runner left."""

    @contextmanager
    def _direct(self, run_id: str) -> Iterator[Any]:
        yield self.port

    def _reader(self) -> Any:
        return self.port

    def check(self) -> None:
        # What the port accepted could cross a transport as it is: canonical JSON only.
        for message in self.port.messages:
            canonical.encode(p.message_to_json(message))

    def answer(self, request_id: str, answer: JsonValue) -> None:
        self.port.answer(request_id, answer)

    def expire(self, request_id: str) -> None:
        self.port.expire_request(request_id)

    def resolve_applied(self, run_id: str, effect_key: str) -> None:
        self.port.resolve_effect(effect_key, p.EffectOutcome.APPLIED)

    def restart(self, parent_run_id: str, run_id: str) -> None:
        self.workflows[run_id] = self.workflows[parent_run_id]
        self.port.create_restart(parent_run_id, run_id)

    def effects(self, run_id: str = RUN) -> list[EffectView]:
        return sorted(
            (
                EffectView(
                    key=record.key,
                    effect_type=record.effect_type,
                    recovery=record.recovery.value,
                    status=record.status.value,
                    attempts=record.attempts,
                    result=record.result,
                    error=record.error,
                )
                for record in self.port.effects_of(run_id)
            ),
            key=lambda view: view.key,
        )

    def notifications(self, run_id: str = RUN) -> list[NotificationView]:
        return sorted(
            (
                NotificationView(n.notification_id, n.path, n.visit, n.kind.value, n.message)
                for n in self.port.notifications.values()
                if n.run_id == run_id
            ),
            key=lambda view: (view.path, view.visit),
        )

    def requests(self, run_id: str = RUN) -> list[RequestView]:
        return sorted(
            (
                RequestView(r.request_id, r.path, r.visit, r.kind.value, r.content, r.on_timeout)
                for r in self.port.requests.values()
                if r.run_id == run_id
            ),
            key=lambda view: (view.path, view.visit),
        )

    def updates(self, run_id: str = RUN) -> dict[tuple[str, str], JsonValue]:
        return {
            (update_type, key): message.data
            for (owner, update_type, key), message in self.port.updates.items()
            if owner == run_id
        }


_NOTIFICATIONS = """
SELECT n.notification_id, n.node_path, n.visit, n.kind, b.content FROM run_notifications n
JOIN blobs b ON b.blob_hash = n.message_hash WHERE n.run_id = ? ORDER BY n.node_path, n.visit
"""
_REQUESTS = """
SELECT r.request_id, a.node_path, a.visit, r.kind, r.content_hash, r.on_timeout_hash
FROM interactive_requests r JOIN node_attempts a ON a.attempt_id = r.attempt_id
WHERE r.run_id = ? ORDER BY a.node_path, a.visit
"""
_UPDATES = """
SELECT u.update_type, u.update_key, u.data_hash FROM workflow_updates u
JOIN node_attempts a ON a.attempt_id = u.attempt_id WHERE a.run_id = ?
ORDER BY a.rowid, u.update_seq
"""


class StoreUnderTest(PortUnderTest):
    """The server's path: the execution store on a real SQLite file, behind runner receipts."""

    name = "store"

    def __init__(self, clock: FakeClock, db: StateDatabase) -> None:
        super().__init__(clock)
        self.db = db
        self._launched: dict[str, ex.RunLaunch] = {}
        self._submissions = itertools.count(1)

    def _create(self, workflow: CompiledWorkflow, input: JsonValue, run_id: str) -> None:
        create(self.db, workflow, run_id, input)

    def run(
        self,
        run_id: str = RUN,
        *,
        die_after: DieAfter | None = None,
        cancel: CancellationSignal | None = None,
    ) -> ExecutionResult | None:
        others = tuple(other for other in self.workflows if other != run_id)
        launched = launch_if_runnable(self.db, exclude=others)
        if launched is None:
            return None
        assert launched.run_id == run_id
        self._launched[run_id] = launched
        port = RecordingPort(StorePort(self.db, launched), self.calls, die_after)
        result = execute(
            command_for(launched), self.workflows[run_id], port, clock=self.clock, cancel=cancel
        )
        # The runner exits after its command; the server records that and decides nothing new.
        decided = exit_and_recover(self.db, launched, RunnerStatus.EXITED)
        assert decided.decision is ex.RecoveryDecision.UNCHANGED, decided
        return result

    def _runner_died(self, run_id: str) -> None:
        exit_and_recover(self.db, self._launched[run_id], RunnerStatus.CRASHED)

    @contextmanager
    def _direct(self, run_id: str) -> Iterator[Any]:
        others = tuple(other for other in self.workflows if other != run_id)
        launched = launch_if_runnable(self.db, exclude=others)
        assert launched is not None and launched.run_id == run_id, "the run is not runnable"
        try:
            yield StorePort(self.db, launched)
        finally:
            exit_and_recover(self.db, launched, RunnerStatus.EXITED)

    def _reader(self) -> Any:
        return _StoreReader(self.db)

    def answer(self, request_id: str, answer: JsonValue) -> None:
        with self.db.write() as tx:
            answered = ex.answer_request(
                tx,
                request_id,
                answer,
                source=SubmissionSource.HUMAN,
                actor=OPERATOR,
                submission_id=f"human:{next(self._submissions)}",
            )
        assert isinstance(answered, StateApplied), answered
        assert answered.value.outcome is SubmissionOutcome.WON, answered.value

    def expire(self, request_id: str) -> None:
        (request,) = [
            r
            for run_id in self.workflows
            for r in self.requests(run_id)
            if r.request_id == request_id
        ]
        assert isinstance(request.on_timeout, dict)
        after_ms = request.on_timeout["afterMs"]
        assert isinstance(after_ms, int)
        self.clock.advance(after_ms)
        with self.db.write() as tx:
            settled = ex.expire_due_decisions(
                tx, actor=SERVER, control_owner_id=SERVER_ID, lease_ms=LEASE_MS
            )
        assert [outcome.request_id for outcome in settled] == [request_id]

    def resolve_applied(self, run_id: str, effect_key: str) -> None:
        with self.db.write() as tx:
            (effect,) = [
                e for e in fx.list_effects(tx, f"run:{run_id}") if e.idempotency_key == effect_key
            ]
            resolved = fx.resolve_ambiguous(
                tx, effect.effect_id, resolution="applied", actor=OPERATOR
            )
        assert isinstance(resolved, StateApplied), resolved
        with self.db.write() as tx:
            resumed = ex.resume_run(tx, run_id, actor=OPERATOR)
        assert isinstance(resumed, StateApplied), resumed

    def restart(self, parent_run_id: str, run_id: str) -> None:
        self.workflows[run_id] = self.workflows[parent_run_id]
        with self.db.write() as tx:
            restarted = ex.restart_run(tx, parent_run_id, new_run_id=run_id, actor=OPERATOR)
        assert isinstance(restarted, StateApplied), restarted

    def effects(self, run_id: str = RUN) -> list[EffectView]:
        with self.db.read() as tx:
            return sorted(
                (
                    EffectView(
                        key=effect.idempotency_key,
                        effect_type=effect.effect_type,
                        recovery=effect.recovery.value,
                        status=effect.status.value,
                        attempts=effect.attempt_count,
                        result=None
                        if effect.result_hash is None
                        else blobs.read_json(tx, effect.result_hash),
                        error=None
                        if effect.error_hash is None
                        else blobs.read_text(tx, effect.error_hash),
                    )
                    for effect in fx.list_effects(tx, f"run:{run_id}")
                ),
                key=lambda view: view.key,
            )

    def notifications(self, run_id: str = RUN) -> list[NotificationView]:
        with self.db.read() as tx:
            rows = tx.all(_NOTIFICATIONS, (run_id,))
        return [
            NotificationView(row[0], row[1], row[2], row[3], bytes(row[4]).decode()) for row in rows
        ]

    def requests(self, run_id: str = RUN) -> list[RequestView]:
        with self.db.read() as tx:
            return [
                RequestView(
                    request_id=row[0],
                    path=row[1],
                    visit=row[2],
                    kind=row[3],
                    content=blobs.read_json(tx, bytes(row[4])),
                    on_timeout=None if row[5] is None else blobs.read_json(tx, bytes(row[5])),
                )
                for row in tx.all(_REQUESTS, (run_id,))
            ]

    def updates(self, run_id: str = RUN) -> dict[tuple[str, str], JsonValue]:
        with self.db.read() as tx:
            return {
                (row[0], row[1]): blobs.read_json(tx, bytes(row[2]))
                for row in tx.all(_UPDATES, (run_id,))
            }

    def check(self) -> None:
        assert violations(self.db) == []


class _StoreReader:
    """Reads saved runs the way :class:`StorePort` does, without a runner behind it."""

    def __init__(self, db: StateDatabase) -> None:
        self.db = db

    def read_run(self, run_id: str) -> p.SavedRun | None:
        with self.db.read() as tx:
            return ex.read_saved_run(tx, run_id)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the engine tried to {name} through a read-only port")
