"""What a reconcile sees: the resource snapshot, the cancellation signal, effects and workflows.

``ctx.effects.ensure`` runs one external effect at most once per key, with evidence::

    reserve(key, kind, request) ─ applied | rejected ───────────────▶ the stored outcome
        │ (pending, or ambiguous after an uncertain crash)
        ▼
    begin attempt ─▶ observe(signal) ─ applied ──────────────────────▶ settle applied
                                     ├ indeterminate ────────────────▶ ambiguous; raise
                                     └ not_applied ─▶ apply(signal) ─▶ applied | rejected
                                                                     └ indeterminate ▶ ambiguous

``observe`` always runs before ``apply``, so an apply whose outcome was lost (the runner or the
server died, the apply said ``indeterminate``) is never repeated blindly: the next reconcile
observes first. Same key + same request adopts the stored effect; same key + another request is
an error.

``ctx.workflows.ensure(request_key, workflow, input)`` finds or creates one child run per
stable key; the same key with another workflow or input is an error. When the child run ends,
the server enqueues this resource again.

Every call goes to the server through a :class:`ReconcilePort` and is fenced by the reconcile's
claim: after a claim loss each call raises :class:`~piwf.errors.ClaimLostError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from piwf.canonical import JsonValue
from piwf.resource.definition import (
    Condition,
    ReconcileResult,
    requeue,
    requeue_after,
    settled,
)
from piwf.resource.errors import EffectIndeterminateError, ResourceError
from piwf.workflow.context import CancellationSignal


class EffectObservation(str, Enum):
    """What ``observe`` saw in the outside world."""

    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    INDETERMINATE = "indeterminate"


class ApplyOutcome(str, Enum):
    """What ``apply`` achieved."""

    APPLIED = "applied"
    REJECTED = "rejected"
    INDETERMINATE = "indeterminate"


@dataclass(frozen=True)
class EffectOutcome:
    """An observation or apply outcome with an optional JSON result (an external id, say)."""

    status: str
    result: JsonValue = None
    error: str | None = None


Observe = Callable[[CancellationSignal], "EffectObservation | EffectOutcome | str"]
Apply = Callable[[CancellationSignal], "ApplyOutcome | EffectOutcome | str"]


@dataclass(frozen=True)
class EffectRecord:
    """The stored state of one effect; ``status`` is ``applied`` or ``rejected`` after ensure."""

    key: str
    kind: str
    effect_id: str
    status: str
    result: JsonValue = None
    error: str | None = None

    @property
    def applied(self) -> bool:
        """Whether the effect is known to have happened."""
        return self.status == "applied"


class WorkflowState(str, Enum):
    """A child run's state as a reconcile sees it."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class WorkflowRef:
    """One child run requested under a stable key; ``output`` is set once it succeeded."""

    request_key: str
    run_id: str
    state: WorkflowState
    output: JsonValue = None
    error: str | None = None

    @property
    def done(self) -> bool:
        """Whether the child run has ended (succeeded, failed or interrupted)."""
        return self.state in (
            WorkflowState.SUCCEEDED,
            WorkflowState.FAILED,
            WorkflowState.INTERRUPTED,
        )


class ReconcilePort(Protocol):
    """The server calls a reconcile can make; each raises ``ClaimLostError`` after a claim
    loss and :class:`ResourceError` subclasses for refused requests."""

    def reserve_effect(self, key: str, kind: str, request: JsonValue) -> EffectRecord:
        """Reserve (or find) the effect ``key``; a settled one comes back settled."""
        ...

    def begin_effect(self, effect_id: str) -> int:
        """Open the next attempt of a pending or ambiguous effect; return its number."""
        ...

    def settle_effect(
        self, effect_id: str, attempt: int, outcome: EffectOutcome, *, observed: bool
    ) -> EffectRecord:
        """Record how the open attempt ended (``indeterminate`` makes it ambiguous)."""
        ...

    def ensure_workflow(self, request_key: str, workflow: str, input: JsonValue) -> WorkflowRef:
        """Find or create the child run of ``request_key``."""
        ...


