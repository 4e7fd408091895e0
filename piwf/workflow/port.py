"""The narrow port through which the engine proposes every durable change.

The engine never touches storage. It reads the saved run once per command and then proposes
changes as typed messages; the port commits each one (in the server: one short transaction
behind a runner pipe) and answers with one of the shared results of :mod:`piwf.lifecycle`
(``Applied(Committed)``, ``Adopted(Committed)``, ``Conflict``, ``RecoveryRequired``)::

    engine ──read_run──────────────▶ port      SavedRun | None
           ──begin_run─────────────▶           (command accepted, title)
           ──node_started──────────▶           (run, path, visit, attempt, deadline)
           ──reserve_effect────────▶           Applied | Adopted(settled?) | Conflict
                                                 | RecoveryRequired
           ──settle_effect─────────▶
           ──publish_update────────▶
           ──notify────────────────▶
           ──request_interaction───▶           (checkpoint, human decision, agent)
           ──node_finished | node_failed ▶
           ──park──────────────────▶           (waiting for an answer, effect ambiguous)
           ──finish────────────────▶           (terminal status)

Every message is a frozen dataclass of canonical-JSON values, so a transport can encode it with
:func:`message_to_json`. A port signals loss of authority by raising (for example
:class:`piwf.errors.ClaimLostError`); the engine lets that propagate and writes nothing more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, TypeAlias

from piwf.canonical import JsonValue
from piwf.lifecycle import (
    Adopted,
    AnsweredBy,
    Applied,
    CommandKind,
    Conflict,
    InteractionKind,
    Lineage,
    NotifyKind,
    RecoveryRequired,
    RunStatus,
    StrEnum,
)
from piwf.workflow.context import Outcome
from piwf.workflow.failure import NodeFailure
from piwf.workflow.nodes import Recovery

OUTCOME_STATUS: Mapping[Outcome, RunStatus] = {
    Outcome.OK: RunStatus.COMPLETED,
    Outcome.FAILED: RunStatus.FAILED,
    Outcome.TIMED_OUT: RunStatus.TIMED_OUT,
    Outcome.CANCELLED: RunStatus.CANCELLED,
}


class ParkReason(StrEnum):
    """Why the engine stopped without a terminal status."""

    WAITING = "waiting"
    EFFECT_AMBIGUOUS = "effectAmbiguous"
    #: A durable timer: a ``sleep``/``wait_until`` visit, or a retry's back-off.
    TIMER = "timer"


class EffectOutcome(StrEnum):
    """How an effect attempt settled. ``ambiguous`` means it may or may not have applied."""

    APPLIED = "applied"
    REJECTED = "rejected"
    AMBIGUOUS = "ambiguous"


# Saved run state (read once per command) --------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    """A finished node visit: ``attempt`` is the attempt that finished it."""

    path: str
    visit: int
    attempt: int
    outcome: Outcome
    output: JsonValue
    error: str | None
    started_at_ms: int
    finished_at_ms: int


@dataclass(frozen=True)
class SettingsCopy:
    """The live settings an attempt started with: change ``change_number`` of its scope (0 is
    the initial value) and the stored JSON ``value``."""

    change_number: int
    value: JsonValue


@dataclass(frozen=True)
class SettingsScope:
    """The settings scope a visit runs in: ``mount_path`` (``""`` for the root workflow) and
    the mount's entry ``invocation`` (1 for the root); ``initial`` is the value the scope
    takes when this start creates it."""

    mount_path: str
    invocation: int
    initial: JsonValue


@dataclass(frozen=True)
class ActiveVisit:
    """The one unfinished node visit of a run (at most one exists).

    ``wake_at_ms`` is the committed wake time of a timer visit, or the instant a retry's next
    try may start (the attempt is then ``pending``); ``failed_tries`` counts the tries of this
    visit a retry policy already saw fail.
    """

    path: str
    visit: int
    attempt: int
    started_at_ms: int
    deadline_ms: int | None
    wake_at_ms: int | None = None
    failed_tries: int = 0
    #: The settings copy the active attempt started with (its scope declares settings).
    settings: SettingsCopy | None = None


@dataclass(frozen=True)
class PendingRequest:
    """An open request of the active visit; ``answered`` tells whether ``answer`` is set."""

    request_id: str
    path: str
    visit: int
    kind: InteractionKind
    content: JsonValue
    answered: bool = False
    answer: JsonValue = None
    answered_by: AnsweredBy | None = None


@dataclass(frozen=True)
class SavedRun:
    """Everything the engine may know about a run when a command begins."""

    run_id: str
    status: RunStatus
    input: JsonValue
    lineage: Lineage = Lineage.ROOT
    parent_run_id: str | None = None
    restart_number: int = 0
    definition_digest: str | None = None
    steps: tuple[StepRecord, ...] = ()
    visits: Mapping[str, int] = field(default_factory=dict)
    active: ActiveVisit | None = None
    pending: PendingRequest | None = None
    park_reason: ParkReason | None = None
    output: JsonValue = None
    error: str | None = None

    @property
    def fresh(self) -> bool:
        """Return whether the run is queued and nothing of it has executed yet."""
        return (
            self.status is RunStatus.QUEUED
            and not self.steps
            and self.active is None
            and self.pending is None
        )


# Messages (engine → port) ------------------------------------------------------------------


@dataclass(frozen=True)
class RunRead:
    """Read the saved state of ``run_id`` (a runner's own run, or the run a restart restarts)."""

    run_id: str


@dataclass(frozen=True)
class RunBegun:
    """The engine accepted ``command`` for the run; ``title`` is resolved on start/restart."""

    run_id: str
    command: CommandKind
    definition_digest: str
    title: str | None


@dataclass(frozen=True)
class NodeStarted:
    """A visit starts (attempt 1) or a crash retry of the same visit starts (attempt > 1)."""

    run_id: str
    path: str
    visit: int
    attempt: int
    kind: str
    started_at_ms: int
    timeout_ms: int | None
    deadline_ms: int | None
    #: A timer visit's absolute wake time, committed with its start.
    wake_at_ms: int | None = None
    #: The settings scope of a workflow that declares settings: the attempt is given the
    #: scope's newest copy (``Committed.settings``), and keeps it.
    settings: SettingsScope | None = None


@dataclass(frozen=True)
class NodeFinished:
    """A visit finished ``ok``; ``request_id`` closes the visit's answered request."""

    run_id: str
    path: str
    visit: int
    attempt: int
    output: JsonValue
    finished_at_ms: int
    request_id: str | None = None
    #: A settings route's finish: kept only while this is still its scope's newest change
    #: (else ``Conflict`` with :data:`SETTINGS_CHANGED` and the visit runs again).
    settings_change_number: int | None = None


#: The evidence of a settings route's finish refused because a newer change was accepted.
SETTINGS_CHANGED = "settingsChanged"


@dataclass(frozen=True)
class NodeFailed:
    """A visit finished ``failed``, ``timed_out`` or ``cancelled``.

    ``error`` is the one-line text (``KeyError: 'missing'``) that routing and ``ctx.results``
    see; ``failure`` the structured, bounded record the port stores with the attempt
    (:mod:`piwf.workflow.failure`). The engine always sends it; ``None`` is kept for a sender
    that has no record.

    With ``retry_at_ms`` the failed try is kept as a failed attempt but the visit stays open: a
    retry policy opens attempt + 1 ``pending`` until that instant (no step is appended).
    """

    run_id: str
    path: str
    visit: int
    attempt: int
    outcome: Outcome
    error: str
    finished_at_ms: int
    failure: NodeFailure | None = None
    retry_at_ms: int | None = None


@dataclass(frozen=True)
class EffectReservation:
    """Reserve the managed effect ``effect_key`` before the action runs.

    ``effect_key`` is derived from (run id, effect type, full path, visit, and the try of a
    retry policy after the first);
    ``request_fingerprint`` is the SHA-256 of the request's canonical JSON.
    """

    run_id: str
    path: str
    visit: int
    effect_key: str
    effect_type: str
    recovery: Recovery
    request: JsonValue
    request_fingerprint: str


@dataclass(frozen=True)
class EffectSettlement:
    """Settle an effect attempt; ``result`` is the applied value or a failure receipt."""

    run_id: str
    effect_key: str
    outcome: EffectOutcome
    result: JsonValue = None
    error: str | None = None


@dataclass(frozen=True)
class UpdatePublished:
    """A durable progress update; the latest per ``(run, update_type, key)`` is kept."""

    run_id: str
    path: str
    visit: int
    update_type: str
    key: str
    data: JsonValue


@dataclass(frozen=True)
class NotificationRequested:
    """One notification; ``notification_id`` is stable across crash retries of the visit."""

    run_id: str
    path: str
    visit: int
    notification_id: str
    kind: NotifyKind
    message: str


@dataclass(frozen=True)
class InteractionRequested:
    """Commit a pending request for the active visit; the run then parks ``waiting``.

    ``on_timeout`` is ``{"afterMs", "response"}`` for a protected decision with a default;
    ``timeout_ms`` is the agent step's active-time budget. Deciding timeouts is the server's job.
    """

    run_id: str
    path: str
    visit: int
    request_id: str
    kind: InteractionKind
    content: JsonValue
    on_timeout: JsonValue = None
    timeout_ms: int | None = None


@dataclass(frozen=True)
class RunParked:
    """The engine stops without a terminal status (``waiting``, ``effectAmbiguous`` or
    ``timer``, which names the committed ``wake_at_ms`` of the active visit)."""

    run_id: str
    reason: ParkReason
    path: str
    visit: int
    request_id: str | None = None
    detail: str | None = None
    wake_at_ms: int | None = None


@dataclass(frozen=True)
class RunFinished:
    """The run reached a terminal status; ``output`` for completed, ``error`` otherwise.
    ``input_rejected``: a ``failed`` run whose root workflow refused its input (no step ran);
    the server records it as the failure class ``inputRejected`` instead of ``nodeFailed``."""

    run_id: str
    status: RunStatus
    output: JsonValue
    error: str | None
    path: str | None
    input_rejected: bool = False


# Results (port → engine) -------------------------------------------------------------------


@dataclass(frozen=True)
class SettledEffect:
    """A previously settled effect attempt, returned when a reservation is adopted."""

    outcome: EffectOutcome
    result: JsonValue = None
    error: str | None = None


@dataclass(frozen=True)
class Committed:
    """What a change left committed: the value of every ``Applied`` and ``Adopted`` port result.

    ``revision`` is the run revision after the call (the in-memory port counts its messages). For an
    adopted effect reservation ``settled`` is the earlier attempt's settlement; an adopted
    reservation without it means that attempt never settled and the port returned it to
    pending: the action runs again (idempotent effects only).
    """

    revision: int | None = None
    settled: SettledEffect | None = None
    #: The settings copy a started attempt was given (``node_started`` with a scope).
    settings: SettingsCopy | None = None


PortResult: TypeAlias = Applied[Committed] | Adopted[Committed] | Conflict | RecoveryRequired


class WorkflowPort(Protocol):
    """The durable side of the engine: one method per proposed change.

    Every method either returns a typed result or raises when the caller has lost authority
    (the engine stops at once and writes nothing more). Methods are called from one thread at
    a time.
    """

    def read_run(self, run_id: str) -> SavedRun | None:
        """Return the saved state of ``run_id``, or ``None`` when no such run exists."""
        ...

    def begin_run(self, message: RunBegun) -> PortResult:
        """Record that the engine accepted a command for the run."""
        ...

    def node_started(self, message: NodeStarted) -> PortResult:
        """Open a node visit (or the next attempt of the unfinished one)."""
        ...

    def node_finished(self, message: NodeFinished) -> PortResult:
        """Close the active visit with outcome ``ok``."""
        ...

    def node_failed(self, message: NodeFailed) -> PortResult:
        """Close the active visit with a failure outcome."""
        ...

    def reserve_effect(self, message: EffectReservation) -> PortResult:
        """Reserve an effect before the action runs (adopt, conflict or recovery as typed)."""
        ...

    def settle_effect(self, message: EffectSettlement) -> PortResult:
        """Record how the reserved effect attempt ended."""
        ...

    def publish_update(self, message: UpdatePublished) -> PortResult:
        """Store a durable progress update."""
        ...

    def notify(self, message: NotificationRequested) -> PortResult:
        """Store one notification (adopting a repeat of the same id)."""
        ...

    def request_interaction(self, message: InteractionRequested) -> PortResult:
        """Commit a pending request for the active visit."""
        ...

    def park(self, message: RunParked) -> PortResult:
        """Stop the run without a terminal status."""
        ...

    def finish(self, message: RunFinished) -> PortResult:
        """Give the run its terminal status."""
        ...


def message_to_json(message: object) -> JsonValue:
    """Return a port message or saved record as a JSON object (enums by value).

    Field names stay snake_case; the transport that carries them decides its own envelope.
    """
    if not dataclasses.is_dataclass(message) or isinstance(message, type):
        raise TypeError(f"{type(message).__name__} is not a port message")
    return {
        item.name: _json_field(getattr(message, item.name)) for item in dataclasses.fields(message)
    }


_JSON_SCALARS = frozenset({bool, int, float, str, type(None)})


def _json_field(value: object) -> JsonValue:
    if type(value) in _JSON_SCALARS:  # most fields; exact types (an enum member is not one)
        return value  # type: ignore[return-value]
    if isinstance(value, Enum):
        return _json_field(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return message_to_json(value)
    if isinstance(value, Mapping):
        return {str(key): _json_field(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_field(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{type(value).__name__} cannot cross the port")
