"""Injected time: every durable timestamp is integer epoch milliseconds from a :class:`Clock`.

Stores and the server read time only through a clock object, so tests can move time without
sleeping. In-process timeouts (deadlines for a pipe read, a frame, a child start) use
:func:`time.monotonic` separately, because wall-clock jumps must not stretch them.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of wall-clock time in integer epoch milliseconds."""

    def now_ms(self) -> int:
        """Return the current time in epoch milliseconds."""
        ...


class SystemClock:
    """The real wall clock."""

    def now_ms(self) -> int:
        """Return :func:`time.time` in whole milliseconds."""
        return time.time_ns() // 1_000_000


class FakeClock:
    """A clock that moves only when a test moves it."""

    def __init__(self, start_ms: int = 1_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        """Return the current fake time."""
        return self._now

    def advance(self, delta_ms: int) -> int:
        """Move time forward by ``delta_ms`` (never backwards) and return the new time."""
        if delta_ms < 0:
            raise ValueError("a fake clock only moves forward")
        self._now += delta_ms
        return self._now

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms``; tests use this to imitate a wall-clock jump."""
        self._now = now_ms
