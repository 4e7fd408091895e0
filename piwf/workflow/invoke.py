"""Calling workflow code: deadlines, cancellation and JSON checks at the port boundary.

A callback with no deadline runs inline. One with a deadline runs in a daemon thread; when the
deadline passes first, the node's signal is set to ``timed_out`` and the engine moves on.
Python cannot stop the thread, so only a cooperative callback (one that watches ``ctx.signal``)
actually stops; in the server the runner child is killed at the deadline instead.

Only :class:`Exception` is treated as a workflow failure. Any other ``BaseException``
(``KeyboardInterrupt``, ``SystemExit``) propagates and ends the command like a crash.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import MAX_VALUE_BYTES
from piwf.errors import CanonicalJsonError
from piwf.workflow.context import CancellationSignal, Outcome


@dataclass(frozen=True)
class Returned:
    """The callback returned ``value``."""

    value: Any


@dataclass(frozen=True)
class Raised:
    """The callback raised ``error``."""

    error: Exception


@dataclass(frozen=True)
class Stopped:
    """The deadline passed before the callback returned."""

    outcome: Outcome


CallOutcome: TypeAlias = Returned | Raised | Stopped


def invoke(
    callback: Callable[[], Any], *, timeout_ms: int | None, signal: CancellationSignal
) -> CallOutcome:
    """Run ``callback`` and report how it ended; a deadline sets ``signal`` to ``timed_out``."""
    if timeout_ms is None:
        try:
            return Returned(callback())
        except Exception as error:
            return Raised(error)
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = callback()
        except BaseException as error:
            box["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name="piwf-node", daemon=True).start()
    if not done.wait(timeout_ms / 1000):
        signal.cancel(Outcome.TIMED_OUT.value)
        return Stopped(Outcome.TIMED_OUT)
    if "error" in box:
        failure = box["error"]
        if not isinstance(failure, Exception):
            raise failure
        return Raised(failure)
    return Returned(box["value"])


def failure_outcome(signal: CancellationSignal) -> Outcome:
    """Return the outcome of a callback that raised: its signal's reason, else ``failed``."""
    if signal.reason == Outcome.TIMED_OUT.value:
        return Outcome.TIMED_OUT
    if signal.cancelled:
        return Outcome.CANCELLED
    return Outcome.FAILED


def to_json(value: object) -> JsonValue:
    """Return ``value`` as plain canonical JSON (pydantic models by ``model_dump``).

    Raises :class:`piwf.errors.CanonicalJsonError` when the value cannot cross the port: it
    is not JSON, or (reason ``tooLarge``) its JSON is over :data:`MAX_VALUE_BYTES`. The
    round trip also gives the caller a private copy, so later mutation cannot leak.
    """
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        value = dump(mode="json")
    try:
        data = canonical.encode(value)
    except CanonicalJsonError as error:
        where = canonical.where(error)
        if not where:
            raise
        raise CanonicalJsonError(error.reason, f"{error} (at {where})") from None
    if len(data) > MAX_VALUE_BYTES:
        raise CanonicalJsonError(
            "tooLarge",
            f"it is {len(data):,} bytes of JSON, over the {MAX_VALUE_BYTES:,} bytes one stored "
            "value may hold; keep large data outside the run (a file, a URL) and pass where it is",
        )
    return canonical.parse(data)


def unusable(what: str, error: CanonicalJsonError) -> str:
    """The failure text for a value ``what`` that :func:`to_json` refused with ``error``."""
    if error.reason == "tooLarge":
        return f"{what} is too large: {error}"
    return f"{what} is not JSON: {error}"
