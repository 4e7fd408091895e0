"""Node kinds of the authoring API and their effect markers.

Each factory returns a frozen node object; nothing runs until an engine executes a compiled
workflow. Factories check what they can see on their own (types, effect markers, choices,
timeouts); :func:`piwf.workflow.define_workflow` checks the graph around them.

=================  ======================================================================
kind               contract
=================  ======================================================================
``compute``        pure data shaping; may run again after a crash
``action``         a side effect; must declare ``idempotent_effect`` or ``manual_effect``
``shell``          an action that runs one subprocess (no shell); same effect rule
``notify``         proposes one notification; a crash retry never duplicates it
``checkpoint``     commits an input request and parks the run until it is answered
``human_decision`` a protected checkpoint: only a person or its timeout policy answers
``agent``          an interactive step fulfilled by a session or a headless agent command
``timer``          ``sleep`` / ``wait_until``: the run parks until a committed wake time
=================  ======================================================================

Every node's :meth:`structure` is its part of the definition snapshot: structure only, never
function code, so the digest is stable across interpreters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import agent_command_problem
from piwf.decision_answers import TextInput, check_decision_answer
from piwf.errors import CanonicalJsonError, WorkflowDefinitionError
from piwf.lifecycle import NotifyKind
from piwf.workflow.choices import Choice, declare_choices
from piwf.workflow.effect_markers import Effect as Effect
from piwf.workflow.effect_markers import Recovery as Recovery
from piwf.workflow.effect_markers import idempotent_effect as idempotent_effect
from piwf.workflow.effect_markers import manual_effect as manual_effect
from piwf.workflow.retries import RetryPolicy, check_retry, retry_structure

if TYPE_CHECKING:
    from piwf.workflow.context import NodeContext

#: Default deadline of an agent step (active time; enforced by the server).
DEFAULT_AGENT_TIMEOUT_MS = 15 * 60_000
#: Cap on captured stdout and stderr of a shell node, each, in characters.
MAX_SHELL_OUTPUT_CHARS = 1_000_000
#: Largest static timeout accepted anywhere (about 24 days; fits a 32-bit signed ms count).
MAX_TIMEOUT_MS = 2**31 - 1

#: A node deadline: milliseconds, ``None`` for none, or a callable computing either from the
#: context (computed timeouts are left out of the definition snapshot).
TimeoutSpec: TypeAlias = "int | Callable[[NodeContext], int | None] | None"
NodeCallable: TypeAlias = "Callable[[NodeContext], Any]"


class NodeKind(str, Enum):
    """The closed set of node kinds a workflow graph can contain."""

    COMPUTE = "compute"
    ACTION = "action"
    SHELL = "shell"
    NOTIFY = "notify"
    CHECKPOINT = "checkpoint"
    HUMAN_DECISION = "human_decision"
    AGENT = "agent"
    TIMER = "timer"


@dataclass(frozen=True)
class ComputeNode:
    """Pure data shaping: ``run(ctx)`` returns the node output."""

    kind: ClassVar[NodeKind] = NodeKind.COMPUTE
    run: NodeCallable
    timeout_ms: TimeoutSpec = None
    retry: RetryPolicy | None = None
    #: The choices of a :func:`~piwf.workflow.settings.settings_route` (its finish is kept
    #: only while the settings it chose from are still the newest).
    settings_route: tuple[str, ...] | None = None

    def structure(self) -> dict[str, JsonValue]:
        """Return this node's part of the definition snapshot."""
        structure: dict[str, JsonValue] = {
            "kind": self.kind.value,
            "timeoutMs": timeout_structure(self.timeout_ms),
        }
        retry_structure(structure, self.retry)
        if self.settings_route is not None:
            structure["settingsRoute"] = list(self.settings_route)
        return structure


