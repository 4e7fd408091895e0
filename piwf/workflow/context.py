"""What workflow callbacks see: the node context, node results and the cancellation signal.

A :class:`NodeContext` is a frozen snapshot taken when a callback starts. Inside an included
workflow it is child-local: ``input``, ``outputs`` and ``results`` belong to the mounted
workflow, while ``path`` is the full compiled path (``docs/workspace/inspect``) that identifies
the visit durably.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from piwf.canonical import JsonValue


class Outcome(str, Enum):
    """How one node visit ended; ``$result.outcome`` routes on these values."""

    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class NodeResult:
    """The record of one finished node visit, including failures.

    ``node`` is the id local to the workflow that declares it; ``path`` is the full compiled
    path. ``output`` is set only for ``ok``; ``error`` only otherwise. ``attempt`` counts the
    visit's crash retries (1 unless a runner died during the visit); routing does not see it.
    """

    node: str
    path: str
    kind: str
    outcome: Outcome
    visit: int
    started_at_ms: int
    finished_at_ms: int
    output: JsonValue = None
    error: str | None = None
    attempt: int = 1

    @property
    def duration_ms(self) -> int:
        """Return the wall-clock time between start and finish."""
        return self.finished_at_ms - self.started_at_ms

    def structure(self) -> dict[str, JsonValue]:
        """Return the JSON form used by ``$result`` routing and effect requests."""
        return {
            "node": self.node,
            "path": self.path,
            "kind": self.kind,
            "outcome": self.outcome.value,
            "visit": self.visit,
            "startedAtMs": self.started_at_ms,
            "finishedAtMs": self.finished_at_ms,
            "durationMs": self.duration_ms,
            "output": self.output,
            "error": self.error,
        }


class NodeCancelledError(Exception):
    """Raised by :meth:`CancellationSignal.raise_if_cancelled` once the signal is set."""


class CancellationSignal:
    """A one-way flag set on node timeout or run cancellation; callbacks poll or wait on it.

    A child signal is set whenever its parent is set, so a run-level signal reaches the node
    that is running. Only cooperative callbacks stop: Python cannot interrupt a function.
    """

    def __init__(self, parent: CancellationSignal | None = None) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._children: list[CancellationSignal] = []
        self._parent = parent
        if parent is not None:
            parent._adopt(self)

    @property
    def cancelled(self) -> bool:
        """Return whether this signal (or an ancestor) has been set."""
        return self._event.is_set()

    @property
    def reason(self) -> str | None:
        """Return ``"timed_out"``, ``"cancelled"`` or another reason once set, else ``None``."""
        return self._reason

    def cancel(self, reason: str = "cancelled") -> None:
        """Set the signal (first reason wins) and every child signal."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
            children = list(self._children)
        self._event.set()
        for child in children:
            child.cancel(reason)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the signal is set or ``timeout_s`` passes; return whether it is set."""
        return self._event.wait(timeout_s)

    def raise_if_cancelled(self) -> None:
        """Raise :class:`NodeCancelledError` when the signal is set."""
        if self._event.is_set():
            raise NodeCancelledError(f"node stopped: {self._reason}")

    def detach(self) -> None:
        """Stop receiving the parent's cancellation (called when the node visit ends)."""
        if self._parent is not None:
            self._parent._release(self)

    def _adopt(self, child: CancellationSignal) -> None:
        with self._lock:
            reason = self._reason
            if reason is None:
                self._children.append(child)
        if reason is not None:
            child.cancel(reason)

    def _release(self, child: CancellationSignal) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)


UpdatePublisher = Callable[[str, str, object], None]


def _no_updates(update_type: str, key: str, data: object) -> None:
    raise RuntimeError("publish_update is only available while a node visit is running")


@dataclass(frozen=True)
class NodeContext:
    """The frozen snapshot a workflow callback receives.

    ``input`` is the parsed workflow input (child-local inside a mount); ``outputs`` holds the
    accepted output of each local node that last finished ``ok`` (latest visit wins; a failed
    visit removes it); ``results`` holds the last :class:`NodeResult` of each local node,
    failures included. A mount appears in its parent as ``{"exit": name, "output": value}``.
    ``settings`` is the attempt's copy of the live settings; a change accepted while the
    attempt runs reaches only later attempts.
    """

    input: Any
    outputs: Mapping[str, JsonValue]
    results: Mapping[str, NodeResult]
    signal: CancellationSignal
    run_id: str
    path: str
    node: str
    visit: int
    attempt: int
    #: The attempt's fixed copy of its workflow's live settings, parsed (``None`` when the
    #: workflow declares none): :mod:`piwf.workflow.settings`.
    settings: Any = None
    _publisher: UpdatePublisher = field(default=_no_updates, repr=False, compare=False)

    def publish_update(self, update_type: str, key: str, data: object) -> None:
        """Durably publish progress; the latest update per ``(update_type, key)`` is kept.

        ``data`` must be canonical JSON (at most 64 KiB encoded). Raises ``ValueError`` for bad
        arguments; errors from the durable port (for example claim loss) propagate and stop the
        run even if the callback catches them.
        """
        self._publisher(update_type, key, data)
