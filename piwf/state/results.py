"""Typed results of lifecycle operations: never a bare boolean.

- :class:`Applied`: this call made the change; ``value`` is the saved value.
- :class:`Adopted`: an equal change was already committed; ``value`` is that saved value.
- :class:`Conflict`: the stored state contradicts the request; ``evidence`` says how
  (safe to show: ids, states and revisions, never payloads or tokens).
- :class:`RecoveryRequired`: the target is parked for an operator; ``reason`` is the saved one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, Union

T = TypeVar("T")


@dataclass(frozen=True)
class Applied(Generic[T]):
    """The change was made by this call."""

    value: T
    kind: Literal["applied"] = "applied"


@dataclass(frozen=True)
class Adopted(Generic[T]):
    """An equal change was already committed; nothing new was written."""

    value: T
    kind: Literal["adopted"] = "adopted"


@dataclass(frozen=True)
class Conflict:
    """The stored state contradicts the request; nothing was written."""

    evidence: str
    kind: Literal["conflict"] = "conflict"


@dataclass(frozen=True)
class RecoveryRequired:
    """The target waits for an explicit operator action; nothing was written."""

    reason: str
    kind: Literal["recovery_required"] = "recovery_required"


LifecycleResult = Union[Applied[T], Adopted[T], Conflict, RecoveryRequired]  # noqa: UP007