@dataclass(frozen=True)
class ActionNode:
    """A managed side effect: the engine reserves ``effect`` before ``run(ctx)`` is called."""

    kind: ClassVar[NodeKind] = NodeKind.ACTION
    effect: Effect
    run: NodeCallable
    request: NodeCallable | None = None
    timeout_ms: TimeoutSpec = None
    retry: RetryPolicy | None = None

    def structure(self) -> dict[str, JsonValue]:
        """Return this node's part of the definition snapshot."""
        structure: dict[str, JsonValue] = {
            "kind": self.kind.value,
            "effect": self.effect.structure(),
            "request": "computed" if self.request is not None else "default",
            "timeoutMs": timeout_structure(self.timeout_ms),
        }
        retry_structure(structure, self.retry)
        return structure


@dataclass(frozen=True)
class ShellNode:
    """A managed side effect that runs one subprocess without a shell.

    ``command`` is an argv list, or a callable returning either an argv list or a mapping
    ``{"command": str, "args": [...], "cwd": str, "timeout_ms": int, "env": {...}}``.
    """

    kind: ClassVar[NodeKind] = NodeKind.SHELL
    effect: Effect
    command: tuple[str, ...] | NodeCallable
    parse: Callable[[JsonValue], Any] | None = None
    cwd: str | None = None
    allow_nonzero_exit: bool = False
    max_output_chars: int = MAX_SHELL_OUTPUT_CHARS
    request: NodeCallable | None = None
    timeout_ms: TimeoutSpec = None
    retry: RetryPolicy | None = None

    def structure(self) -> dict[str, JsonValue]:
        """Return this node's part of the definition snapshot (a static argv is structure)."""
        command: JsonValue = list(self.command) if isinstance(self.command, tuple) else "computed"
        structure: dict[str, JsonValue] = {
            "kind": self.kind.value,
            "effect": self.effect.structure(),
            "command": command,
            "cwd": self.cwd,
            "allowNonzeroExit": self.allow_nonzero_exit,
            "maxOutputChars": self.max_output_chars,
            "parses": self.parse is not None,
            "request": "computed" if self.request is not None else "default",
            "timeoutMs": timeout_structure(self.timeout_ms),
        }
        retry_structure(structure, self.retry)
        return structure


@dataclass(frozen=True)
class NotifyNode:
    """Proposes one notification; its output is ``{"kind", "message"}``."""

    kind: ClassVar[NodeKind] = NodeKind.NOTIFY
    message: str | NodeCallable
    notify_kind: NotifyKind = NotifyKind.PROGRESS

    def structure(self) -> dict[str, JsonValue]:
        """Return this node's part of the definition snapshot."""
        return {"kind": self.kind.value, "notifyKind": self.notify_kind.value}


@dataclass(frozen=True)
class TimerNode:
    """A durable timer (``sleep`` or ``wait_until``, :mod:`piwf.workflow.timers`).

    Exactly one of ``duration_ms`` (a delay from the visit's start) and ``until_ms`` (an
    absolute epoch-millisecond instant) is set; either may be a callable of the context. The
    visit commits its absolute wake time with its start; its output is ``{"wake_at_ms",
    "woke_at_ms"}``.
    """

    kind: ClassVar[NodeKind] = NodeKind.TIMER
    duration_ms: int | NodeCallable | None = None
    until_ms: int | NodeCallable | None = None

    def structure(self) -> dict[str, JsonValue]:
        """Return this node's part of the definition snapshot (a computed time is ``computed``)."""
        name, value = (
            ("sleepMs", self.duration_ms)
            if self.duration_ms is not None
            else ("untilMs", self.until_ms)
        )
        return {"kind": self.kind.value, name: "computed" if callable(value) else value}


@dataclass(frozen=True)
class CheckpointNode:
    """Commits an input request and parks; the answer becomes the node output."""

    kind: ClassVar[NodeKind] = NodeKind.CHECKPOINT
    summary: str | None = None
    run: NodeCallable | None = None

    def structure(self) -> dict[str, JsonValue]:
        """Return this node's part of the definition snapshot."""
        return {"kind": self.kind.value, "summary": self.summary}