@dataclass(frozen=True)
class ManagedResource:
    """A snapshot of the resource taken when the reconcile was admitted.

    ``resource_version`` is the CAS token the result is committed against: if anything wrote
    the resource meanwhile, the result is dropped and the resource is reconciled again at once.
    ``generation`` changes only when the spec changes; ``observed_generation`` is the generation
    the last committed result saw.
    """

    uid: str
    manager: str
    key: str
    resource_version: int
    generation: int
    observed_generation: int
    spec: Any
    status: dict[str, JsonValue]
    conditions: tuple[Mapping[str, JsonValue], ...]
    finalizers: tuple[str, ...]
    deletion_timestamp: int | None

    @property
    def deleting(self) -> bool:
        """Whether deletion was requested: clean up, then settle with no finalizers."""
        return self.deletion_timestamp is not None

    def condition(self, condition_type: str) -> Mapping[str, JsonValue] | None:
        """The stored condition of this type, or None."""
        return next((c for c in self.conditions if c.get("type") == condition_type), None)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ManagedResource:
        """Build from the launch envelope's ``resource`` object."""
        return cls(
            uid=str(data["uid"]),
            manager=str(data["manager"]),
            key=str(data["key"]),
            resource_version=int(data["resourceVersion"]),
            generation=int(data["generation"]),
            observed_generation=int(data["observedGeneration"]),
            spec=data["spec"],
            status=dict(data["status"]),
            conditions=tuple(dict(c) for c in data["conditions"]),
            finalizers=tuple(str(f) for f in data["finalizers"]),
            deletion_timestamp=data.get("deletionTimestamp"),
        )


class Effects:
    """``ctx.effects``: managed external effects with observe-before-apply."""

    def __init__(self, port: ReconcilePort, signal: CancellationSignal) -> None:
        self._port = port
        self._signal = signal

    def ensure(
        self,
        key: str,
        kind: str,
        request: JsonValue,
        observe: Observe,
        apply: Apply,
    ) -> EffectRecord:
        """Make sure the effect ``key`` happened once; return its stored record.

        ``key`` and ``kind`` are 1..256 characters; ``request`` is the JSON the effect is keyed
        by (another request under the same key is refused). Returns a record whose status is
        ``applied`` or ``rejected``. Raises :class:`EffectIndeterminateError` when observe or
        apply cannot tell (the effect stays ambiguous and is observed again next time), and
        re-raises what ``observe``/``apply`` raise (the effect then counts as indeterminate).
        """
        for label, value in (("key", key), ("kind", kind)):
            if not isinstance(value, str) or not 1 <= len(value) <= 256:
                raise ValueError(f"effects.ensure: {label} must be a string of 1..256 characters")
        self._signal.raise_if_cancelled()
        record = self._port.reserve_effect(key, kind, request)
        if record.status in ("applied", "rejected"):
            return record
        if record.status not in ("pending", "ambiguous"):
            raise ResourceError(f"effect {key!r} is {record.status}; it cannot be ensured")
        attempt = self._port.begin_effect(record.effect_id)
        observed = self._guarded(record.effect_id, attempt, lambda: observe(self._signal))
        status = _status(observed, EffectObservation)
        if status == EffectObservation.APPLIED.value:
            return self._settle(record.effect_id, attempt, observed, "applied", observed=True)
        if status == EffectObservation.INDETERMINATE.value:
            self._settle(record.effect_id, attempt, observed, "indeterminate", observed=True)
            raise EffectIndeterminateError(f"effect {key!r}: observe could not tell")
        outcome = self._guarded(record.effect_id, attempt, lambda: apply(self._signal))
        applied = _status(outcome, ApplyOutcome)
        settled_record = self._settle(record.effect_id, attempt, outcome, applied, observed=False)
        if applied == ApplyOutcome.INDETERMINATE.value:
            raise EffectIndeterminateError(f"effect {key!r}: apply could not tell")
        return settled_record

    def _guarded(self, effect_id: str, attempt: int, call: Callable[[], Any]) -> Any:
        """Run observe/apply; an exception leaves the effect ambiguous, then propagates."""
        try:
            return call()
        except Exception as error:
            message = f"{type(error).__name__}: {error}"[:1000]
            self._port.settle_effect(
                effect_id,
                attempt,
                EffectOutcome("indeterminate", error=message),
                observed=False,
            )
            raise

    def _settle(
        self, effect_id: str, attempt: int, raw: object, status: str, *, observed: bool
    ) -> EffectRecord:
        outcome = raw if isinstance(raw, EffectOutcome) else EffectOutcome(status)
        outcome = EffectOutcome(status, outcome.result, outcome.error)
        return self._port.settle_effect(effect_id, attempt, outcome, observed=observed)


