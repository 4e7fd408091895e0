"""Execution identities derived by the engine, never supplied by workflow code.

A node visit is ``(run id, full compiled path, visit number)``. Managed-effect keys, request ids
and notification ids are SHA-256 digests of the canonical JSON of that visit (plus the effect
type for effects), so a crash retry of the same visit derives the same identity, a later visit
of the same node derives a new one, and two mounts of one workflow never share one.
"""

from __future__ import annotations

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import REQUEST_ID_PREFIX


def effect_key(run_id: str, effect_type: str, path: str, visit: int, try_number: int = 1) -> str:
    """Return the internal idempotency key of a managed effect.

    Each try of a retry policy after the first has its own key, so a rejected try is never
    adopted by the next; crash retries of one try share it.
    """
    parts: list[JsonValue] = ["piwf.effect.v1", run_id, effect_type, path, visit]
    if try_number > 1:
        parts.append(try_number)
    return "effect-" + canonical.digest_hex(parts)


def attempt_id(run_id: str, path: str, visit: int, attempt: int) -> str:
    """Return the id of one attempt of one node visit (the store keys ``node_attempts`` by it)."""
    return "attempt-" + canonical.digest_hex(["piwf.attempt.v1", run_id, path, visit, attempt])[:40]


def request_id(run_id: str, path: str, visit: int) -> str:
    """Return the exact request id of the interaction a visit opens."""
    return REQUEST_ID_PREFIX + canonical.digest_hex(["piwf.request.v1", run_id, path, visit])[:40]


def notification_id(run_id: str, path: str, visit: int) -> str:
    """Return the stable id of the notification a visit proposes."""
    return "notification-" + canonical.digest_hex(["piwf.notify.v1", run_id, path, visit])[:40]


def request_fingerprint(request: JsonValue) -> str:
    """Return the hex SHA-256 of an effect request's canonical JSON."""
    return canonical.digest_hex(request)
