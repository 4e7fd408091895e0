"""The engine: one entry point that executes one explicit run command node by node.

:func:`execute` reads the saved run from the port, checks that the command fits it with one
exhaustive ``match`` (an invalid combination raises :class:`RunCommandError` before any
workflow code runs), rebuilds the run's progress from the saved steps and then loops::

    position ── NextNode ──▶ node_started(visit+1) ─▶ visit ─┐
             ── RetryVisit ─▶ node_started(same visit, attempt+1) ─▶ visit ─┤
             ── AwaitAnswer ─▶ consume the answered request ──────────────┤
                                                                          ▼
             VisitParked ─▶ park ─▶ return waiting/parked
             VisitDone ───▶ node_finished | node_failed ─▶ route ─▶ next position
             RunEnds ─────▶ finish ─▶ return terminal status

Every durable change is a port message; the engine keeps nothing durable itself. An exception
raised by the port (for example claim loss) propagates unchanged and nothing more is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.clock import Clock, SystemClock
from piwf.errors import CanonicalJsonError, RunCommandError
from piwf.lifecycle import AnsweredBy, InteractionKind, Lineage, RunStatus
from piwf.workflow.agent_driver import AgentDriver
from piwf.workflow.commands import (
    ContinueCommand,
    RestartCommand,
    ResumeCommand,
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
from piwf.workflow.nodes import INTERACTION_NODE_TYPES, HumanDecisionNode
from piwf.workflow.port import (
    NodeFailed,
    NodeFinished,
    NodeStarted,
    ParkReason,
    PendingRequest,
    RunBegun,
    RunFinished,
    RunParked,
    SavedRun,
    UpdatePublished,
    WorkflowPort,
)
from piwf.workflow.replay import AwaitAnswer, NextNode, Position, RetryVisit, replay_saved_run
from piwf.workflow.scopes import End, Next, RunProgress, TransitionError

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


_INTERACTION_KINDS = {
    "checkpoint": InteractionKind.CHECKPOINT,
    "human_decision": InteractionKind.HUMAN_DECISION,
    "agent": InteractionKind.AGENT,
}


def assert_never(value: NoReturn) -> NoReturn:
    """Fail loudly when a ``match`` meant to be exhaustive meets an unknown case."""
    raise AssertionError(f"unhandled case: {value!r}")


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


def plan_command(command: RunCommand, workflow: CompiledWorkflow, port: WorkflowPort) -> SavedRun:
    """Return the saved run ``command`` applies to, or raise :class:`RunCommandError`.

    Only saved state is read here; no workflow callable runs.
    """
    saved = port.read_run(command.run_id)
    if saved is None:
        raise RunCommandError(f"{command.kind.value}: run {command.run_id} does not exist")
    label = f"{command.kind.value} of run {saved.run_id}"
    match command:
        case StartCommand():
            if saved.lineage is not Lineage.ROOT:
                raise RunCommandError(f"{label}: the run is a restart; send a restart command")
            if not saved.fresh:
                raise RunCommandError(
                    f"{label}: the run has already started (status {saved.status.value})"
                )
        case RestartCommand(parent_run_id=parent_run_id):
            if saved.lineage is not Lineage.RESTART or saved.parent_run_id != parent_run_id:
                raise RunCommandError(f"{label}: the run is not a restart of {parent_run_id}")
            if not saved.fresh:
                raise RunCommandError(
                    f"{label}: the run has already started (status {saved.status.value})"
                )
            _check_restart_parent(label, saved, port.read_run(parent_run_id), workflow)
        case ResumeCommand():
            if saved.status.terminal:
                raise RunCommandError(
                    f"{label}: the run is {saved.status.value}; a terminal run can only be "
                    "restarted"
                )
            if saved.fresh:
                raise RunCommandError(f"{label}: the run has not started; send start")
            if saved.status is RunStatus.WAITING and not (saved.pending and saved.pending.answered):
                raise RunCommandError(f"{label}: the run is waiting for an answer")
        case ContinueCommand(request_id=request_id):
            pending = saved.pending
            if saved.status is not RunStatus.WAITING or pending is None:
                raise RunCommandError(
                    f"{label}: the run is {saved.status.value}, not waiting on a request"
                )
            if pending.request_id != request_id:
                raise RunCommandError(
                    f"{label}: the run waits on {pending.request_id}, not {request_id}"
                )
            if not pending.answered:
                raise RunCommandError(f"{label}: request {request_id} has no answer yet")
        case _:
            assert_never(command)
    if saved.definition_digest is not None and saved.definition_digest != workflow.digest:
        raise RunCommandError(
            f"{label}: the run was started with definition {saved.definition_digest}, "
            f"not {workflow.digest}"
        )
    _check_saved_shape(label, saved, workflow)
    return saved


def _check_restart_parent(
    label: str, saved: SavedRun, parent: SavedRun | None, workflow: CompiledWorkflow
) -> None:
    if parent is None:
        raise RunCommandError(f"{label}: parent run {saved.parent_run_id} does not exist")
    if not parent.status.terminal:
        raise RunCommandError(
            f"{label}: parent run {parent.run_id} is {parent.status.value}; only a terminal "
            "run can be restarted"
        )
    if parent.definition_digest not in (None, workflow.digest):
        raise RunCommandError(f"{label}: parent run used another workflow definition")
    if parent.input != saved.input:
        raise RunCommandError(f"{label}: the restart input differs from the parent's input")


#: Who may close a protected decision: a person, its saved default, or its no-default expiry.
_DECISION_ANSWERERS = (AnsweredBy.HUMAN, AnsweredBy.TIMEOUT_POLICY, AnsweredBy.EXPIRED)


def _check_saved_shape(label: str, saved: SavedRun, workflow: CompiledWorkflow) -> None:
    for step in saved.steps:
        if step.path not in workflow.nodes:
            raise RunCommandError(f"{label}: saved step {step.path!r} is not in the definition")
    active, pending = saved.active, saved.pending
    if active is not None and active.path not in workflow.nodes:
        raise RunCommandError(f"{label}: active node {active.path!r} is not in the definition")
    if pending is None:
        return
    if active is None or (pending.path, pending.visit) != (active.path, active.visit):
        raise RunCommandError(f"{label}: request {pending.request_id} is not the active visit's")
    node = workflow.nodes[active.path].node
    if (
        not isinstance(node, INTERACTION_NODE_TYPES)
        or _INTERACTION_KINDS[node.kind.value] is not pending.kind
    ):
        raise RunCommandError(f"{label}: request {pending.request_id} does not fit its node")
    if pending.answered and isinstance(node, HumanDecisionNode):
        if pending.answered_by not in _DECISION_ANSWERERS:
            raise RunCommandError(
                f"{label}: a protected decision accepts only a human answer or its timeout policy"
            )
        if pending.answered_by is AnsweredBy.EXPIRED:
            return
        problem = node.check_answer(pending.answer)
        if problem is not None:
            raise RunCommandError(f"{label}: answer to {pending.request_id}: {problem}")


@dataclass(frozen=True)
class AnswerVisit:
    """The visit that waits on a request: its node, the context the engine gives it, the
    request."""

    node: CompiledNode
    context: NodeContext
    pending: PendingRequest


def answer_visit(
    workflow: CompiledWorkflow,
    saved: SavedRun,
    *,
    signal: CancellationSignal,
    publisher: Callable[[str, str, object], None],
) -> AnswerVisit:
    """Return the waiting visit of ``saved`` with the context the engine builds for it when it
    consumes the answer (same replay, same frame): what an agent's ``validate`` sees.

    Raises :class:`RunCommandError` when the saved run does not fit ``workflow`` or waits on no
    request, and :class:`~piwf.workflow.scopes.TransitionError` when replaying its routing fails.
    """
    label = f"validation of run {saved.run_id}"
    if saved.definition_digest is not None and saved.definition_digest != workflow.digest:
        raise RunCommandError(f"{label}: the run was started with another definition")
    _check_saved_shape(label, saved, workflow)
    progress = RunProgress(workflow, saved.run_id, saved.input)
    position, _ = replay_saved_run(workflow, progress, saved)
    if not isinstance(position, AwaitAnswer):
        raise RunCommandError(f"{label}: the run waits on no request")
    node = workflow.nodes[position.path]
    context = progress.context(node, position.visit, position.attempt, signal, publisher)
    return AnswerVisit(node, context, position.pending)


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
                    attempt = 1
                case RetryVisit(path=path, visit=visit, attempt=attempt):
                    if self.cancel.cancelled:
                        return self._finish(self._cancelled())
                    started, outcome = self._visit(progress, path, visit, attempt)
                case AwaitAnswer(path=path, visit=visit, attempt=attempt):
                    started = position.started_at_ms
                    outcome = self._answer(progress, position)
                case _:
                    assert_never(position)
            self.last_path = path
            if isinstance(outcome, VisitParked):
                return self._park(path, visit, outcome)
            position = self._complete(progress, path, visit, attempt, started, outcome)

    def _visit(
        self, progress: RunProgress, path: str, visit: int, attempt: int
    ) -> tuple[int, VisitOutcome]:
        node = self.workflow.nodes[path]
        signal = CancellationSignal(parent=self.cancel)
        publisher = _Publisher(self.gate, self.run_id, path, visit)
        ctx = progress.context(node, visit, attempt, signal, publisher)
        timeout_ms, timeout_problem = self._timeout(node, ctx)
        started = self.clock.now_ms()
        waits_for_answer = isinstance(node.node, INTERACTION_NODE_TYPES)
        deadline = None if timeout_ms is None or waits_for_answer else started + timeout_ms
        message = NodeStarted(
            run_id=self.run_id,
            path=path,
            visit=visit,
            attempt=attempt,
            kind=node.node.kind.value,
            started_at_ms=started,
            timeout_ms=timeout_ms,
            deadline_ms=deadline,
        )
        self.gate.expect(self.port.node_started, message)
        try:
            if timeout_problem is not None:
                return started, timeout_problem
            # An agent's budget is active time the server keeps: it is committed with the
            # request (no wall-clock deadline above), never a limit on code running here.
            return started, self.executor.start(node, ctx, progress.top, timeout_ms)
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
        finished = max(self.clock.now_ms(), started)
        if outcome.outcome is Outcome.OK:
            done = NodeFinished(
                self.run_id, path, visit, attempt, outcome.output, finished, outcome.request_id
            )
            self.gate.expect(self.port.node_finished, done)
        else:
            error = outcome.error or outcome.outcome.value
            failure = outcome.failure or reported_failure(outcome.outcome, error)
            failed = NodeFailed(
                self.run_id, path, visit, attempt, outcome.outcome, error, finished, failure
            )
            self.gate.expect(self.port.node_failed, failed)
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

    def _cancelled(self) -> End:
        return End(RunStatus.CANCELLED, None, "run cancelled", self.last_path)

    def _park(self, path: str, visit: int, parked: VisitParked) -> ExecutionResult:
        message = RunParked(
            self.run_id, parked.reason, path, visit, parked.request_id, parked.detail
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
        )

    def _finish(self, end: End) -> ExecutionResult:
        message = RunFinished(self.run_id, end.status, end.output, end.error, end.path)
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