def _status(value: object, vocabulary: type[Enum]) -> str:
    raw = value.status if isinstance(value, EffectOutcome) else value
    raw = raw.value if isinstance(raw, Enum) else raw
    allowed = {member.value for member in vocabulary}
    if raw not in allowed:
        raise ValueError(f"expected one of {sorted(allowed)}, got {raw!r}")
    return str(raw)


class Workflows:
    """``ctx.workflows``: child runs found or created by a stable request key."""

    def __init__(self, port: ReconcilePort, signal: CancellationSignal) -> None:
        self._port = port
        self._signal = signal

    def ensure(self, request_key: str, workflow: str, input: JsonValue = None) -> WorkflowRef:
        """Return the child run of ``request_key``, creating it (queued) on first use.

        ``workflow`` is a workflow name (discovered from the resource's project) or a path.
        The same key with another workflow or input raises
        :class:`~piwf.resource.errors.WorkflowRequestConflictError`: use a new key (for
        example one that includes the generation) when the input changes.
        """
        if not isinstance(request_key, str) or not 1 <= len(request_key) <= 256:
            raise ValueError("workflows.ensure: request_key must be a string of 1..256 characters")
        if not isinstance(workflow, str) or not workflow:
            raise ValueError("workflows.ensure: workflow must be a name or a path")
        self._signal.raise_if_cancelled()
        return self._port.ensure_workflow(request_key, workflow, input)


class ReconcileContext:
    """The context a reconcile receives: ``signal``, ``effects``, ``workflows``, ``resource``.

    ``signal`` is set when the reconcile's deadline passes (or the server stops it); cooperative
    code checks it. Code that ignores it is stopped by the server anyway.
    """

    def __init__(
        self,
        resource: ManagedResource,
        port: ReconcilePort,
        signal: CancellationSignal,
        reconcile_id: str,
    ) -> None:
        self.resource = resource
        self.signal = signal
        self.reconcile_id = reconcile_id
        self.effects = Effects(port, signal)
        self.workflows = Workflows(port, signal)

    def settled(
        self,
        status: dict[str, JsonValue] | None = None,
        conditions: list[Condition] | None = None,
        finalizers: list[str] | None = None,
    ) -> ReconcileResult:
        """Same as :func:`piwf.resource.settled`."""
        return settled(status, conditions, finalizers)

    def requeue(
        self,
        status: dict[str, JsonValue] | None = None,
        conditions: list[Condition] | None = None,
        finalizers: list[str] | None = None,
    ) -> ReconcileResult:
        """Same as :func:`piwf.resource.requeue`."""
        return requeue(status, conditions, finalizers)

    def requeue_after(
        self,
        after_ms: int,
        status: dict[str, JsonValue] | None = None,
        conditions: list[Condition] | None = None,
        finalizers: list[str] | None = None,
    ) -> ReconcileResult:
        """Same as :func:`piwf.resource.requeue_after`."""
        return requeue_after(after_ms, status, conditions, finalizers)
