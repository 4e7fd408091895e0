"""The records the in-memory port (:mod:`piwf.workflow.memory`) keeps: runs, effects and
agent submissions. Plain mutable dataclasses; only :class:`~piwf.workflow.memory.MemoryPort`
changes them, under its lock."""

from __future__ import annotations

from dataclasses import dataclass, field

from piwf.canonical import JsonValue
from piwf.lifecycle import EffectStatus, Lineage, RunStatus
from piwf.workflow.nodes import Recovery
from piwf.workflow.port import ActiveVisit, ParkReason, PendingRequest, StepRecord
from piwf.workflow.validation import Verdict


@dataclass
class EffectRecord:
    """One reserved effect; ``attempts`` counts reservations that let the action run."""

    key: str
    run_id: str
    path: str
    visit: int
    effect_type: str
    recovery: Recovery
    request: JsonValue
    fingerprint: str
    status: EffectStatus = EffectStatus.APPLYING
    result: JsonValue = None
    error: str | None = None
    attempts: int = 1
    applying_attempt: int = 1  # the visit attempt whose action may be running right now


@dataclass(frozen=True)
class MemorySubmission:
    """One candidate output submitted through :meth:`MemoryPort.submit` and its verdict."""

    request_id: str
    output: JsonValue
    verdict: Verdict


@dataclass
class MemoryRun:
    """One run as the in-memory port holds it."""

    run_id: str
    status: RunStatus
    input: JsonValue
    lineage: Lineage
    parent_run_id: str | None
    restart_number: int
    definition_digest: str | None
    title: str | None = None
    steps: list[StepRecord] = field(default_factory=list)
    visits: dict[str, int] = field(default_factory=dict)
    active: ActiveVisit | None = None
    pending: PendingRequest | None = None
    park_reason: ParkReason | None = None
    output: JsonValue = None
    error: str | None = None
    #: The active attempt is a retry's next try, not started yet (it waits on its wake time).
    try_pending: bool = False
