"""The resource-manager authoring API: definitions, reconcile results and conditions.

A resource manager is a Python module that defines one manager at module level::

    from piwf.resource import condition_true, define_resource_manager, settled

    def reconcile(ctx, resource):
        ...                                    # observe, ensure effects and child workflows
        return settled(status={"phase": "ready"}, conditions=[condition_true("Ready", "Done")])

    manager = define_resource_manager(
        name="greeting",
        initial_status=lambda spec: {"phase": "pending"},
        reconcile=reconcile,
        timeout_ms=30_000,
    )

A reconcile returns one result: :func:`settled` (nothing more to do until something changes),
:func:`requeue` (reconcile again at once) or :func:`requeue_after` (again after a delay). Each
may carry a status patch: ``status`` replaces the manager's status object, ``conditions`` are
merged by ``type``, ``finalizers`` replaces the finalizer list. Level-triggered: a reconcile
reads the resource and the outside world afresh each time and never relies on a past event.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from piwf.canonical import JsonValue
from piwf.resource.errors import ResourceManagerDefinitionError

if TYPE_CHECKING:
    from piwf.resource.context import ManagedResource, ReconcileContext

#: A manager name: lowercase letter, then lowercase letters, digits or ``-`` (at most 64).
NAME_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,63}")
DEFAULT_TIMEOUT_MS = 60_000
MAX_TIMEOUT_MS = 3_600_000
#: A requeue delay may not pass one day.
MAX_REQUEUE_AFTER_MS = 86_400_000
#: Encoded size limits of a spec and of a status object (canonical JSON bytes).
MAX_SPEC_BYTES = 256 * 1024
MAX_STATUS_BYTES = 256 * 1024
MAX_CONDITIONS = 32
MAX_FINALIZERS = 32
#: A finalizer is a short name such as ``example.com/cleanup``.
FINALIZER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
CONDITION_TYPE_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")


class ConditionStatus(str, Enum):
    """Whether a condition holds (Kubernetes spelling)."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Condition:
    """One observed condition; the server adds ``observedGeneration`` and the transition time."""

    type: str
    status: ConditionStatus
    reason: str
    message: str | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """The wire form ``{type, status, reason, message?}``."""
        data: dict[str, JsonValue] = {
            "type": self.type,
            "status": self.status.value,
            "reason": self.reason,
        }
        if self.message is not None:
            data["message"] = self.message
        return data


def condition_true(type: str, reason: str, message: str | None = None) -> Condition:
    """A condition that holds."""
    return Condition(type, ConditionStatus.TRUE, reason, message)


def condition_false(type: str, reason: str, message: str | None = None) -> Condition:
    """A condition that does not hold."""
    return Condition(type, ConditionStatus.FALSE, reason, message)


def condition_unknown(type: str, reason: str, message: str | None = None) -> Condition:
    """A condition whose state is not known."""
    return Condition(type, ConditionStatus.UNKNOWN, reason, message)


class ResultKind(str, Enum):
    """What the server does after a reconcile."""

    SETTLED = "settled"
    REQUEUE = "requeue"
    REQUEUE_AFTER = "requeueAfter"


@dataclass(frozen=True)
class ReconcileResult:
    """The outcome of one reconcile; build it with :func:`settled`, :func:`requeue` or
    :func:`requeue_after`. ``None`` fields leave that part of the status unchanged."""

    kind: ResultKind
    after_ms: int | None = None
    status: dict[str, JsonValue] | None = None
    conditions: tuple[Condition, ...] | None = None
    finalizers: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """The wire form sent by the resource runner."""
        patch: dict[str, JsonValue] = {}
        if self.status is not None:
            patch["status"] = self.status
        if self.conditions is not None:
            patch["conditions"] = [condition.to_json() for condition in self.conditions]
        if self.finalizers is not None:
            patch["finalizers"] = list(self.finalizers)
        data: dict[str, JsonValue] = {"kind": self.kind.value, "patch": patch}
        if self.after_ms is not None:
            data["afterMs"] = self.after_ms
        return data


