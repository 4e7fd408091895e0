"""Planning a run command: does the command fit the saved run, before any workflow code runs.

:func:`plan_command` reads the saved run and checks the command against it with one exhaustive
``match``; :func:`answer_visit` rebuilds the visit that waits on a request, with the context
the engine gives it (what an agent's ``validate`` sees). The engine (:mod:`piwf.workflow.engine`)
executes what planning accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from piwf.errors import RunCommandError
from piwf.lifecycle import AnsweredBy, InteractionKind, Lineage, RunStatus
from piwf.workflow.commands import (
    ContinueCommand,
    RestartCommand,
    ResumeCommand,
    RunCommand,
    StartCommand,
)
from piwf.workflow.compiler import CompiledNode, CompiledWorkflow
from piwf.workflow.context import CancellationSignal, NodeContext
from piwf.workflow.nodes import INTERACTION_NODE_TYPES, HumanDecisionNode
from piwf.workflow.port import PendingRequest, SavedRun, WorkflowPort
from piwf.workflow.replay import AwaitAnswer, replay_saved_run
from piwf.workflow.scopes import RunProgress

_INTERACTION_KINDS = {
    "checkpoint": InteractionKind.CHECKPOINT,
    "human_decision": InteractionKind.HUMAN_DECISION,
    "agent": InteractionKind.AGENT,
}


def assert_never(value: NoReturn) -> NoReturn:
    """Fail loudly when a ``match`` meant to be exhaustive meets an unknown case."""
    raise AssertionError(f"unhandled case: {value!r}")


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
