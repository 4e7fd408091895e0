"""Effect markers: what an ``action`` or ``shell`` node declares about its side effect.

``idempotent_effect(type)`` says the effect is safe to retry after an uncertain exit (the
external system deduplicates or the action checks); ``manual_effect(type)`` says an operator
must review it. The marker is structure: it is part of the definition snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from piwf.canonical import JsonValue
from piwf.errors import WorkflowDefinitionError

MAX_EFFECT_TYPE_CHARS = 256


class Recovery(str, Enum):
    """What happens to a managed effect after an uncertain runner exit."""

    #: The effect returns to pending and is retried (needs an external key or read-back check).
    IDEMPOTENT = "idempotent"
    #: The effect becomes ambiguous and the run parks until an operator decides.
    MANUAL = "manual"


@dataclass(frozen=True)
class Effect:
    """A managed-effect marker: the effect ``type`` and its ``recovery`` contract.

    The internal idempotency key is never part of the marker: the engine derives it from the
    run id, this type, the full compiled node path and the visit number.
    """

    type: str
    recovery: Recovery

    def structure(self) -> dict[str, JsonValue]:
        """Return the snapshot form ``{type, recovery}``."""
        return {"type": self.type, "recovery": self.recovery.value}


def idempotent_effect(effect_type: str) -> Effect:
    """Declare an effect that is safe to retry after an uncertain exit.

    Use it only when the external system deduplicates (an idempotency key sent in the request)
    or the action checks whether it already applied. ``effect_type`` is trimmed and must then be
    1..256 characters; otherwise :class:`WorkflowDefinitionError` is raised.
    """
    return Effect(_effect_type(effect_type), Recovery.IDEMPOTENT)


def manual_effect(effect_type: str) -> Effect:
    """Declare an effect that an operator must review after an uncertain exit.

    After a crash or timeout while it was applying, the effect becomes ambiguous, the run parks
    with ``effectAmbiguous`` and nothing retries it automatically.
    """
    return Effect(_effect_type(effect_type), Recovery.MANUAL)


def _effect_type(value: object) -> str:
    if not isinstance(value, str):
        raise WorkflowDefinitionError(f"effect type must be a string, got {type(value).__name__}")
    trimmed = value.strip()
    if not 1 <= len(trimmed) <= MAX_EFFECT_TYPE_CHARS:
        raise WorkflowDefinitionError(
            f"effect type must be 1..{MAX_EFFECT_TYPE_CHARS} characters after trimming, "
            f"got {len(trimmed)}"
        )
    return trimmed