@dataclass(frozen=True)
class DecisionTimeout:
    """What happens to a protected decision once ``after_ms`` has passed unanswered.

    With ``has_default`` the server records ``response`` with ``timeout_policy`` provenance;
    without, the decision is cancelled (``expired_no_default``) and the visit ends
    ``timed_out``, so the run follows its ``$result.outcome`` routing.
    """

    after_ms: int
    response: JsonValue = None
    has_default: bool = True

    def structure(self) -> dict[str, JsonValue]:
        """Return the snapshot form ``{afterMs, response}`` (``{afterMs}`` with no default)."""
        if not self.has_default:
            return {"afterMs": self.after_ms}
        return {"afterMs": self.after_ms, "response": self.response}


@dataclass(frozen=True)
class HumanDecisionNode:
    """A protected decision: the answer is ``{"choice": <declared choice>, ...}``.

    ``choices`` pairs each choice name with its label; ``inputs`` pairs each choice that
    carries a text input with it (the answer then holds the text under the input's name).
    """

    kind: ClassVar[NodeKind] = NodeKind.HUMAN_DECISION
    choices: tuple[tuple[str, str], ...]
    request: NodeCallable | None = None
    audience: str = "operator"
    on_timeout: DecisionTimeout | None = None
    inputs: tuple[tuple[str, TextInput], ...] = ()

    @property
    def choice_names(self) -> tuple[str, ...]:
        """Return the declared choice names in declaration order."""
        return tuple(name for name, _ in self.choices)

    def check_answer(self, answer: JsonValue) -> str | None:
        """Return why ``answer`` is not a valid response, or ``None`` when it is."""
        return check_decision_answer(self.choice_names, dict(self.inputs), answer)

    def inputs_json(self) -> dict[str, JsonValue]:
        """Return ``{choice: input}`` (the stored form) for the choices that carry one."""
        return {name: declared.to_json() for name, declared in self.inputs}

    def structure(self) -> dict[str, JsonValue]:
        """Return this node's part of the definition snapshot."""
        structure: dict[str, JsonValue] = {
            "kind": self.kind.value,
            "audience": self.audience,
            "choices": dict(self.choices),
            "onTimeout": self.on_timeout.structure() if self.on_timeout else None,
        }
        if self.inputs:  # absent otherwise, so decisions without inputs keep their digest
            structure["inputs"] = self.inputs_json()
        return structure


@dataclass(frozen=True)
class AgentNode:
    """An interactive step: the submitted output, after ``validate``, becomes the node output.

    ``validate(output, ctx)`` may raise to reject a submission (the same request stays pending)
    or return a normalised value; returning ``None`` accepts the output unchanged. ``command``
    is the headless agent command of this step (an argv list); a run's own command wins over
    it, and it wins over the server's (docs/AGENTS.md).
    """

    kind: ClassVar[NodeKind] = NodeKind.AGENT
    prompt: str | NodeCallable
    expected_output: str
    validate: Callable[[JsonValue, NodeContext], Any] | None = None
    timeout_ms: TimeoutSpec = DEFAULT_AGENT_TIMEOUT_MS
    status_detail: str | None = None
    command: tuple[str, ...] | None = None
    #: An assistant-message step: the session's one visible reply (at most this many
    #: characters) is the output. Only an interactive run can take one.
    assistant_max_chars: int | None = None

    def structure(self) -> dict[str, JsonValue]:
        """Return this node's part of the definition snapshot."""
        structure: dict[str, JsonValue] = {
            "kind": self.kind.value,
            "expectedOutput": self.expected_output,
            "validates": self.validate is not None,
            "statusDetail": self.status_detail,
            "timeoutMs": timeout_structure(self.timeout_ms),
            "command": None if self.command is None else list(self.command),
        }
        if self.assistant_max_chars is not None:
            structure["assistantMessage"] = {"maxChars": self.assistant_max_chars}
        return structure


