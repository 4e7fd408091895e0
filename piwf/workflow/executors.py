"""One node visit, per node kind, proposing its durable changes through the port.

======================  ==================================================================
kind                    visit
======================  ==================================================================
compute                 call ``run``; the output must be JSON
action / shell          compute the request, reserve the effect, then (only when the
                        reservation is new or was returned to pending) run and settle it;
                        an adopted settled effect gives its stored result without running
notify                  propose the notification under the visit's stable id
checkpoint / decision   commit the request and park ``waiting``; the answer (in a later
/ agent                 command) becomes the output; an agent's answer is a submission its
                        ``validate`` accepted outside the runner (:mod:`.validation`)
agent (headless)        commit the request, then hand it to the injected agent driver
                        (:mod:`piwf.workflow.agent_driver`); park only when it has nothing
                        to run
======================  ==================================================================

Uncertain endings of a managed effect (deadline passed, output not JSON) settle an idempotent
effect ``rejected`` (a later visit retries under a new key) and a manual effect ``ambiguous``,
which parks the run ``effectAmbiguous``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from piwf.canonical import JsonValue
from piwf.errors import CanonicalJsonError, InvalidTransitionError
from piwf.lifecycle import Adopted, AnsweredBy, Applied, Conflict, InteractionKind, RecoveryRequired
from piwf.workflow import identity
from piwf.workflow.agent_driver import (
    AgentAccepted,
    AgentDriver,
    AgentExpired,
    AgentFailed,
    AgentTurn,
)
from piwf.workflow.compiler import CompiledNode
from piwf.workflow.context import NodeContext, Outcome
from piwf.workflow.contract import step_contract, with_contract
from piwf.workflow.failure import (
    FailureKind,
    NodeFailure,
    describe_error,
    exception_failure,
    exit_failure,
)
from piwf.workflow.invoke import (
    CallOutcome,
    Raised,
    Returned,
    Stopped,
    failure_outcome,
    invoke,
    to_json,
    unusable,
)
from piwf.workflow.nodes import (
    ActionNode,
    AgentNode,
    CheckpointNode,
    ComputeNode,
    HumanDecisionNode,
    NotifyNode,
    Recovery,
    ShellNode,
    TimerNode,
)
from piwf.workflow.port import (
    Committed,
    EffectOutcome,
    EffectReservation,
    EffectSettlement,
    InteractionRequested,
    NotificationRequested,
    ParkReason,
    PendingRequest,
    PortResult,
    SettledEffect,
    WorkflowPort,
)
from piwf.workflow.scopes import Frame
from piwf.workflow.shell_runner import ShellRun, resolve_invocation, run_shell

M = TypeVar("M")


@dataclass(frozen=True)
class VisitDone:
    """The visit ended with ``outcome``; ``request_id`` closes an answered request.

    A failed visit carries its one-line ``error`` and, when workflow code raised or a shell
    command exited non-zero, its ``failure`` record (the engine records every other failure
    from ``error``).
    """

    outcome: Outcome
    output: JsonValue = None
    error: str | None = None
    request_id: str | None = None
    failure: NodeFailure | None = None
    #: What workflow code raised (a retry policy's ``retry_on`` looks at it); never sent.
    exception: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def exited(self) -> bool:
        """Whether a shell command ended it by exiting non-zero (or by a signal)."""
        return self.failure is not None and self.failure.kind is FailureKind.EXIT


def raised(outcome: Outcome, error: Exception, context: str = "") -> VisitDone:
    """The visit whose workflow code raised ``error`` (``context`` prefixes the error text)."""
    return VisitDone(
        outcome,
        error=context + describe_error(error),
        failure=exception_failure(error, outcome),
        exception=error,
    )


@dataclass(frozen=True)
class VisitParked:
    """The visit stays open and the run parks for ``reason``."""

    reason: ParkReason
    request_id: str | None = None
    detail: str | None = None
    wake_at_ms: int | None = None


VisitOutcome: TypeAlias = VisitDone | VisitParked


class PortGate:
    """Serialises port calls and remembers the first error the port raised.

    Workflow code can call the port (``ctx.publish_update``) and may swallow what it raises;
    the engine calls :meth:`raise_if_failed` after every callback so loss of authority always
    stops the run.
    """

    def __init__(self, port: WorkflowPort) -> None:
        self.port = port
        self._lock = threading.Lock()
        self._failure: BaseException | None = None

    def call(self, method: Callable[[M], PortResult], message: M) -> PortResult:
        """Send ``message``; return the port's typed result."""
        with self._lock:
            try:
                return method(message)
            except BaseException as error:
                self._failure = self._failure or error
                raise

    def expect(self, method: Callable[[M], PortResult], message: M) -> PortResult:
        """Send ``message``; raise :class:`InvalidTransitionError` unless applied or adopted."""
        result = self.call(method, message)
        if isinstance(result, (Applied, Adopted)):
            return result
        detail = result.evidence if isinstance(result, Conflict) else result.reason
        error = InvalidTransitionError(f"port refused {type(message).__name__}: {detail}")
        with self._lock:
            self._failure = self._failure or error
        raise error

    def raise_if_failed(self) -> None:
        """Re-raise the first port error seen during the command, if any."""
        if self._failure is not None:
            raise self._failure


