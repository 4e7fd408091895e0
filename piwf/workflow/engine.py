"""The engine: one entry point that executes one explicit run command node by node.

:func:`execute` reads the saved run from the port, checks that the command fits it with one
exhaustive ``match`` (an invalid combination raises :class:`RunCommandError` before any
workflow code runs), rebuilds the run's progress from the saved steps and then loops::

    position ── NextNode ──▶ node_started(visit+1) ─▶ visit ─┐
             ── RetryVisit ─▶ node_started(same visit, attempt+1) ─▶ visit ─┤
             ── AwaitAnswer ─▶ consume the answered request ──────────────┤
             ── AwaitWake ──▶ past the wake time: the timer ends, or the ──┤
                              retry's next try runs; before it: park timer │
                                                                          ▼
             VisitParked ─▶ park ─▶ return waiting/parked
             VisitDone ───▶ a retry policy retries it: node_failed(retry_at) ─▶ AwaitWake
                        └─▶ node_finished | node_failed ─▶ route ─▶ next position
             RunEnds ─────▶ finish ─▶ return terminal status

Every durable change is a port message; the engine keeps nothing durable itself. An exception
raised by the port (for example claim loss) propagates unchanged and nothing more is written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.clock import Clock, SystemClock
from piwf.errors import CanonicalJsonError
from piwf.lifecycle import Adopted, Applied, Conflict, RunStatus
from piwf.workflow.agent_driver import AgentDriver
from piwf.workflow.commands import (
    RestartCommand,
    RunCommand,
    StartCommand,
)
from piwf.workflow.compiler import CompiledNode, CompiledWorkflow
from piwf.workflow.context import CancellationSignal, NodeContext, NodeResult, Outcome
from piwf.workflow.executors import (
    PortGate,
    VisitDone,
    VisitExecutor,
    VisitOutcome,
    VisitParked,
)
from piwf.workflow.failure import describe_error, exception_failure, reported_failure
from piwf.workflow.invoke import to_json
from piwf.workflow.nodes import INTERACTION_NODE_TYPES, TimerNode
from piwf.workflow.planning import assert_never, plan_command
from piwf.workflow.port import (
    SETTINGS_CHANGED,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    ParkReason,
    RunBegun,
    RunFinished,
    RunParked,
    SavedRun,
    SettingsCopy,
    UpdatePublished,
    WorkflowPort,
)
from piwf.workflow.replay import (
    AwaitAnswer,
    AwaitWake,
    NextNode,
    Position,
    RetryVisit,
    replay_saved_run,
)
from piwf.workflow.retries import RetryPolicy
from piwf.workflow.scopes import End, InputRejectedError, Next, RunProgress, TransitionError
from piwf.workflow.timers import resolve_wake_at, timer_output

MAX_UPDATE_BYTES = 64 * 1024
MAX_UPDATE_NAME_CHARS = 256


@dataclass(frozen=True)
class ExecutionResult:
    """How one command ended: a terminal status, ``waiting`` or ``parked``.

    ``request_id`` names the request a ``waiting`` run needs answered; ``detail`` says why a
    run parked or why an answer was refused.
    """

    run_id: str
    status: RunStatus
    output: JsonValue = None
    error: str | None = None
    path: str | None = None
    request_id: str | None = None
    park_reason: ParkReason | None = None
    detail: str | None = None
    #: When a run parked on a timer wakes (a ``sleep`` or a retry's back-off).
    wake_at_ms: int | None = None


def execute(
    command: RunCommand,
    workflow: CompiledWorkflow,
    port: WorkflowPort,
    *,
    clock: Clock | None = None,
    cancel: CancellationSignal | None = None,
    agents: AgentDriver | None = None,
    interactive: bool = False,
) -> ExecutionResult:
    """Execute ``command`` for ``workflow`` through ``port`` until the run parks or ends.

    Raises :class:`RunCommandError` (before any workflow code runs) when the command does not
    fit the saved run. ``cancel`` is a run-level signal: once set, the running node sees it on
    ``ctx.signal`` and no further node starts; the run finishes ``cancelled``. ``agents``
    fulfils agent requests once they are committed (a headless agent command); without it an
    agent visit parks ``waiting``. ``interactive``: the run belongs to an origin session, so
    an agent step's contract tells the model to submit through that session.
    """
    saved = plan_command(command, workflow, port)
    run = _Execution(
        workflow,
        port,
        saved.run_id,
        clock or SystemClock(),
        cancel or CancellationSignal(),
        agents,
        interactive=interactive,
    )
    return run.execute(command, saved)


class _Execution:
    """The node loop of one command."""

    def __init__(
        self,
        workflow: CompiledWorkflow,
        port: WorkflowPort,
        run_id: str,
        clock: Clock,
        cancel: CancellationSignal,
        agents: AgentDriver | None,
        *,
        interactive: bool = False,
    ) -> None:
        self.workflow = workflow
        self.port = port
        self.gate = PortGate(port)
        self.executor = VisitExecutor(
            self.gate, run_id, workflow.definition.name, agents, interactive=interactive
        )
        self.run_id = run_id
        self.clock = clock
        self.cancel = cancel
        self.last_path: str | None = None

    def execute(self, command: RunCommand, saved: SavedRun) -> ExecutionResult:
        fresh = isinstance(command, (StartCommand, RestartCommand))
        title = self._title(saved.input) if fresh else None
        begun = RunBegun(self.run_id, command.kind, self.workflow.digest, title)
        self.gate.expect(self.port.begin_run, begun)
        try:
            progress = RunProgress(self.workflow, self.run_id, saved.input)
        except InputRejectedError as error:
            return self._finish(End(RunStatus.FAILED, None, str(error), None, input_rejected=True))
        try:
            position = self._replay(progress, saved)
        except TransitionError as error:
            return self._finish(End(RunStatus.FAILED, None, str(error), self.last_path))
        return self._loop(progress, position)

    def _title(self, raw_input: JsonValue) -> str:
        title = self.workflow.definition.title
        if isinstance(title, str):
            return title
        if title is None:
            return self.workflow.definition.name
        # Presentation must never block execution: a failing title falls back to the name.
        try:
            value = title(raw_input)
        except Exception:
            return self.workflow.definition.name
        return value if isinstance(value, str) else self.workflow.definition.name

    def _replay(self, progress: RunProgress, saved: SavedRun) -> Position:
        """Rebuild frames from the saved steps and return where execution continues."""
        position, self.last_path = replay_saved_run(self.workflow, progress, saved)
        return position

    def _loop(self, progress: RunProgress, position: Position) -> ExecutionResult:
        while True:
            match position:
                case End():
                    return self._finish(position)
                case NextNode(path=path):
                    if self.cancel.cancelled:
                        return self._finish(self._cancelled())
                    problem = progress.limit_problem(path)
                    if problem is not None:
                        return self._finish(End(RunStatus.FAILED, None, problem, self.last_path))
                    visit = progress.next_visit(path)
                    progress.count_visit(path, visit)
                    started, outcome = self._visit(progress, path, visit, 1)
                    attempt, failed_tries = 1, 0
                case RetryVisit(path=path, visit=visit, attempt=attempt):
                    if self.cancel.cancelled:
                        return self._finish(self._cancelled())
                    failed_tries = position.failed_tries
                    started, outcome = self._visit(progress, path, visit, attempt, failed_tries)
                case AwaitAnswer(path=path, visit=visit, attempt=attempt):
                    started, failed_tries = position.started_at_ms, 0
                    outcome = self._answer(progress, position)
                case AwaitWake(path=path, visit=visit, attempt=attempt):
                    if self.cancel.cancelled:
                        return self._finish(self._cancelled())
                    failed_tries = position.failed_tries
                    started, outcome = self._wake(progress, position)
                case _:
                    assert_never(position)
            self.last_path = path
            if isinstance(outcome, VisitParked):
                return self._park(path, visit, outcome)
            retry_at = self._retry_at(path, outcome, failed_tries + 1)
            if retry_at is not None:
                self._fail(path, visit, attempt, started, outcome, retry_at)
                position = AwaitWake(path, visit, attempt + 1, started, retry_at, failed_tries + 1)
                continue
            position = self._complete(progress, path, visit, attempt, started, outcome)

    def _wake(self, progress: RunProgress, position: AwaitWake) -> tuple[int, VisitOutcome]:
        """A visit waiting on its wake time: park again before it; after it, a timer ends and
        a retry's pending attempt runs the next try."""
        now = self.clock.now_ms()
        if now < position.wake_at_ms:
            return position.started_at_ms, VisitParked(
                ParkReason.TIMER, wake_at_ms=position.wake_at_ms
            )
        if isinstance(self.workflow.nodes[position.path].node, TimerNode):
            output = timer_output(position.wake_at_ms, now)
            return position.started_at_ms, VisitDone(Outcome.OK, output)
        return self._visit(
            progress, position.path, position.visit, position.attempt, position.failed_tries
        )

    def _retry_at(self, path: str, outcome: VisitDone, failed_try: int) -> int | None:
        """When the next try of a failed visit starts, or None when its policy (if any) ends
        here. A cancelled run never retries."""
        policy: RetryPolicy | None = getattr(self.workflow.nodes[path].node, "retry", None)
        if policy is None or self.cancel.cancelled or outcome.outcome is Outcome.OK:
            return None
        if not policy.retries(failed_try, outcome.outcome, outcome.exception, outcome.exited):
            return None
        return self.clock.now_ms() + policy.delay_ms(failed_try)

    def _visit(
        self, progress: RunProgress, path: str, visit: int, attempt: int, failed_tries: int = 0
    ) -> tuple[int, VisitOutcome]:
        node = self.workflow.nodes[path]
        signal = CancellationSignal(parent=self.cancel)
        publisher = _Publisher(self.gate, self.run_id, path, visit)
        ctx = progress.context(node, visit, attempt, signal, publisher)
        timeout_ms, problem = self._timeout(node, ctx)
        started = self.clock.now_ms()
        wake_at = None
        if isinstance(node.node, TimerNode) and problem is None:
            try:
                wake_at = resolve_wake_at(node.node, ctx, started)
            except ValueError as error:
                problem = VisitDone(Outcome.FAILED, error=str(error))
        waits_for_answer = isinstance(node.node, INTERACTION_NODE_TYPES)
        deadline = None if timeout_ms is None or waits_for_answer else started + timeout_ms
        scope = progress.settings_scope()
        if isinstance(scope, str):
            problem, scope = problem or VisitDone(Outcome.FAILED, error=scope), None
        message = NodeStarted(
            run_id=self.run_id,
            path=path,
            visit=visit,
            attempt=attempt,
            kind=node.node.kind.value,
            started_at_ms=started,
            timeout_ms=timeout_ms,
            deadline_ms=deadline,
            wake_at_ms=wake_at,
            settings=scope,
        )
        started_result = self.gate.expect(self.port.node_started, message)
        if scope is not None:
            given = (
                started_result.value.settings
                if isinstance(started_result, (Applied, Adopted))
                else None
            )
            progress.top.settings = given or SettingsCopy(0, scope.initial)
            ctx = dataclasses.replace(ctx, settings=progress.settings_value())
        try:
            if problem is not None:
                return started, problem
            if wake_at is not None:
                return self._wake(progress, AwaitWake(path, visit, attempt, started, wake_at))
            # An agent's budget is active time the server keeps: it is committed with the
            # request (no wall-clock deadline above), never a limit on code running here.
            try_number = failed_tries + 1
            outcome = self.executor.start(
                node, ctx, progress.top, timeout_ms, try_number=try_number
            )
            return started, outcome
        finally:
            publisher.close()
            signal.detach()
            self.gate.raise_if_failed()

    def _answer(self, progress: RunProgress, position: AwaitAnswer) -> VisitOutcome:
        node = self.workflow.nodes[position.path]
        signal = CancellationSignal(parent=self.cancel)
        publisher = _Publisher(self.gate, self.run_id, position.path, position.visit)
        ctx = progress.context(node, position.visit, position.attempt, signal, publisher)
        try:
            return self.executor.answer(node, ctx, position.pending)
        finally:
            publisher.close()
            signal.detach()
            self.gate.raise_if_failed()

    def _timeout(self, node: CompiledNode, ctx: NodeContext) -> tuple[int | None, VisitDone | None]:
        """The node's resolved timeout, or the failed visit when its callable is unusable."""
        spec = getattr(node.node, "timeout_ms", None)
        if spec is None or isinstance(spec, int):
            return spec, None
        try:
            value = spec(ctx)
        except Exception as error:
            text = f"timeout_ms callable failed: {describe_error(error)}"
            return None, VisitDone(Outcome.FAILED, error=text, failure=exception_failure(error))
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            return value, None
        text = f"timeout_ms callable returned {value!r}, not a positive integer or None"
        return None, VisitDone(Outcome.FAILED, error=text)

    def _complete(
        self,
        progress: RunProgress,
        path: str,
        visit: int,
        attempt: int,
        started: int,
        outcome: VisitDone,
    ) -> Position:
        node = self.workflow.nodes[path]
        if outcome.outcome is Outcome.OK:
            finished = max(self.clock.now_ms(), started)
            done = NodeFinished(
                self.run_id,
                path,
                visit,
                attempt,
                outcome.output,
                finished,
                outcome.request_id,
                settings_change_number=self._route_settings(progress, node),
            )
            if not self._finish_route(done):
                return RetryVisit(path, visit, attempt + 1)
        else:
            finished = self._fail(path, visit, attempt, started, outcome)
        result = NodeResult(
            node=node.node_id,
            path=path,
            kind=node.node.kind.value,
            outcome=outcome.outcome,
            visit=visit,
            started_at_ms=started,
            finished_at_ms=finished,
            output=outcome.output if outcome.outcome is Outcome.OK else None,
            error=None if outcome.outcome is Outcome.OK else (outcome.error or "failed"),
            attempt=attempt,
        )
        progress.record(node, result)
        if self.cancel.cancelled:
            return self._cancelled()
        try:
            decision = progress.advance(node, result)
        except TransitionError as error:
            return End(RunStatus.FAILED, None, str(error), path)
        return NextNode(decision.path) if isinstance(decision, Next) else decision

    @staticmethod
    def _route_settings(progress: RunProgress, node: CompiledNode) -> int | None:
        """The change a settings route chose from (its finish is kept only while newest)."""
        if getattr(node.node, "settings_route", None) is None or progress.top.settings is None:
            return None
        return progress.top.settings.change_number

    def _finish_route(self, done: NodeFinished) -> bool:
        """Send a visit's finish; False when a settings route lost to a newer change."""
        if done.settings_change_number is None:
            self.gate.expect(self.port.node_finished, done)
            return True
        result = self.gate.call(self.port.node_finished, done)
        if isinstance(result, Conflict) and result.evidence.startswith(SETTINGS_CHANGED):
            return False
        self.gate.expect(lambda _message: result, done)
        return True

    def _fail(
        self,
        path: str,
        visit: int,
        attempt: int,
        started: int,
        outcome: VisitDone,
        retry_at: int | None = None,
    ) -> int:
        """Send the failed attempt (the visit stays open for its next try with ``retry_at``);
        return its finish time."""
        finished = max(self.clock.now_ms(), started)
        error = outcome.error or outcome.outcome.value
        failure = outcome.failure or reported_failure(outcome.outcome, error)
        failed = NodeFailed(
            self.run_id,
            path,
            visit,
            attempt,
            outcome.outcome,
            error,
            finished,
            failure,
            retry_at_ms=retry_at,
        )
        self.gate.expect(self.port.node_failed, failed)
        return finished

    def _cancelled(self) -> End:
        return End(RunStatus.CANCELLED, None, "run cancelled", self.last_path)

    def _park(self, path: str, visit: int, parked: VisitParked) -> ExecutionResult:
        message = RunParked(
            self.run_id,
            parked.reason,
            path,
            visit,
            parked.request_id,
            parked.detail,
            wake_at_ms=parked.wake_at_ms,
        )
        self.gate.expect(self.port.park, message)
        status = RunStatus.WAITING if parked.reason is ParkReason.WAITING else RunStatus.PARKED
        return ExecutionResult(
            run_id=self.run_id,
            status=status,
            path=path,
            request_id=parked.request_id,
            park_reason=parked.reason,
            detail=parked.detail,
            wake_at_ms=parked.wake_at_ms,
        )

    def _finish(self, end: End) -> ExecutionResult:
        message = RunFinished(
            self.run_id, end.status, end.output, end.error, end.path, end.input_rejected
        )
        self.gate.expect(self.port.finish, message)
        return ExecutionResult(self.run_id, end.status, end.output, end.error, end.path)


class _Publisher:
    """``ctx.publish_update`` for one visit; refuses calls once the visit has ended."""

    def __init__(self, gate: PortGate, run_id: str, path: str, visit: int) -> None:
        self.gate = gate
        self.run_id = run_id
        self.path = path
        self.visit = visit
        self.open = True

    def close(self) -> None:
        self.open = False

    def __call__(self, update_type: str, key: str, data: object) -> None:
        if not self.open:
            raise RuntimeError(f"the visit of {self.path!r} has ended; publish_update refused")
        for name, value in (("update_type", update_type), ("key", key)):
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_UPDATE_NAME_CHARS:
                raise ValueError(
                    f"{name} must be a string of 1..{MAX_UPDATE_NAME_CHARS} characters"
                )
        try:
            payload = to_json(data)
        except CanonicalJsonError as error:
            raise ValueError(f"update data is not JSON: {error}") from error
        if len(canonical.encode(payload)) > MAX_UPDATE_BYTES:
            raise ValueError(f"update data is larger than {MAX_UPDATE_BYTES} bytes")
        message = UpdatePublished(self.run_id, self.path, self.visit, update_type, key, payload)
        self.gate.expect(self.gate.port.publish_update, message)