def settled(
    status: dict[str, JsonValue] | None = None,
    conditions: Sequence[Condition] | None = None,
    finalizers: Sequence[str] | None = None,
) -> ReconcileResult:
    """Nothing more to do: the resource leaves the queue until something enqueues it again
    (a spec change, a child workflow finishing, ``piwf resource reconcile``). A deleting
    resource with no finalizer left is removed."""
    return _result(ResultKind.SETTLED, None, status, conditions, finalizers)


def requeue(
    status: dict[str, JsonValue] | None = None,
    conditions: Sequence[Condition] | None = None,
    finalizers: Sequence[str] | None = None,
) -> ReconcileResult:
    """Reconcile again as soon as a slot is free."""
    return _result(ResultKind.REQUEUE, None, status, conditions, finalizers)


def requeue_after(
    after_ms: int,
    status: dict[str, JsonValue] | None = None,
    conditions: Sequence[Condition] | None = None,
    finalizers: Sequence[str] | None = None,
) -> ReconcileResult:
    """Reconcile again after ``after_ms`` milliseconds (1 .. one day)."""
    if isinstance(after_ms, bool) or not isinstance(after_ms, int):
        raise ValueError("requeue_after needs an integer number of milliseconds")
    if not 1 <= after_ms <= MAX_REQUEUE_AFTER_MS:
        raise ValueError(f"requeue_after must lie in 1..{MAX_REQUEUE_AFTER_MS} ms")
    return _result(ResultKind.REQUEUE_AFTER, after_ms, status, conditions, finalizers)


def _result(
    kind: ResultKind,
    after_ms: int | None,
    status: dict[str, JsonValue] | None,
    conditions: Sequence[Condition] | None,
    finalizers: Sequence[str] | None,
) -> ReconcileResult:
    if status is not None and not isinstance(status, dict):
        raise ValueError("status must be a JSON object (a dict)")
    if conditions is not None and not all(isinstance(c, Condition) for c in conditions):
        raise ValueError("conditions must be built with condition_true/false/unknown")
    if finalizers is not None and (
        isinstance(finalizers, str) or not all(isinstance(f, str) for f in finalizers)
    ):
        raise ValueError("finalizers must be a list of strings")
    return ReconcileResult(
        kind=kind,
        after_ms=after_ms,
        status=status,
        conditions=None if conditions is None else tuple(conditions),
        finalizers=None if finalizers is None else tuple(finalizers),
    )


Reconcile = Callable[["ReconcileContext", "ManagedResource"], ReconcileResult]


@dataclass(frozen=True, eq=False)
class ResourceManagerDefinition:
    """One resource manager. Compare by identity; ``source_file`` is the defining module."""

    name: str
    initial_status: Callable[[Any], dict[str, JsonValue]]
    reconcile: Reconcile
    timeout_ms: int
    source_file: str | None = field(default=None, repr=False)


def define_resource_manager(
    name: str,
    initial_status: Callable[[Any], dict[str, JsonValue]],
    reconcile: Reconcile,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> ResourceManagerDefinition:
    """Define a resource manager.

    ``name`` matches ``[a-z][a-z0-9-]*`` (at most 64 characters) and equals the file stem the
    manager is discovered under. ``initial_status(spec)`` returns the first status object (it
    runs in a source-resolver child when a resource is applied; raising refuses the spec).
    ``reconcile(ctx, resource)`` returns a result; it runs in a supervised resource runner and
    is stopped at ``timeout_ms`` (1 .. 3,600,000) even if it ignores ``ctx.signal``.
    Raises :class:`ResourceManagerDefinitionError`.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ResourceManagerDefinitionError(
            f"resource manager name {name!r} must match [a-z][a-z0-9-]* (at most 64 characters)"
        )
    for label, function in (("initial_status", initial_status), ("reconcile", reconcile)):
        if not callable(function):
            raise ResourceManagerDefinitionError(
                f"resource manager {name!r}: {label} is not callable"
            )
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
        raise ResourceManagerDefinitionError(
            f"resource manager {name!r}: timeout_ms must be an int"
        )
    if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise ResourceManagerDefinitionError(
            f"resource manager {name!r}: timeout_ms must lie in 1..{MAX_TIMEOUT_MS}"
        )
    caller = sys._getframe(1).f_globals.get("__file__")
    source_file = str(Path(caller).resolve()) if isinstance(caller, str) else None
    return ResourceManagerDefinition(name, initial_status, reconcile, timeout_ms, source_file)