class VisitExecutor:
    """Executes node visits of one run against one port gate."""

    def __init__(
        self,
        gate: PortGate,
        run_id: str,
        workflow_name: str,
        agents: AgentDriver | None = None,
        *,
        interactive: bool = False,
    ) -> None:
        self.gate = gate
        self.port = gate.port
        self.run_id = run_id
        #: Named in the step contract of every agent prompt.
        self.workflow_name = workflow_name
        #: Fulfils agent requests (a headless agent command); None: agent visits park.
        self.agents = agents
        #: The run belongs to an origin session: its steps are submitted through it.
        self.interactive = interactive

    def start(
        self,
        node: CompiledNode,
        ctx: NodeContext,
        frame: Frame,
        timeout_ms: int | None,
        *,
        try_number: int = 1,
    ) -> VisitOutcome:
        """Run a new visit, a crash retry or a retry policy's next try of ``node``.

        ``timeout_ms`` is the resolved node timeout: a limit on the node's code, except for an
        agent, whose request carries it as its active-time budget (the server enforces it).
        ``try_number`` names the retry policy's try (each try of an action is its own effect).
        A timer visit never comes here: the engine parks it on its wake time.
        """
        spec = node.node
        match spec:
            case ComputeNode():
                call = invoke(lambda: spec.run(ctx), timeout_ms=timeout_ms, signal=ctx.signal)
                return self._output(call, ctx, timeout_ms)
            case ActionNode() | ShellNode():
                return self._effect(spec, ctx, frame, timeout_ms, try_number)
            case TimerNode():
                raise AssertionError("a timer visit is the engine's, not an executor's")
            case NotifyNode():
                return self._notify(spec, ctx)
            case CheckpointNode() | HumanDecisionNode() | AgentNode():
                return self._request(spec, ctx, timeout_ms)

    def answer(self, node: CompiledNode, ctx: NodeContext, pending: PendingRequest) -> VisitOutcome:
        """Consume the answer of the visit's pending request (or park again without one).

        An unanswered agent request goes to the agent driver again (a resumed turn)."""
        if not pending.answered:
            if isinstance(node.node, AgentNode) and pending.kind is InteractionKind.AGENT:
                driven = self._drive(node.node, ctx, pending.request_id, pending.content, True)
                if driven is not None:
                    return driven
            return VisitParked(ParkReason.WAITING, pending.request_id)
        if pending.answered_by is AnsweredBy.EXPIRED:
            error = (
                f"agent request {pending.request_id} reached its active-time deadline"
                if pending.kind is InteractionKind.AGENT
                else f"decision {pending.request_id} expired with no default response"
            )
            return VisitDone(Outcome.TIMED_OUT, error=error, request_id=pending.request_id)
        if pending.answered_by is AnsweredBy.UNPRODUCTIVE:
            error = (
                f"missingSubmission: agent request {pending.request_id}: its session ended"
                " its turns without submitting (two reminders were sent)"
            )
            return VisitDone(Outcome.FAILED, error=error, request_id=pending.request_id)
        # An agent's answer is its accepted submission: ``validate`` already ran on it, in a
        # validation child (the server) or in-process (the memory port), never here.
        return VisitDone(Outcome.OK, pending.answer, request_id=pending.request_id)

    def _output(self, call: CallOutcome, ctx: NodeContext, timeout_ms: int | None) -> VisitDone:
        self.gate.raise_if_failed()
        match call:
            case Returned(value=value):
                try:
                    return VisitDone(Outcome.OK, to_json(value))
                except CanonicalJsonError as error:
                    return VisitDone(Outcome.FAILED, error=unusable("output", error))
            case Raised(error=error):
                return raised(failure_outcome(ctx.signal), error)
            case Stopped(outcome=outcome):
                return VisitDone(outcome, error=f"timed out after {timeout_ms} ms")

    def _effect(
        self,
        spec: ActionNode | ShellNode,
        ctx: NodeContext,
        frame: Frame,
        timeout_ms: int | None,
        try_number: int,
    ) -> VisitOutcome:
        try:
            raw = (
                spec.request(ctx)
                if spec.request is not None
                else {"input": frame.raw_input, "outputs": dict(frame.outputs)}
            )
            request = to_json(raw)
        except CanonicalJsonError as error:
            return VisitDone(Outcome.FAILED, error=unusable("effect request", error))
        except Exception as error:
            self.gate.raise_if_failed()
            return raised(Outcome.FAILED, error, "effect request failed: ")
        key = identity.effect_key(self.run_id, spec.effect.type, ctx.path, ctx.visit, try_number)
        reservation = EffectReservation(
            run_id=self.run_id,
            path=ctx.path,
            visit=ctx.visit,
            effect_key=key,
            effect_type=spec.effect.type,
            recovery=spec.effect.recovery,
            request=request,
            request_fingerprint=identity.request_fingerprint(request),
        )
        match self.gate.call(self.port.reserve_effect, reservation):
            case Conflict(evidence=evidence):
                return VisitDone(
                    Outcome.FAILED,
                    error=(
                        f"managed effect {spec.effect.type!r} key was reused with another "
                        f"request ({evidence}); the action did not run"
                    ),
                )
            case RecoveryRequired():
                detail = (
                    f"effect {spec.effect.type!r} may or may not have been applied: an earlier"
                    " attempt of this visit stopped while its action ran"
                )
                return VisitParked(ParkReason.EFFECT_AMBIGUOUS, detail=detail)
            case Adopted(Committed(settled=SettledEffect() as settled)):
                return self._adopt(spec, settled)
            case Applied() | Adopted():
                pass
        if isinstance(spec, ActionNode):
            return self._run_action(spec, ctx, key, timeout_ms)
        return self._run_shell(spec, ctx, key, timeout_ms)

    def _run_action(
        self, spec: ActionNode, ctx: NodeContext, key: str, timeout_ms: int | None
    ) -> VisitOutcome:
        call = invoke(lambda: spec.run(ctx), timeout_ms=timeout_ms, signal=ctx.signal)
        self.gate.raise_if_failed()
        match call:
            case Returned(value=value):
                try:
                    output = to_json(value)
                except CanonicalJsonError as error:
                    return self._uncertain(spec, key, Outcome.FAILED, unusable("output", error))
                self._settle(key, EffectOutcome.APPLIED, output)
                return VisitDone(Outcome.OK, output)
            case Raised(error=error):
                done = raised(failure_outcome(ctx.signal), error)
                self._settle(key, EffectOutcome.REJECTED, None, done.error)
                return done
            case Stopped(outcome=outcome):
                return self._uncertain(spec, key, outcome, f"timed out after {timeout_ms} ms")

    def _run_shell(
        self, spec: ShellNode, ctx: NodeContext, key: str, timeout_ms: int | None
    ) -> VisitOutcome:
        try:
            invocation = resolve_invocation(spec, ctx)
        except Exception as error:
            self.gate.raise_if_failed()
            done = raised(Outcome.FAILED, error, "shell command could not be resolved: ")
            self._settle(key, EffectOutcome.REJECTED, None, done.error)
            return done
        try:
            run = run_shell(
                invocation,
                node_timeout_ms=timeout_ms,
                max_output_chars=spec.max_output_chars,
                signal=ctx.signal,
            )
        except OSError as error:
            text = f"cannot start {invocation.command!r}: {error.strerror or error}"
            self._settle(key, EffectOutcome.REJECTED, None, text)
            return VisitDone(Outcome.FAILED, error=text)
        if run.stopped is not None:
            verb = "timed out" if run.stopped is Outcome.TIMED_OUT else "was cancelled"
            return self._uncertain(spec, key, run.stopped, f"{invocation.command!r} {verb}")
        code = run.result["exit_code"]
        if code != 0 and not spec.allow_nonzero_exit:
            done = _exit_failed(invocation.command, run)
            self._settle(key, EffectOutcome.REJECTED, run.result, done.error)
            return done
        self._settle(key, EffectOutcome.APPLIED, run.result)
        return self._parsed(spec, run.result)

    def _adopt(self, spec: ActionNode | ShellNode, settled: SettledEffect) -> VisitOutcome:
        if settled.outcome is EffectOutcome.APPLIED:
            if isinstance(spec, ShellNode):
                return self._parsed(spec, settled.result)
            return VisitDone(Outcome.OK, settled.result)
        if settled.outcome is EffectOutcome.AMBIGUOUS:
            return VisitParked(ParkReason.EFFECT_AMBIGUOUS, detail=settled.error)
        return VisitDone(Outcome.FAILED, error=settled.error or "the effect was rejected")

    def _parsed(self, spec: ShellNode, result: JsonValue) -> VisitDone:
        if spec.parse is None:
            return VisitDone(Outcome.OK, result)
        parse = spec.parse
        try:
            return VisitDone(Outcome.OK, to_json(parse(result)))
        except CanonicalJsonError as error:
            return VisitDone(Outcome.FAILED, error=unusable("the value parse returned", error))
        except Exception as error:
            self.gate.raise_if_failed()
            return raised(Outcome.FAILED, error, "parse failed: ")

    def _uncertain(
        self, spec: ActionNode | ShellNode, key: str, outcome: Outcome, text: str
    ) -> VisitOutcome:
        if spec.effect.recovery is Recovery.MANUAL:
            self._settle(key, EffectOutcome.AMBIGUOUS, None, text)
            # The park reason is what `run wait`, `run show` and `run explain` print: it says
            # which effect is in doubt, not only that something timed out.
            detail = f"effect {spec.effect.type!r} may or may not have been applied: {text}"
            return VisitParked(ParkReason.EFFECT_AMBIGUOUS, detail=detail)
        self._settle(key, EffectOutcome.REJECTED, None, text)
        return VisitDone(outcome, error=text)

    def _settle(
        self, key: str, outcome: EffectOutcome, result: JsonValue, error: str | None = None
    ) -> None:
        settlement = EffectSettlement(self.run_id, key, outcome, result, error)
        self.gate.expect(self.port.settle_effect, settlement)

    def _notify(self, spec: NotifyNode, ctx: NodeContext) -> VisitOutcome:
        message_spec = spec.message
        if isinstance(message_spec, str):
            message: Any = message_spec
        else:
            call = invoke(lambda: message_spec(ctx), timeout_ms=None, signal=ctx.signal)
            self.gate.raise_if_failed()
            if isinstance(call, Raised):
                return raised(failure_outcome(ctx.signal), call.error)
            message = call.value if isinstance(call, Returned) else None
        if not isinstance(message, str):
            return VisitDone(Outcome.FAILED, error="notify message must be a string")
        notification = NotificationRequested(
            run_id=self.run_id,
            path=ctx.path,
            visit=ctx.visit,
            notification_id=identity.notification_id(self.run_id, ctx.path, ctx.visit),
            kind=spec.notify_kind,
            message=message,
        )
        self.gate.expect(self.port.notify, notification)
        return VisitDone(Outcome.OK, {"kind": spec.notify_kind.value, "message": message})

    def _request(
        self,
        spec: CheckpointNode | HumanDecisionNode | AgentNode,
        ctx: NodeContext,
        timeout_ms: int | None,
    ) -> VisitOutcome:
        request_id = identity.request_id(self.run_id, ctx.path, ctx.visit)
        try:
            kind, content = _request_content(spec, ctx)
        except CanonicalJsonError as error:
            return VisitDone(Outcome.FAILED, error=unusable("request content", error))
        except Exception as error:
            self.gate.raise_if_failed()
            return raised(failure_outcome(ctx.signal), error)
        self.gate.raise_if_failed()
        if isinstance(spec, AgentNode) and spec.assistant_max_chars is not None:
            if not self.interactive:
                headless = (
                    f"agent step {ctx.path!r} takes the session's visible reply"
                    " (assistant_message): a headless run has no session; start the run with"
                    " --session SESSION_ID"
                )
                return VisitDone(Outcome.FAILED, error=headless)
            if isinstance(content, dict):
                content["assistantMessage"] = {"maxChars": spec.assistant_max_chars}
        if isinstance(spec, AgentNode) and isinstance(content, dict):
            contract = step_contract(
                workflow=self.workflow_name,
                path=ctx.path,
                attempt_id=identity.attempt_id(self.run_id, ctx.path, ctx.visit, ctx.attempt),
                request_id=request_id,
                expected_output=spec.expected_output,
                session=self.interactive,
            )
            content["prompt"] = with_contract(str(content["prompt"]), contract)
        message = InteractionRequested(
            run_id=self.run_id,
            path=ctx.path,
            visit=ctx.visit,
            request_id=request_id,
            kind=kind,
            content=content,
            on_timeout=(
                spec.on_timeout.structure()
                if isinstance(spec, HumanDecisionNode) and spec.on_timeout
                else None
            ),
            timeout_ms=timeout_ms if isinstance(spec, AgentNode) else None,
        )
        result = self.gate.call(self.port.request_interaction, message)
        if isinstance(result, Conflict):
            return VisitDone(
                Outcome.FAILED, error=f"request {request_id} conflicts: {result.evidence}"
            )
        if isinstance(result, RecoveryRequired):
            raise InvalidTransitionError(f"port refused InteractionRequested: {result.reason}")
        if isinstance(spec, AgentNode):
            driven = self._drive(spec, ctx, request_id, content, False)
            if driven is not None:
                return driven
        return VisitParked(ParkReason.WAITING, request_id)

    def _drive(
        self, spec: AgentNode, ctx: NodeContext, request_id: str, content: JsonValue, resumed: bool
    ) -> VisitDone | None:
        """Hand the committed agent request to the driver; None when it has nothing to run."""
        if self.agents is None:
            return None
        prompt = content.get("prompt") if isinstance(content, dict) else None
        turn = AgentTurn(
            run_id=self.run_id,
            request_id=request_id,
            path=ctx.path,
            visit=ctx.visit,
            attempt=ctx.attempt,
            command=spec.command,
            prompt=prompt if isinstance(prompt, str) else "",
            resumed=resumed,
        )
        outcome = self.agents.drive(turn)
        match outcome:
            case None:
                return None
            case AgentAccepted(value=value):
                return VisitDone(Outcome.OK, value, request_id=request_id)
            case AgentExpired(detail=detail):
                return VisitDone(Outcome.TIMED_OUT, error=detail, request_id=request_id)
            case AgentFailed(error=error):
                return VisitDone(Outcome.FAILED, error=error)


