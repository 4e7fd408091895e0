"""Retry policies: a failed try of a ``compute``, ``action`` or ``shell`` visit, tried again
after a durable back-off.

::

    try t fails ── the policy retries it? ──yes──▶ node_failed(retry_at) : try t is kept as a
                                                   failed attempt, attempt N+1 opens pending
                                                   until retry_at, the run parks (a timer: no
                                                   child, no slot) and wakes into try t + 1
                 └─no──▶ node_failed : the visit ends; ``$result.outcome`` routes the failure

A *try* is one execution the policy counts; a crash retry of the same try (the runner died)
opens a new attempt but is not a new try, so ``max_attempts`` counts exactly what the policy
decided. Each try of an ``action`` reserves its own managed effect (the effect key names the
try), so a try whose effect was rejected is never adopted by the next one. A
``manual_effect`` cannot take a policy: its uncertain outcomes need a person, never a retry.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.errors import WorkflowDefinitionError
from piwf.workflow.context import Outcome

#: Tries a policy may allow (the first one included).
MAX_ATTEMPTS = 100
#: Longest back-off between two tries (about 24 days, as a node timeout).
MAX_BACKOFF_MS = 2**31 - 1
MAX_MULTIPLIER = 100.0


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how late a failed try runs again; create it with :func:`retry_policy`.

    ``retry_on`` is ``None`` for every failure (``failed`` or ``timed_out``, never
    ``cancelled``), or the exception classes whose instances are retried. A node that timed out
    counts as :class:`TimeoutError`, a shell command that exited non-zero as
    :class:`subprocess.CalledProcessError`.
    """

    max_attempts: int
    backoff_ms: int
    max_backoff_ms: int
    multiplier: float
    retry_on: tuple[type[BaseException], ...] | None

    def delay_ms(self, failed_try: int) -> int:
        """The back-off after try ``failed_try`` (1-based): ``backoff_ms * multiplier^(t-1)``,
        at most ``max_backoff_ms``."""
        delay = self.backoff_ms * self.multiplier ** (failed_try - 1)
        return int(min(delay, self.max_backoff_ms))

    def retries(
        self, failed_try: int, outcome: Outcome, error: BaseException | None, exited: bool
    ) -> bool:
        """Whether try ``failed_try``, which ended ``outcome`` (raising ``error``, or a shell
        command that ``exited`` non-zero), runs again."""
        if failed_try >= self.max_attempts or outcome not in (Outcome.FAILED, Outcome.TIMED_OUT):
            return False
        if self.retry_on is None:
            return True
        if outcome is Outcome.TIMED_OUT:
            error = TimeoutError()
        elif exited:
            error = subprocess.CalledProcessError(1, "")
        return error is not None and isinstance(error, self.retry_on)

    def structure(self) -> JsonValue:
        """The snapshot form (exception classes by qualified name)."""
        retry_on: JsonValue = (
            None
            if self.retry_on is None
            else [f"{cls.__module__}.{cls.__qualname__}" for cls in self.retry_on]
        )
        return {
            "maxAttempts": self.max_attempts,
            "backoffMs": self.backoff_ms,
            "maxBackoffMs": self.max_backoff_ms,
            "multiplier": self.multiplier,
            "retryOn": retry_on,
        }


def retry_policy(
    *,
    max_attempts: int = 3,
    backoff_ms: int = 1000,
    max_backoff_ms: int = 60_000,
    multiplier: float = 2.0,
    retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
) -> RetryPolicy:
    """Return a retry policy for ``compute(..., retry=...)``, ``action`` and ``shell``.

    ``max_attempts`` counts every try, the first included (``1`` never retries). The back-off
    before try ``t + 1`` is ``backoff_ms * multiplier^(t-1)``, at most ``max_backoff_ms``; it is a
    durable timer, so the run holds no child and no slot while it waits and survives restarts.
    ``retry_on`` limits retries to these exception classes (default: every failure).
    """
    for name, value, low, high in (
        ("max_attempts", max_attempts, 1, MAX_ATTEMPTS),
        ("backoff_ms", backoff_ms, 0, MAX_BACKOFF_MS),
        ("max_backoff_ms", max_backoff_ms, 0, MAX_BACKOFF_MS),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise WorkflowDefinitionError(
                f"retry_policy(): {name} must be an integer in {low}..{high}"
            )
    if max_backoff_ms < backoff_ms:
        raise WorkflowDefinitionError("retry_policy(): max_backoff_ms must be at least backoff_ms")
    if (
        isinstance(multiplier, bool)
        or not isinstance(multiplier, (int, float))
        or not 1.0 <= multiplier <= MAX_MULTIPLIER
    ):
        raise WorkflowDefinitionError(
            f"retry_policy(): multiplier must be a number in 1..{MAX_MULTIPLIER:g}"
        )
    return RetryPolicy(
        max_attempts=max_attempts,
        backoff_ms=backoff_ms,
        max_backoff_ms=max_backoff_ms,
        multiplier=float(multiplier),
        retry_on=_exception_classes(retry_on),
    )


def _exception_classes(
    value: type[BaseException] | Sequence[type[BaseException]] | None,
) -> tuple[type[BaseException], ...] | None:
    if value is None:
        return None
    classes: object = (value,) if isinstance(value, type) else value
    if (
        isinstance(classes, (str, bytes))
        or not isinstance(classes, (tuple, list))
        or not classes
        or not all(isinstance(cls, type) and issubclass(cls, Exception) for cls in classes)
    ):
        raise WorkflowDefinitionError(
            "retry_policy(): retry_on must be an exception class or a non-empty list of them, "
            "such as (TimeoutError, ConnectionError)"
        )
    return tuple(classes)


def check_retry(factory: str, retry: object, *, manual: bool = False) -> RetryPolicy | None:
    """Return ``retry`` when a ``factory`` node may take it; refuse a manual effect's."""
    if retry is None:
        return None
    if not isinstance(retry, RetryPolicy):
        raise WorkflowDefinitionError(f"{factory}(): retry must be retry_policy(...) or None")
    if manual:
        raise WorkflowDefinitionError(
            f"{factory}(): a manual_effect cannot be retried automatically (its uncertain "
            "outcomes need a person); declare an idempotent_effect or drop retry"
        )
    return retry


def retry_structure(structure: dict[str, JsonValue], retry: RetryPolicy | None) -> None:
    """Add ``retry`` to a node's snapshot form when it has one (nodes without a policy keep
    their digest)."""
    if retry is not None:
        structure["retry"] = retry.structure()
