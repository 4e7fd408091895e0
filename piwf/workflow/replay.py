"""Where a command continues: the saved steps replayed onto a run's progress.

The engine (:mod:`piwf.workflow.engine`) replays before it executes a command, and an agent's
validation (:mod:`piwf.workflow.validation`) replays to build the context of the visit that
waits on a request; both go through :func:`replay_saved_run`, so ``validate`` sees exactly
the inputs and outputs the engine would give the visit::

    saved steps ──record + advance──▶ the next position
        NextNode      a new visit of a path
        RetryVisit    the unfinished visit again (a crash retry keeps the visit number)
        AwaitAnswer   the unfinished visit waits on a request
        AwaitWake     the unfinished visit waits on a committed wake time (a timer, or a
                      retry policy's back-off before its next try)
        End           the run ends (a terminal routing decision)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from piwf.errors import RunCommandError
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.context import NodeResult
from piwf.workflow.port import PendingRequest, SavedRun
from piwf.workflow.scopes import End, Next, RunProgress


@dataclass(frozen=True)
class NextNode:
    """Start a new visit of ``path``."""

    path: str


@dataclass(frozen=True)
class RetryVisit:
    """Retry the unfinished visit ``visit`` of ``path`` (a crash retry keeps the number)."""

    path: str
    visit: int
    attempt: int
    #: Tries of this visit a retry policy already saw fail (crash retries are not tries).
    failed_tries: int = 0


@dataclass(frozen=True)
class AwaitWake:
    """The unfinished visit of ``path`` waits until ``wake_at_ms``: a timer visit (which then
    finishes) or a retry's pending ``attempt`` (which then runs the next try)."""

    path: str
    visit: int
    attempt: int
    started_at_ms: int
    wake_at_ms: int
    failed_tries: int = 0


@dataclass(frozen=True)
class AwaitAnswer:
    """Consume (or keep waiting for) the request of the unfinished visit of ``path``."""

    path: str
    visit: int
    attempt: int
    started_at_ms: int
    pending: PendingRequest


Position: TypeAlias = NextNode | RetryVisit | AwaitAnswer | AwaitWake | End


def replay_saved_run(
    workflow: CompiledWorkflow, progress: RunProgress, saved: SavedRun
) -> tuple[Position, str | None]:
    """Rebuild ``progress`` from the saved steps; return where execution continues and the path
    of the last finished step.

    Raises :class:`RunCommandError` when the saved steps do not follow from the definition, and
    :class:`~piwf.workflow.scopes.TransitionError` when a saved step's routing fails. No
    workflow callable runs, except the routing the definition declares.
    """
    run_id = saved.run_id
    last_path: str | None = None
    entry = workflow.entry
    progress.enter(entry)
    expected: Position = NextNode(entry)
    for step in saved.steps:
        if not isinstance(expected, NextNode) or expected.path != step.path:
            raise RunCommandError(
                f"saved step {step.path!r} of run {run_id} does not follow from the "
                f"definition (expected {expected})"
            )
        node = workflow.nodes[step.path]
        progress.count_visit(step.path, step.visit)
        result = NodeResult(
            node=node.node_id,
            path=step.path,
            kind=node.node.kind.value,
            outcome=step.outcome,
            visit=step.visit,
            started_at_ms=step.started_at_ms,
            finished_at_ms=step.finished_at_ms,
            output=step.output,
            error=step.error,
            attempt=step.attempt,
        )
        progress.record(node, result)
        last_path = step.path
        decision = progress.advance(node, result)
        expected = NextNode(decision.path) if isinstance(decision, Next) else decision
    for path, visit in saved.visits.items():
        progress.visits[path] = max(progress.visits.get(path, 0), visit)
    active = saved.active
    if active is None:
        return expected, last_path
    if not isinstance(expected, NextNode) or expected.path != active.path:
        raise RunCommandError(
            f"active node {active.path!r} of run {run_id} does not follow from the saved steps"
        )
    progress.count_visit(active.path, active.visit)
    if active.settings is not None:
        progress.top.settings = active.settings
    if saved.pending is not None:
        position: Position = AwaitAnswer(
            active.path, active.visit, active.attempt, active.started_at_ms, saved.pending
        )
        return position, last_path
    if active.wake_at_ms is not None:
        wake = AwaitWake(
            active.path,
            active.visit,
            active.attempt,
            active.started_at_ms,
            active.wake_at_ms,
            active.failed_tries,
        )
        return wake, last_path
    return RetryVisit(active.path, active.visit, active.attempt + 1, active.failed_tries), last_path
