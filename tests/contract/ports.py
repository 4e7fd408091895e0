"""The two ports the engine runs on, behind one test interface (this module holds no tests).

The contract suite runs every test twice: on the in-memory port (``memory_side``,
``piwf.workflow.memory``) and on the server's store path (``store_side``: the real
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
- **Which runner holds an effect.** The store tells by the claim generation that began the
  applying attempt, the memory port (which has no generations) by the visit attempt; the engine
  retries a crashed visit under a new generation and a new attempt at once, so both answer the
  same: ``Conflict`` while the same runner applies it, adopt or ``effectAmbiguous`` after.
- **Operators.** Resolving an ambiguous effect is ``resolve_effect`` on the memory port and
  ``effects.resolve_ambiguous`` + ``resume_run`` on the store (the store also needs the
  explicit resume that clears the park). A deadline passing is ``expire_request`` on the
  memory port and the clock passing the deadline + ``expire_due_decisions`` on the store.
- **Answers.** Checkpoints and decisions are answered on both. An agent request is settled by a
  submission validated outside the runner: on the memory port in-process (``MemoryPort.submit``,
  ``tests/workflow``), on the store by a validation child (``tests/state/test_submissions.py``,
  ``tests/server/test_submissions.py``), so agent flows are not part of this suite. The store
  checks a decision's answer against its choices when it is submitted; the memory port accepts
  any answer and the engine refuses an invalid one when the command starts
  (``tests/workflow/test_commands.py``).
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

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import pytest

from piwf.canonical import JsonValue
from piwf.clock import FakeClock
from piwf.errors import RunCommandError
from piwf.workflow import port as p
from piwf.workflow.commands import RunCommand
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.context import CancellationSignal
from piwf.workflow.engine import ExecutionResult, execute
from piwf.workflow.failure import AttemptFailure
from tests.state.test_execution_support import Crash

RUN = "run-1"
M = TypeVar("M")


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

    @abstractmethod
    def failures(self, run_id: str = RUN) -> list[AttemptFailure]:
        """The failure records of the run's failed visits, in step order."""

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
