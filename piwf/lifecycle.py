"""The shared vocabulary: one enum per lifecycle that more than one layer names, one result family.

The workflow engine (which imports no storage) and the state store (which imports no server)
both speak of runs, commands, requests, notifications and effects; each of those lifecycles is
declared here once, so a value can never mean one thing to the engine and another to the store.
A lifecycle that a table stores is mirrored by that table's ``CHECK`` list, and a test compares
the two (``tests/state/test_schema.py``).

Every lifecycle operation, in the store and behind the workflow port alike, answers with one of
four typed results, never a bare boolean::

    Applied(value)        this call made the change; ``value`` is what it saved
    Adopted(value)        an equal change was already committed; ``value`` is that saved value
    Conflict(evidence)    the stored state contradicts the request; nothing was written
    RecoveryRequired(reason)  the target waits for an operator; nothing was written

``evidence`` and ``reason`` are safe to show: ids, states and revisions, never payloads or tokens.
There is exactly one class of each name, so an ``isinstance`` check cannot test against a
look-alike from another layer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Generic, Literal, TypeVar, Union

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, Enum):
        """A ``str`` enum whose ``str()`` and ``format()`` give the value (Python 3.10)."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


__all__ = [
    "TERMINAL_RUN_STATUSES",
    "Adopted",
    "AnsweredBy",
    "Applied",
    "CommandKind",
    "Conflict",
    "EffectStatus",
    "InteractionKind",
    "LifecycleResult",
    "Lineage",
    "NotifyKind",
    "RecoveryRequired",
    "RunStatus",
    "StrEnum",
]


# Runs --------------------------------------------------------------------------------------


class RunStatus(StrEnum):
    """The status of a run; pause is a flag beside it, never a status.

    ``runs.status`` stores every member but ``PARKED``: that one is how the engine reads a
    ``running`` run whose queue row is parked (it stopped at a durable boundary and may resume).
    """

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    PARKED = "parked"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Return whether no command other than restart may follow."""
        return self in TERMINAL_RUN_STATUSES


TERMINAL_RUN_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED}
)


class CommandKind(StrEnum):
    """The one explicit command a runner generation executes after ``ready``."""

    START = "start"
    RESUME = "resume"
    CONTINUE = "continue"
    RESTART = "restart"


class Lineage(StrEnum):
    """How a run came to exist: a root start, a restart of a terminal run, or a fork of a run
    from one of its steps (it starts at that node with the outputs recorded before it).

    ``runs.lineage_kind`` stores ``restart`` or ``fork`` and leaves a root run's column NULL.
    """

    ROOT = "root"
    RESTART = "restart"
    FORK = "fork"


# Requests and notifications ----------------------------------------------------------------


class InteractionKind(StrEnum):
    """What kind of answer a node visit waits for."""

    CHECKPOINT = "checkpoint"
    HUMAN_DECISION = "human_decision"
    AGENT = "agent"


class AnsweredBy(StrEnum):
    """Who answered a request; a protected decision accepts only a human or its policy.

    ``expired`` closes a decision whose deadline passed with no default response: the engine
    ends the visit ``timed_out`` and routes on ``$result.outcome``.
    """

    HUMAN = "human"
    CLIENT = "client"  # an authorised client answered a (non-protected) checkpoint
    TIMEOUT_POLICY = "timeout_policy"
    EXPIRED = "expired"
    SESSION = "session"
    #: An interactive agent step's session ended more turns than the reminder rule allows
    #: without a submission: the visit fails ``missingSubmission``.
    UNPRODUCTIVE = "unproductive"


class NotifyKind(StrEnum):
    """Whether a notification reports progress or a final result."""

    PROGRESS = "progress"
    FINAL = "final"


# Effects -----------------------------------------------------------------------------------


class EffectStatus(StrEnum):
    """``pending -> applying -> applied | rejected | ambiguous``; ``cancelled`` from pending."""

    PENDING = "pending"
    APPLYING = "applying"
    APPLIED = "applied"
    REJECTED = "rejected"
    AMBIGUOUS = "ambiguous"
    CANCELLED = "cancelled"


# Results -----------------------------------------------------------------------------------

T = TypeVar("T")


@dataclass(frozen=True)
class Applied(Generic[T]):
    """The change was made by this call; ``value`` is what it saved."""

    value: T
    kind: ClassVar[Literal["applied"]] = "applied"


@dataclass(frozen=True)
class Adopted(Generic[T]):
    """An equal change was already committed; nothing new was written."""

    value: T
    kind: ClassVar[Literal["adopted"]] = "adopted"


@dataclass(frozen=True)
class Conflict:
    """The stored state contradicts the request; nothing was written."""

    evidence: str
    kind: ClassVar[Literal["conflict"]] = "conflict"


@dataclass(frozen=True)
class RecoveryRequired:
    """The target waits for an explicit operator action; nothing was written."""

    reason: str
    kind: ClassVar[Literal["recovery_required"]] = "recovery_required"


LifecycleResult = Union[Applied[T], Adopted[T], Conflict, RecoveryRequired]  # noqa: UP007