def _exit_failed(command: str, run: ShellRun) -> VisitDone:
    """The visit of a shell command that exited non-zero or was killed by a signal.

    The error text names the exit code (or signal) and ends with the last lines of stderr,
    marked when earlier output was cut; the failure record carries the same tail.
    """
    code, signal = run.result["exit_code"], run.result["signal"]
    exit_code = code if isinstance(code, int) else None
    signal_name = signal if isinstance(signal, str) else None
    ended = (
        f"{command!r} exited with code {exit_code}"
        if exit_code is not None
        else f"{command!r} was killed by {signal_name}"
    )
    if not run.stderr_tail:
        text = f"{ended} (no stderr output)"
    else:
        which = "last lines of stderr, earlier output cut" if run.stderr_cut else "stderr"
        text = f"{ended}; {which}:\n{run.stderr_tail}"
    failure = exit_failure(
        ended,
        exit_code=exit_code,
        signal=signal_name,
        stderr_tail=run.stderr_tail,
        stderr_cut=run.stderr_cut,
    )
    return VisitDone(Outcome.FAILED, error=text, failure=failure)


def _request_content(
    spec: CheckpointNode | HumanDecisionNode | AgentNode, ctx: NodeContext
) -> tuple[InteractionKind, JsonValue]:
    """Return the request kind and its content (workflow code runs here)."""
    match spec:
        case CheckpointNode():
            content = to_json(spec.run(ctx)) if spec.run is not None else None
            return InteractionKind.CHECKPOINT, {"summary": spec.summary, "content": content}
        case HumanDecisionNode():
            request = to_json(spec.request(ctx)) if spec.request is not None else None
            decision: dict[str, JsonValue] = {
                "audience": spec.audience,
                "choices": dict(spec.choices),
                "request": request,
            }
            if spec.inputs:  # {choice: input}; the store keeps it with the choices
                decision["inputs"] = spec.inputs_json()
            return InteractionKind.HUMAN_DECISION, decision
        case AgentNode():
            prompt = spec.prompt if isinstance(spec.prompt, str) else spec.prompt(ctx)
            if not isinstance(prompt, str):
                raise TypeError("agent prompt must be a string")
            return InteractionKind.AGENT, {
                "prompt": prompt,
                "expectedOutput": spec.expected_output,
                "statusDetail": spec.status_detail,
            }