@dataclass(frozen=True)
class AssistantMessage:
    """``expected_output`` of an agent step whose output is the session's one visible reply."""

    max_chars: int


def assistant_message(*, max_chars: int = 4000) -> AssistantMessage:
    """The output of an agent step is the origin session's one visible reply: plain text of
    at most ``max_chars`` characters, which ``validate`` may still check. Such a step runs only
    in an interactive run (``run start --session``); a headless run refuses it."""
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or not 1 <= max_chars <= 65536:
        raise WorkflowDefinitionError("assistant_message(): max_chars must be 1 to 65536")
    return AssistantMessage(max_chars=max_chars)


Node: TypeAlias = (
    ComputeNode
    | ActionNode
    | ShellNode
    | NotifyNode
    | CheckpointNode
    | HumanDecisionNode
    | AgentNode
    | TimerNode
)
NODE_TYPES: tuple[type, ...] = (
    ComputeNode,
    ActionNode,
    ShellNode,
    NotifyNode,
    CheckpointNode,
    HumanDecisionNode,
    AgentNode,
    TimerNode,
)
EFFECT_NODE_TYPES: tuple[type, ...] = (ActionNode, ShellNode)
INTERACTION_NODE_TYPES: tuple[type, ...] = (CheckpointNode, HumanDecisionNode, AgentNode)


def compute(
    run: NodeCallable, *, timeout_ms: TimeoutSpec = None, retry: RetryPolicy | None = None
) -> ComputeNode:
    """Return a pure node whose output is ``run(ctx)``; it may run again after a crash.

    ``retry`` (:func:`~piwf.workflow.retries.retry_policy`) runs a failed try again after a
    durable back-off."""
    return ComputeNode(
        run=_callable("compute", "run", run),
        timeout_ms=_timeout("compute", timeout_ms),
        retry=check_retry("compute", retry),
    )


def action(
    *,
    effect: Effect,
    run: NodeCallable,
    request: NodeCallable | None = None,
    timeout_ms: TimeoutSpec = None,
    retry: RetryPolicy | None = None,
) -> ActionNode:
    """Return a managed side-effect node.

    ``request(ctx)`` gives the effect request whose fingerprint guards the effect key (default:
    ``{"input": ..., "outputs": ...}`` of the node's context). The output is ``run(ctx)``. After
    a crash the engine adopts a settled effect instead of calling ``run`` again. ``retry``
    runs a failed try again (an ``idempotent_effect`` only; each try is its own effect).
    """
    marker = _effect("action", effect)
    return ActionNode(
        effect=marker,
        run=_callable("action", "run", run),
        request=_optional_callable("action", "request", request),
        timeout_ms=_timeout("action", timeout_ms),
        retry=check_retry("action", retry, manual=marker.recovery is Recovery.MANUAL),
    )


