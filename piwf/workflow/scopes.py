"""Run progress: scope frames, transitions through mounts, step limits and replay.

The engine keeps one :class:`Frame` per active scope (the root workflow plus each mount the
current node sits in). A transition from node ``P`` to node ``T`` leaves every mount of ``P``
deeper than the scope that declared ``P``'s edge (recording ``{"exit", "output"}`` under the
mount name in the parent frame) and enters every mount of ``T`` deeper than it (computing the
child input and starting with empty child-local outputs and results).

Replay rebuilds the same frames from a saved run by applying the recorded steps in order, so
``resume`` and ``continue`` carry exactly the saved state. Entering a mount and leaving it run
the include ``input`` mapper and the exit ``validate`` again: both must be pure.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

from piwf.canonical import JsonValue
from piwf.errors import CanonicalJsonError
from piwf.lifecycle import RunStatus
from piwf.workflow.compiler import CompiledNode, CompiledWorkflow
from piwf.workflow.context import CancellationSignal, NodeContext, NodeResult, Outcome
from piwf.workflow.definition import WorkflowDefinition
from piwf.workflow.edges import GotoEdge, MissingValue, case_text
from piwf.workflow.failure import describe_error, node_error_text
from piwf.workflow.invoke import to_json
from piwf.workflow.port import OUTCOME_STATUS, SettingsCopy, SettingsScope
from piwf.workflow.settings import SettingsError


class TransitionError(Exception):
    """A transition could not be made (routing, mount input or exit); the run fails."""


class InputRejectedError(TransitionError):
    """The root workflow's input parser refused the run's input: the run fails
    ``inputRejected`` before its first step (a restart, which gives it the same input, could
    only fail the same way)."""


@dataclass
class Frame:
    """The child-local state of one scope: input, outputs, results and steps taken."""

    mount: str | None
    workflow: WorkflowDefinition
    raw_input: JsonValue
    input: Any
    outputs: dict[str, JsonValue] = field(default_factory=dict)
    results: dict[str, NodeResult] = field(default_factory=dict)
    steps: int = 0
    started_at_ms: int | None = None
    #: Which entry of its mount this frame is (1 for the root): its settings scope's key.
    invocation: int = 1
    #: The newest settings copy an attempt of this frame was given, and the initial value
    #: once computed (both only when the frame's workflow declares settings).
    settings: SettingsCopy | None = None
    initial_settings: JsonValue = None


@dataclass(frozen=True)
class Next:
    """Continue with a new visit of the node at ``path``."""

    path: str


@dataclass(frozen=True)
class End:
    """The run ends with ``status`` after the node at ``path``."""

    status: RunStatus
    output: JsonValue
    error: str | None
    path: str | None
    #: The root workflow refused the run's input (the failure class ``inputRejected``).
    input_rejected: bool = False


Decision: TypeAlias = Next | End


def parse_input(workflow: WorkflowDefinition, raw: JsonValue) -> Any:
    """Apply the workflow's input parser (a pydantic model class or a callable) to ``raw``.

    Raises :class:`TransitionError` when the parser refuses the input.
    """
    parser = workflow.input
    if parser is None:
        return raw
    try:
        validate = getattr(parser, "model_validate", None)
        return validate(raw) if callable(validate) else parser(raw)
    except Exception as error:
        raise TransitionError(
            f"input rejected by workflow {workflow.name!r}: {_input_error_text(error)}"
        ) from error


def _input_error_text(error: Exception) -> str:
    """``Type: message`` of an input the parser refused. A pydantic ``ValidationError`` keeps
    pydantic's layout (a field per line, its rule under it) without the value sent and
    without the links to pydantic's documentation."""
    pydantic = sys.modules.get("pydantic")  # loaded when the parser is a pydantic model
    if pydantic is None or not isinstance(error, pydantic.ValidationError):
        return describe_error(error)
    problems = error.errors(include_url=False, include_context=False, include_input=False)
    plural = "" if len(problems) == 1 else "s"
    lines = [f"ValidationError: {len(problems)} validation error{plural} for {error.title}"]
    for problem in problems:
        location = ".".join(str(part) for part in problem["loc"])
        if location:
            lines.append(location)
        lines.append(f"  {problem['msg']} [type={problem['type']}]")
    return "\n".join(lines)


