"""Durable timers: ``sleep`` and ``wait_until`` nodes.

A timer visit resolves its absolute wake time once and commits it with the visit's start; the
run then parks (reason ``timer``) and holds no runner and no slot until that instant, across
server restarts. Waking is a ``resume`` like any other: the engine finds the committed wake
time, never computes it again, and finishes the visit with ``{"wake_at_ms", "woke_at_ms"}``::

    node_started(wake_at) ─▶ park(timer) ─ … the server launches a runner at wake_at … ─▶
    node_finished({"wake_at_ms", "woke_at_ms"})

A wake time already past (``sleep(0)``, ``wait_until`` in the past) finishes the visit at once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from piwf.errors import WorkflowDefinitionError
from piwf.workflow.nodes import TimerNode

if TYPE_CHECKING:
    from piwf.canonical import JsonValue
    from piwf.workflow.context import NodeContext

#: Longest sleep, and latest wake time from now: 366 days.
MAX_SLEEP_MS = 366 * 24 * 3600 * 1000

Duration = int | timedelta
Instant = int | datetime


def sleep(duration: Duration | Callable[[NodeContext], Duration]) -> TimerNode:
    """Return a node that waits ``duration`` (milliseconds or a ``timedelta``) from the start
    of its visit, or the duration a callable of the context returns."""
    if callable(duration):
        return TimerNode(duration_ms=duration)
    return TimerNode(duration_ms=_duration_ms("sleep()", duration))


def wait_until(at: Instant | Callable[[NodeContext], Instant]) -> TimerNode:
    """Return a node that waits until ``at``: epoch milliseconds or a timezone-aware
    ``datetime``, or the instant a callable of the context returns."""
    return TimerNode(until_ms=at if callable(at) else _instant_ms("wait_until()", at))


def resolve_wake_at(node: TimerNode, ctx: NodeContext, started_at_ms: int) -> int:
    """Return the absolute wake time of a visit of ``node`` that started at ``started_at_ms``.

    Raises :class:`ValueError` naming the problem when a callable fails or returns something
    that is not a time; the visit then fails (and ``$result.outcome`` can route it).
    """
    if node.duration_ms is not None:
        spec: Any = node.duration_ms
        value = _called("sleep()", spec, ctx) if callable(spec) else spec
        return started_at_ms + _duration_ms("sleep()", value)
    spec = node.until_ms
    value = _called("wait_until()", spec, ctx) if callable(spec) else spec
    wake_at = _instant_ms("wait_until()", value)
    if wake_at - started_at_ms > MAX_SLEEP_MS:
        raise ValueError(f"wait_until(): {wake_at} is more than 366 days away")
    return wake_at


def timer_output(wake_at_ms: int, woke_at_ms: int) -> JsonValue:
    """The output of a timer visit that woke at ``woke_at_ms``."""
    return {"wake_at_ms": wake_at_ms, "woke_at_ms": woke_at_ms}


def _called(factory: str, spec: Callable[[NodeContext], Any], ctx: NodeContext) -> Any:
    try:
        return spec(ctx)
    except Exception as error:
        raise ValueError(f"{factory} callable failed: {type(error).__name__}: {error}") from error


def _duration_ms(factory: str, value: object) -> int:
    if isinstance(value, timedelta):
        value = int(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SLEEP_MS:
        raise _problem(
            factory, f"a duration must be 0..{MAX_SLEEP_MS} ms or a timedelta, got {value!r}"
        )
    return value


def _instant_ms(factory: str, value: object) -> int:
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise _problem(
                factory, "a datetime must be timezone-aware (datetime.now(timezone.utc))"
            )
        return int(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _problem(
            factory, f"an instant must be epoch milliseconds or an aware datetime, got {value!r}"
        )
    return value


def _problem(factory: str, text: str) -> Exception:
    """A static argument is a definition error; a computed one fails the visit."""
    return _TimerArgumentError(f"{factory}: {text}")


class _TimerArgumentError(WorkflowDefinitionError, ValueError):
    """A timer argument that is not a time (a definition error when static)."""
