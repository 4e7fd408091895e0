"""Validating one candidate output of an agent request: the only place ``validate`` runs.

In the server this runs in a supervised validation child (:mod:`piwf.runner.validator`), never
in the server or in a workflow runner; the in-memory port calls the same function in-process
(:meth:`piwf.workflow.memory.MemoryPort.submit`). Either way::

    saved run ──answer_visit──▶ the waiting visit's node and the context the engine builds for it
    candidate ──validate(candidate, ctx), bounded──▶ raised        rejected, the error text
                                                   ─▶ overran       rejected, "did not finish"
                                                   ─▶ None          accepted, the candidate
                                                   ─▶ a value       accepted, that value (JSON)

A node without ``validate`` accepts any JSON candidate unchanged. The context is read-only:
``ctx.publish_update`` is refused while validating (an update belongs to the visit, not to a
candidate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from piwf.canonical import JsonValue
from piwf.errors import CanonicalJsonError, RunCommandError
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.context import CancellationSignal
from piwf.workflow.failure import describe_error
from piwf.workflow.invoke import Raised, Stopped, invoke, to_json
from piwf.workflow.nodes import AgentNode
from piwf.workflow.planning import answer_visit
from piwf.workflow.port import SavedRun
from piwf.workflow.scopes import TransitionError

#: How long one ``validate`` call may run (docs/AGENTS.md).
DEFAULT_VALIDATE_TIMEOUT_MS = 30_000
#: The longest error text a rejection keeps (a longer one is cut, marked with an ellipsis): it
#: travels whole in a response's error message.
MAX_REJECTION_CHARS = 1000


@dataclass(frozen=True)
class Accepted:
    """``validate`` accepted the candidate; ``value`` is the (possibly normalised) output."""

    value: JsonValue


@dataclass(frozen=True)
class Rejected:
    """The candidate was refused; ``error`` says why and what to submit instead."""

    error: str


Verdict: TypeAlias = Accepted | Rejected


def validate_candidate(
    workflow: CompiledWorkflow,
    saved: SavedRun,
    request_id: str,
    candidate: JsonValue,
    *,
    timeout_ms: int = DEFAULT_VALIDATE_TIMEOUT_MS,
) -> Verdict:
    """Run the agent node's ``validate`` on ``candidate`` for ``request_id`` of ``saved``.

    Never raises for anything the workflow or the saved run does: a run that does not wait on
    this agent request, a replay that fails, a ``validate`` that raises, overruns
    ``timeout_ms`` or returns something that is not JSON all become a :class:`Rejected` whose
    error is bounded to :data:`MAX_REJECTION_CHARS`.
    """
    signal = CancellationSignal()
    try:
        visit = answer_visit(workflow, saved, signal=signal, publisher=_refuse_update)
    except (RunCommandError, TransitionError) as error:
        return Rejected(bounded(f"the run cannot take this submission: {error}"))
    spec = visit.node.node
    if visit.pending.request_id != request_id or not isinstance(spec, AgentNode):
        return Rejected(
            f"the run waits on {visit.pending.request_id}, not on agent request {request_id}"
        )
    if spec.validate is None:
        return Accepted(candidate)
    validate, context = spec.validate, visit.context
    call = invoke(lambda: validate(candidate, context), timeout_ms=timeout_ms, signal=signal)
    if isinstance(call, Raised):
        return Rejected(bounded(describe_error(call.error)))
    if isinstance(call, Stopped):
        return Rejected(
            f"validate did not finish within {timeout_ms} ms; the output was not accepted"
        )
    if call.value is None:
        return Accepted(candidate)
    try:
        return Accepted(to_json(call.value))
    except CanonicalJsonError as error:
        return Rejected(bounded(f"validate returned a value that is not JSON: {error}"))


def bounded(text: str, limit: int = MAX_REJECTION_CHARS) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks a cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _refuse_update(_update_type: str, _key: str, _data: object) -> None:
    raise RuntimeError("publish_update is not available while validating a submission")