def shell(
    *,
    effect: Effect,
    command: Sequence[str] | NodeCallable,
    parse: Callable[[JsonValue], Any] | None = None,
    cwd: str | None = None,
    allow_nonzero_exit: bool = False,
    max_output_chars: int = MAX_SHELL_OUTPUT_CHARS,
    request: NodeCallable | None = None,
    timeout_ms: TimeoutSpec = None,
    retry: RetryPolicy | None = None,
) -> ShellNode:
    """Return a node that runs one subprocess as a managed effect.

    The output is the result ``{command, args, cwd, stdout, stderr, exit_code, signal,
    duration_ms, stdout_truncated, stderr_truncated}``, or ``parse(result)`` when given.
    A non-zero exit fails the node unless ``allow_nonzero_exit``. stdout and stderr are each
    capped at ``max_output_chars`` characters.
    """
    if isinstance(command, str) or not (callable(command) or isinstance(command, Sequence)):
        raise WorkflowDefinitionError(
            "shell(): command must be an argv list such as ['git', 'status'] or a callable"
        )
    static: tuple[str, ...] | NodeCallable
    if callable(command):
        static = command
    else:
        static = tuple(command)
        if not static or not all(isinstance(part, str) for part in static):
            raise WorkflowDefinitionError("shell(): command must be a non-empty list of strings")
    if cwd is not None and not isinstance(cwd, str):
        raise WorkflowDefinitionError("shell(): cwd must be a string")
    if not isinstance(allow_nonzero_exit, bool):
        raise WorkflowDefinitionError("shell(): allow_nonzero_exit must be a bool")
    if (
        isinstance(max_output_chars, bool)
        or not isinstance(max_output_chars, int)
        or not 1 <= max_output_chars <= MAX_SHELL_OUTPUT_CHARS
    ):
        raise WorkflowDefinitionError(
            f"shell(): max_output_chars must be an integer in 1..{MAX_SHELL_OUTPUT_CHARS}"
        )
    marker = _effect("shell", effect)
    return ShellNode(
        effect=marker,
        command=static,
        parse=_optional_callable("shell", "parse", parse),
        cwd=cwd,
        allow_nonzero_exit=allow_nonzero_exit,
        max_output_chars=max_output_chars,
        request=_optional_callable("shell", "request", request),
        timeout_ms=_timeout("shell", timeout_ms),
        retry=check_retry("shell", retry, manual=marker.recovery is Recovery.MANUAL),
    )


def notify(*, message: str | NodeCallable, kind: str = "progress") -> NotifyNode:
    """Return a node that proposes one notification (``kind`` is ``progress`` or ``final``)."""
    if not isinstance(message, str) and not callable(message):
        raise WorkflowDefinitionError("notify(): message must be a string or a callable")
    try:
        notify_kind = NotifyKind(kind)
    except ValueError:
        raise WorkflowDefinitionError(
            f"notify(): kind must be 'progress' or 'final', got {kind!r}"
        ) from None
    return NotifyNode(message=message, notify_kind=notify_kind)


def checkpoint(*, summary: str | None = None, run: NodeCallable | None = None) -> CheckpointNode:
    """Return a node that commits an input request (``run(ctx)`` gives its content) and parks."""
    if summary is not None and not isinstance(summary, str):
        raise WorkflowDefinitionError("checkpoint(): summary must be a string")
    return CheckpointNode(summary=summary, run=_optional_callable("checkpoint", "run", run))


def human_decision(
    *,
    choices: Mapping[str, str | Choice] | Sequence[str],
    request: NodeCallable | None = None,
    audience: str = "operator",
    on_timeout: Mapping[str, object] | None = None,
) -> HumanDecisionNode:
    """Return a protected decision node.

    ``choices`` maps choice names to labels (or lists names); a value may be
    ``choice(label, input=text_input(name, prompt=...))`` for a choice whose answer must carry
    a text. The answer is an object whose ``choice`` is one of them (plus the chosen choice's
    input); route it with a switch on ``$output.choice`` that names every choice.
    ``on_timeout={"after_ms": N, "response": {"choice": ...}}`` is the default the server
    records when nobody answers in time.
    """
    declared = declare_choices(choices)
    if not isinstance(audience, str) or not audience:
        raise WorkflowDefinitionError("human_decision(): audience must be a non-empty string")
    node = HumanDecisionNode(
        choices=declared.labels,
        request=_optional_callable("human_decision", "request", request),
        audience=audience,
        inputs=declared.inputs,
    )
    if on_timeout is None:
        return node
    timeout = _decision_timeout(on_timeout)
    problem = node.check_answer(timeout.response) if timeout.has_default else None
    if problem is not None:
        raise WorkflowDefinitionError(f"human_decision(): on_timeout response: {problem}")
    return HumanDecisionNode(
        choices=declared.labels,
        request=node.request,
        audience=audience,
        on_timeout=timeout,
        inputs=declared.inputs,
    )