class RunProgress:
    """Frames, visit counters and step counts of one run while a command executes."""

    def __init__(self, compiled: CompiledWorkflow, run_id: str, raw_input: JsonValue) -> None:
        """Create the root frame; raises :class:`InputRejectedError` if the input is refused."""
        self.compiled = compiled
        self.run_id = run_id
        root = compiled.definition
        try:
            parsed = parse_input(root, raw_input)
        except TransitionError as error:
            raise InputRejectedError(str(error)) from error.__cause__
        self.frames = [Frame(None, root, raw_input, parsed)]
        self.visits: dict[str, int] = {}
        self.entries: dict[str, int] = {}
        self.total_steps = 0

    @property
    def top(self) -> Frame:
        """Return the frame of the current scope."""
        return self.frames[-1]

    def context(
        self,
        node: CompiledNode,
        visit: int,
        attempt: int,
        signal: CancellationSignal,
        publisher: Any,
    ) -> NodeContext:
        """Return a frozen context of the current frame for a visit of ``node``."""
        frame = self.top
        return NodeContext(
            input=frame.input,
            outputs=MappingProxyType(dict(frame.outputs)),
            results=MappingProxyType(dict(frame.results)),
            signal=signal,
            run_id=self.run_id,
            path=node.path,
            node=node.node_id,
            visit=visit,
            attempt=attempt,
            settings=self.settings_value(),
            _publisher=publisher,
        )

    def settings_scope(self) -> SettingsScope | str | None:
        """The settings scope a new attempt in the current frame starts in (its initial value
        computed once per frame), ``None`` when the workflow declares no settings, or why the
        initial value was refused."""
        frame = self.top
        declared = frame.workflow.settings
        if declared is None:
            return None
        if frame.settings is None and frame.initial_settings is None:
            try:
                frame.initial_settings = declared.initial_value(frame.input)
            except SettingsError as error:
                return f"the initial settings were refused: {error}"
            except Exception as error:
                return f"the initial settings failed: {describe_error(error)}"
        return SettingsScope(frame.mount or "", frame.invocation, frame.initial_settings)

    def settings_value(self) -> Any:
        """What ``ctx.settings`` is in the current frame: its newest copy, parsed."""
        frame = self.top
        declared = frame.workflow.settings
        if declared is None:
            return None
        raw = frame.initial_settings if frame.settings is None else frame.settings.value
        try:
            return declared.parsed(raw)
        except SettingsError:
            return raw

    def limit_problem(self, path: str) -> str | None:
        """Return why one more visit would exceed a ``max_steps`` bound, or ``None``."""
        for frame in self.frames:
            if frame.steps + 1 > frame.workflow.max_steps:
                where = f" in mount {frame.mount!r}" if frame.mount else ""
                return (
                    f"workflow {frame.workflow.name!r}{where} exceeded max_steps="
                    f"{frame.workflow.max_steps} before visiting {path!r}"
                )
        return None

    def next_visit(self, path: str) -> int:
        """Return the visit number a new visit of ``path`` takes."""
        return self.visits.get(path, 0) + 1

    def count_visit(self, path: str, visit: int) -> None:
        """Count one visit of ``path`` against every enclosing step limit."""
        self.visits[path] = max(self.visits.get(path, 0), visit)
        self.total_steps += 1
        for frame in self.frames:
            frame.steps += 1

    def record(self, node: CompiledNode, result: NodeResult) -> None:
        """Store a finished visit in the current frame (a failure removes the old output)."""
        frame = self.top
        if frame.started_at_ms is None:
            frame.started_at_ms = result.started_at_ms
        frame.results[node.node_id] = result
        if result.outcome is Outcome.OK:
            frame.outputs[node.node_id] = result.output
        else:
            frame.outputs.pop(node.node_id, None)

    def enter(self, path: str) -> None:
        """Enter every mount of ``path`` that is not open yet (fresh child-local state)."""
        node = self.compiled.nodes[path]
        for mount_path in node.scope[len(self.frames) - 1 :]:
            mount = self.compiled.mounts[mount_path]
            parent = self.top
            raw: JsonValue = parent.raw_input
            if mount.include.input is not None:
                ctx = NodeContext(
                    input=parent.input,
                    outputs=MappingProxyType(dict(parent.outputs)),
                    results=MappingProxyType(dict(parent.results)),
                    signal=CancellationSignal(),
                    run_id=self.run_id,
                    path=mount_path,
                    node=mount.name,
                    visit=self.entries.get(mount_path, 0) + 1,
                    attempt=1,
                )
                try:
                    raw = to_json(mount.include.input(ctx))
                except CanonicalJsonError as error:
                    raise TransitionError(
                        f"input of mount {mount_path!r} is not JSON: {error}"
                    ) from error
                except Exception as error:
                    raise TransitionError(
                        f"input of mount {mount_path!r} failed: {describe_error(error)}"
                    ) from error
            self.entries[mount_path] = self.entries.get(mount_path, 0) + 1
            frame = Frame(mount_path, mount.workflow, raw, parse_input(mount.workflow, raw))
            frame.invocation = self.entries[mount_path]
            self.frames.append(frame)

    def advance(self, node: CompiledNode, result: NodeResult) -> Decision:
        """Leave mounts, route on the result and enter the target's mounts.

        Raises :class:`TransitionError` for a routing error or a failed mount transition.
        """
        route = node.route
        if route is None:
            return self._end(result.outcome, result)
        value = result.output
        for mount_path in reversed(node.scope[route.scope_depth :]):
            value = self._leave(mount_path, node, result, value)
        outcome = result.outcome
        edge = route.edge
        if isinstance(edge, GotoEdge):
            if outcome is not Outcome.OK:
                return self._end(outcome, result)
            target = edge.target
        else:
            if not edge.on.outcome and outcome is not Outcome.OK:
                return self._end(outcome, result)
            routed = edge.on.read(value, outcome)
            if isinstance(routed, MissingValue):
                raise TransitionError(
                    f"routing error after {node.path!r}: {edge.on.text} is missing from the output"
                )
            key = case_text(routed)
            cases = dict(edge.cases)
            if key not in cases:
                if edge.on.outcome and outcome is not Outcome.OK:
                    return self._end(outcome, result)
                raise TransitionError(
                    f"routing error after {node.path!r}: no case for {edge.on.text} = {key!r} "
                    f"(cases: {', '.join(cases)})"
                )
            target = cases[key]
        target_path = route.targets[target]
        self.enter(target_path)
        return Next(target_path)

    def _leave(
        self, mount_path: str, node: CompiledNode, result: NodeResult, value: JsonValue
    ) -> JsonValue:
        frame = self.frames.pop()
        assert frame.mount == mount_path
        mount = self.compiled.mounts[mount_path]
        parent = self.top
        exit_name = node.exits.get(mount_path)
        if result.outcome is Outcome.OK and exit_name is not None:
            value = self._validate_exit(mount_path, exit_name, value)
            parent.outputs[mount.name] = {"exit": exit_name, "output": value}
        else:
            parent.outputs.pop(mount.name, None)
        parent.results[mount.name] = NodeResult(
            node=mount.name,
            path=mount_path,
            kind="include",
            outcome=result.outcome,
            visit=self.entries.get(mount_path, 1),
            started_at_ms=frame.started_at_ms or result.started_at_ms,
            finished_at_ms=result.finished_at_ms,
            output={"exit": exit_name, "output": value} if result.outcome is Outcome.OK else None,
            error=result.error,
        )
        return value

    def _validate_exit(self, mount_path: str, exit_name: str, value: JsonValue) -> JsonValue:
        spec = self.compiled.mounts[mount_path].workflow.exits[exit_name]
        if spec.validate is None:
            return value
        try:
            normalised = spec.validate(value)
            return value if normalised is None else to_json(normalised)
        except CanonicalJsonError as error:
            raise TransitionError(
                f"exit {exit_name!r} of mount {mount_path!r} returned a value that is not "
                f"JSON: {error}"
            ) from error
        except Exception as error:
            raise TransitionError(
                f"exit {exit_name!r} of mount {mount_path!r} refused the output: "
                f"{describe_error(error)}"
            ) from error

    @staticmethod
    def _end(outcome: Outcome, result: NodeResult) -> End:
        """The run ends with ``result``'s node: its output, or an error that names the node."""
        status = OUTCOME_STATUS[outcome]
        if status is RunStatus.COMPLETED:
            return End(status, result.output, None, result.path)
        error = node_error_text(
            result.path, result.visit, result.attempt, outcome, result.error or outcome.value
        )
        return End(status, None, error, result.path)