def agent(
    *,
    prompt: str | NodeCallable,
    expected_output: str | AssistantMessage,
    validate: Callable[[JsonValue, NodeContext], Any] | None = None,
    timeout_ms: TimeoutSpec = DEFAULT_AGENT_TIMEOUT_MS,
    status_detail: str | None = None,
    command: Sequence[str] | None = None,
) -> AgentNode:
    """Return an interactive step; ``validate(output, ctx)`` may reject or normalise output.

    ``command`` (an argv list such as ``["claude", "-p"]``) is the agent command a headless run
    starts for this step unless the run names its own. ``expected_output`` describes the
    JSON to submit, or is :func:`assistant_message` for a step whose output is the session's
    visible reply.
    """
    assistant = expected_output if isinstance(expected_output, AssistantMessage) else None
    if assistant is not None:
        expected_output = (
            f"your one visible reply, plain text of at most {assistant.max_chars} characters"
        )
    if command is not None and (problem := agent_command_problem(command)) is not None:
        raise WorkflowDefinitionError(f"agent(): command: {problem}")
    if not isinstance(prompt, str) and not callable(prompt):
        raise WorkflowDefinitionError("agent(): prompt must be a string or a callable")
    if not isinstance(expected_output, str) or not expected_output.strip():
        raise WorkflowDefinitionError("agent(): expected_output must be a non-empty string")
    if status_detail is not None and not isinstance(status_detail, str):
        raise WorkflowDefinitionError("agent(): status_detail must be a string")
    return AgentNode(
        prompt=prompt,
        expected_output=expected_output,
        validate=_optional_callable("agent", "validate", validate),
        timeout_ms=_timeout("agent", timeout_ms),
        status_detail=status_detail,
        command=None if command is None else tuple(command),
        assistant_max_chars=None if assistant is None else assistant.max_chars,
    )


def timeout_structure(timeout: TimeoutSpec) -> JsonValue:
    """Return a timeout's snapshot form: the number, ``None``, or ``"computed"``."""
    if callable(timeout):
        return "computed"
    return timeout


def _effect(factory: str, effect: object) -> Effect:
    if not isinstance(effect, Effect):
        raise WorkflowDefinitionError(
            f"{factory}(): effect must be idempotent_effect(type) or manual_effect(type)"
        )
    return effect


def _callable(factory: str, name: str, value: Any) -> Any:
    if not callable(value):
        raise WorkflowDefinitionError(f"{factory}(): {name} must be callable")
    return value


def _optional_callable(factory: str, name: str, value: Any) -> Any:
    return None if value is None else _callable(factory, name, value)


def _timeout(factory: str, value: TimeoutSpec) -> TimeoutSpec:
    if value is None or callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TIMEOUT_MS:
        raise WorkflowDefinitionError(
            f"{factory}(): timeout_ms must be a positive integer (at most {MAX_TIMEOUT_MS}), "
            "None or a callable"
        )
    return value


def _decision_timeout(value: Mapping[str, object]) -> DecisionTimeout:
    if not isinstance(value, Mapping) or set(value) not in ({"after_ms", "response"}, {"after_ms"}):
        raise WorkflowDefinitionError(
            "human_decision(): on_timeout must be {'after_ms': int, 'response'?: {...}}"
        )
    after_ms = value["after_ms"]
    if isinstance(after_ms, bool) or not isinstance(after_ms, int) or not after_ms > 0:
        raise WorkflowDefinitionError(
            "human_decision(): on_timeout after_ms must be a positive integer"
        )
    if "response" not in value:
        return DecisionTimeout(after_ms=after_ms, has_default=False)
    try:
        response = canonical.parse(canonical.encode(value["response"]))
    except CanonicalJsonError as error:
        raise WorkflowDefinitionError(
            f"human_decision(): on_timeout response is not JSON: {error}"
        ) from None
    return DecisionTimeout(after_ms=after_ms, response=response)
