"""Managed side effects: a transactional outbox with an ``ambiguous`` state.

An effect is reserved before anything external happens, under a deterministic id derived from
(source aggregate, effect type, idempotency key). Its state machine::

    pending ──begin──▶ applying ──settle──▶ applied | rejected          (terminal)
       │                  │
       │                  ├──uncertain, recovery=idempotent──▶ pending   (retried, same key)
       │                  ├──uncertain, recovery=manual─────▶ ambiguous (never retried alone)
       │                  └──cancel─────────────────────────▶ ambiguous
       └──cancel──▶ cancelled                                            (terminal)

    ambiguous ──operator resolve --applied──▶ applied
    ambiguous ──operator resolve --retry────▶ pending

The request fingerprint is the digest of the canonical payload blob: the same key with the same
payload adopts the stored effect, the same key with another payload is a :class:`Conflict`.
Every change bumps the effect's own revision and writes its event in the same transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal

from piwf import canonical
from piwf.lifecycle import Adopted, Applied, Conflict, EffectStatus, RecoveryRequired
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import EffectAttemptOutcome, EffectOwnerScope, EffectRecovery, ResourceType
from piwf.state.leases import Claim, renew_claim, verify_claim
from piwf.state.records import Actor, ensure_resource, record_change

_SELECT_EFFECT = """
SELECT e.effect_id, e.resource_id, e.source_resource_id, e.source_revision, e.effect_type,
       e.idempotency_key, e.payload_hash, e.recovery, e.owner_scope, e.status,
       e.attempt_count, e.result_hash, e.error_hash, e.external_ref, e.created_at,
       e.updated_at, e.settled_at, r.revision
FROM effects e JOIN resources r ON r.resource_id = e.resource_id
"""

_SELECT_UNSETTLED = (
    _SELECT_EFFECT.replace("FROM effects e", "FROM effects e INDEXED BY effects_pending_idx")
    + " WHERE e.status IN ('pending', 'applying', 'ambiguous') AND e.source_resource_id = ?"
    + " ORDER BY e.created_at, e.effect_id"
)

# What a listing of one source shows: its newest effects and every one not settled, chosen
# from indexes alone (the key index's entries end with the rowid, which SQLite gives each new
# row above every row there is, so a source's effects in rowid order are in the order they were
# reserved), and only those read in full, in that order.
_SHOWN = """
WHERE e.rowid IN (
  SELECT id FROM (SELECT rowid AS id FROM effects WHERE source_resource_id = :source
                  ORDER BY rowid DESC LIMIT :newest)
  UNION
  SELECT rowid FROM effects INDEXED BY effects_pending_idx
  WHERE status IN ('pending', 'applying', 'ambiguous') AND source_resource_id = :source)
ORDER BY e.rowid
"""

_COUNT_OF_SOURCE = "SELECT count(*) FROM effects WHERE source_resource_id = ?"

_INSERT_EFFECT = """
INSERT INTO effects (effect_id, resource_id, source_resource_id, source_revision, effect_type,
                     idempotency_key, payload_hash, recovery, owner_scope, status,
                     attempt_count, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?)
"""

_INSERT_ATTEMPT = """
INSERT INTO effect_attempts (effect_id, attempt_number, owner_id, lease_generation, started_at)
VALUES (?, ?, ?, ?, ?)
"""

_FINISH_OPEN_ATTEMPT = """
UPDATE effect_attempts SET finished_at = ?, outcome = ?, result_hash = ?, error_hash = ?
WHERE effect_id = ? AND attempt_number = ? AND finished_at IS NULL
"""


@dataclass(frozen=True)
class Effect:
    """One effect row with its aggregate revision."""

    effect_id: str
    resource_id: str
    source_resource_id: str
    source_revision: int
    effect_type: str
    idempotency_key: str
    payload_hash: bytes
    recovery: EffectRecovery
    owner_scope: EffectOwnerScope
    status: EffectStatus
    attempt_count: int
    result_hash: bytes | None
    error_hash: bytes | None
    external_ref: str | None
    created_at: int
    updated_at: int
    settled_at: int | None
    revision: int


@dataclass(frozen=True)
class EffectAttempt:
    """One application attempt of an effect."""

    attempt_number: int
    owner_id: str
    lease_generation: int
    started_at: int
    finished_at: int | None
    outcome: EffectAttemptOutcome | None


#: What every effect id starts with.
EFFECT_ID_PREFIX = "effect-"


def effect_id_for(source_resource_id: str, effect_type: str, idempotency_key: str) -> str:
    """Return the deterministic effect id of (source, type, key)."""
    digest = canonical.digest_hex([source_resource_id, effect_type, idempotency_key])
    return f"{EFFECT_ID_PREFIX}{digest[:40]}"


def get_effect(tx: Transaction, effect_id: str) -> Effect | None:
    """Return the effect, or None."""
    row = tx.one(_SELECT_EFFECT + " WHERE e.effect_id = ?", (effect_id,))
    return None if row is None else _effect_from_row(row)


def list_effects(tx: Transaction, source_resource_id: str) -> list[Effect]:
    """Return every effect of one source aggregate, oldest first."""
    rows = tx.all(
        _SELECT_EFFECT + " WHERE e.source_resource_id = ? ORDER BY e.created_at, e.effect_id",
        (source_resource_id,),
    )
    return [_effect_from_row(row) for row in rows]


def list_shown_effects(tx: Transaction, source_resource_id: str, newest: int) -> list[Effect]:
    """Return what a listing of the source aggregate shows: its ``newest`` latest effects and
    every one not settled (pending, applying, ambiguous), in the order they were reserved. The
    cost follows what is shown, not the source's history (:func:`count_effects` counts them
    all)."""
    rows = tx.all(_SELECT_EFFECT + _SHOWN, {"source": source_resource_id, "newest": newest})
    return [_effect_from_row(row) for row in rows]


def list_unsettled_effects(tx: Transaction, source_resource_id: str) -> list[Effect]:
    """Return the source aggregate's effects that are not settled (pending, applying,
    ambiguous), oldest first. Read through the status index, so the cost follows the effects
    still open, not the source's whole history (a channel's sends and edits accumulate)."""
    rows = tx.all(_SELECT_UNSETTLED, (source_resource_id,))
    return [_effect_from_row(row) for row in rows]


def find_effect(tx: Transaction, source_resource_id: str, idempotency_key: str) -> Effect | None:
    """Return the source aggregate's effect reserved under ``idempotency_key`` (oldest), or None."""
    row = tx.one(
        _SELECT_EFFECT + " WHERE e.source_resource_id = ? AND e.idempotency_key = ?"
        " ORDER BY e.created_at, e.effect_id LIMIT 1",
        (source_resource_id, idempotency_key),
    )
    return None if row is None else _effect_from_row(row)


def count_effects(tx: Transaction, source_resource_id: str) -> int:
    """Return how many effects one source aggregate has (read from its key index alone)."""
    return int(tx.scalar(_COUNT_OF_SOURCE, (source_resource_id,)))


def list_attempts(tx: Transaction, effect_id: str) -> list[EffectAttempt]:
    """Return the attempts of one effect in order."""
    rows = tx.all(
        "SELECT attempt_number, owner_id, lease_generation, started_at, finished_at, outcome"
        " FROM effect_attempts WHERE effect_id = ? ORDER BY attempt_number",
        (effect_id,),
    )
    return [
        EffectAttempt(
            attempt_number=row["attempt_number"],
            owner_id=row["owner_id"],
            lease_generation=row["lease_generation"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            outcome=None if row["outcome"] is None else EffectAttemptOutcome(row["outcome"]),
        )
        for row in rows
    ]


def reserve_effect(
    tx: Transaction,
    *,
    source_resource_id: str,
    source_revision: int,
    effect_type: str,
    idempotency_key: str,
    payload: object,
    recovery: EffectRecovery,
    owner_scope: EffectOwnerScope,
    actor: Actor,
    claim: Claim | None = None,
    lease_ms: int | None = None,
) -> Applied[Effect] | Adopted[Effect] | Conflict:
    """Reserve an effect before anything external happens.

    Returns :class:`Adopted` with the stored effect (whatever its status) when the same key was
    reserved with the same payload and recovery, :class:`Conflict` when the key was reserved
    with another request, else :class:`Applied` with a new ``pending`` effect. ``claim``, when
    given, must be the live claim of the source aggregate. Raises
    :class:`~piwf.errors.ClaimLostError` for a stale claim.
    """
    effect_id = effect_id_for(source_resource_id, effect_type, idempotency_key)
    payload_hash = blobs.put_json(tx, payload)
    existing = get_effect(tx, effect_id)
    if existing is not None:
        if claim is not None:
            _check_claim(tx, claim, lease_ms)
        if existing.payload_hash == payload_hash and existing.recovery is recovery:
            return Adopted(existing)
        return Conflict(
            f"effect key reused with another request ({effect_type},"
            f" status {existing.status.value})"
        )
    resource_id = ensure_resource(tx, ResourceType.EFFECT, effect_id)
    record_change(tx, resource_id, 0, "effect.reserved", actor, claim=claim, lease_ms=lease_ms)
    try:
        tx.execute(
            _INSERT_EFFECT,
            (
                effect_id,
                resource_id,
                source_resource_id,
                source_revision,
                effect_type,
                idempotency_key,
                payload_hash,
                recovery.value,
                owner_scope.value,
                tx.now,
                tx.now,
            ),
        )
    except sqlite3.IntegrityError as error:
        return Conflict(f"effect could not be reserved: {error}")
    effect = get_effect(tx, effect_id)
    assert effect is not None
    return Applied(effect)


def begin_attempt(
    tx: Transaction,
    effect_id: str,
    *,
    owner_id: str,
    lease_generation: int,
    actor: Actor,
    claim: Claim | None = None,
    lease_ms: int | None = None,
) -> Applied[Effect] | Adopted[Effect] | Conflict | RecoveryRequired:
    """Move a ``pending`` effect to ``applying`` and open attempt ``attempt_count + 1``.

    Returns :class:`Adopted` for an effect already ``applied`` or ``rejected`` (the caller uses
    the stored result and does not act again), :class:`RecoveryRequired` for an ``ambiguous``
    one, and :class:`Conflict` for one that is ``applying`` or ``cancelled``.
    """
    effect = _require(tx, effect_id)
    if effect.status in (EffectStatus.APPLIED, EffectStatus.REJECTED):
        return Adopted(effect)
    if effect.status is EffectStatus.AMBIGUOUS:
        return RecoveryRequired("effectAmbiguous")
    if effect.status is not EffectStatus.PENDING:
        return Conflict(f"effect is {effect.status.value}, not pending")
    attempt = effect.attempt_count + 1
    _change(tx, effect, "effect.applying", actor, claim, lease_ms)
    tx.execute(_INSERT_ATTEMPT, (effect_id, attempt, owner_id, lease_generation, tx.now))
    tx.execute(
        "UPDATE effects SET status = 'applying', attempt_count = ?, updated_at = ?"
        " WHERE effect_id = ? AND status = 'pending'",
        (attempt, tx.now, effect_id),
    )
    return Applied(_require(tx, effect_id))


def settle_effect(
    tx: Transaction,
    effect_id: str,
    *,
    attempt_number: int,
    outcome: Literal["applied", "rejected"],
    actor: Actor,
    result: object | None = None,
    error: str | None = None,
    external_ref: str | None = None,
    claim: Claim | None = None,
    lease_ms: int | None = None,
) -> Applied[Effect] | Adopted[Effect] | Conflict:
    """Record the definite outcome of the open attempt ``attempt_number``.

    A repeat of the same settlement (same outcome and result) is :class:`Adopted`; any other
    settlement of a settled effect, or of an attempt that is not the open one, is a
    :class:`Conflict`.
    """
    effect = _require(tx, effect_id)
    result_hash = None if result is None else blobs.put_json(tx, result)
    error_hash = None if error is None else blobs.put_text(tx, error)
    if effect.status.value == outcome and effect.attempt_count == attempt_number:
        if effect.result_hash == result_hash and effect.error_hash == error_hash:
            return Adopted(effect)
        return Conflict(f"effect already {outcome} with another result")
    if effect.status is not EffectStatus.APPLYING or effect.attempt_count != attempt_number:
        return Conflict(
            f"effect is {effect.status.value} at attempt {effect.attempt_count},"
            f" not applying attempt {attempt_number}"
        )
    _change(tx, effect, f"effect.{outcome}", actor, claim, lease_ms)
    tx.execute(
        _FINISH_OPEN_ATTEMPT,
        (tx.now, outcome, result_hash, error_hash, effect_id, attempt_number),
    )
    tx.execute(
        "UPDATE effects SET status = ?, result_hash = ?, error_hash = ?, external_ref = ?,"
        " settled_at = ?, updated_at = ? WHERE effect_id = ?",
        (outcome, result_hash, error_hash, external_ref, tx.now, tx.now, effect_id),
    )
    return Applied(_require(tx, effect_id))


def recover_uncertain(
    tx: Transaction,
    effect_id: str,
    *,
    actor: Actor,
    claim: Claim | None = None,
    lease_ms: int | None = None,
) -> Applied[Effect] | Adopted[Effect]:
    """Decide an ``applying`` effect whose outcome is unknown (its executor died).

    ``idempotent`` effects return to ``pending`` (retried under the same key); ``manual``
    effects become ``ambiguous`` and wait for an operator. The open attempt is closed as
    ``interrupted``. Any other status is :class:`Adopted` unchanged.
    """
    effect = _require(tx, effect_id)
    if effect.status is not EffectStatus.APPLYING:
        return Adopted(effect)
    target = (
        EffectStatus.PENDING
        if effect.recovery is EffectRecovery.IDEMPOTENT
        else EffectStatus.AMBIGUOUS
    )
    event = "effect.retry_pending" if target is EffectStatus.PENDING else "effect.ambiguous"
    _change(tx, effect, event, actor, claim, lease_ms)
    _interrupt_open_attempt(tx, effect)
    tx.execute(
        "UPDATE effects SET status = ?, updated_at = ? WHERE effect_id = ?",
        (target.value, tx.now, effect_id),
    )
    return Applied(_require(tx, effect_id))


def cancel_effect(
    tx: Transaction,
    effect_id: str,
    *,
    actor: Actor,
    claim: Claim | None = None,
    lease_ms: int | None = None,
) -> Applied[Effect] | Adopted[Effect]:
    """Cancel an effect with its run: ``pending`` → ``cancelled``, ``applying`` → ``ambiguous``.

    Settled, cancelled and ambiguous effects are :class:`Adopted` unchanged: nothing that may
    have happened outside is ever forgotten.
    """
    effect = _require(tx, effect_id)
    if effect.status is EffectStatus.PENDING:
        _change(tx, effect, "effect.cancelled", actor, claim, lease_ms)
        tx.execute(
            "UPDATE effects SET status = 'cancelled', settled_at = ?, updated_at = ?"
            " WHERE effect_id = ?",
            (tx.now, tx.now, effect_id),
        )
        return Applied(_require(tx, effect_id))
    if effect.status is EffectStatus.APPLYING:
        _change(tx, effect, "effect.ambiguous", actor, claim, lease_ms)
        _interrupt_open_attempt(tx, effect)
        tx.execute(
            "UPDATE effects SET status = 'ambiguous', updated_at = ? WHERE effect_id = ?",
            (tx.now, effect_id),
        )
        return Applied(_require(tx, effect_id))
    return Adopted(effect)


def _not_ambiguous_message(effect: Effect) -> str:
    """Why an effect takes no resolution, naming its run (ids are shell-safe) when it has one."""
    kind, _, key = effect.source_resource_id.partition(":")
    run = key if kind == ResourceType.RUN.value else "RUN_ID"
    text = (
        f"effect is {effect.status.value}, not ambiguous: there is nothing to resolve (only an"
        f" effect that may or may not have happened takes a resolution; piwf run show {run}"
        " lists a run's effects with their status"
    )
    if effect.status is EffectStatus.PENDING and run != "RUN_ID":
        # pending after a --retry: the run's next runner applies it
        text += f"; its run's next runner applies it (piwf run resume {run} if the run is parked)"
    return text + ")"


def resolve_ambiguous(
    tx: Transaction,
    effect_id: str,
    *,
    resolution: Literal["applied", "retry"],
    actor: Actor,
    note: str | None = None,
    owner_ended: bool = False,
) -> Applied[Effect] | Adopted[Effect] | Conflict:
    """Apply an operator's decision to an ``ambiguous`` effect, recorded as an event.

    ``applied`` settles it as applied (the operator saw it happen); ``retry`` returns it to
    ``pending`` so the next attempt runs under the same key. When its owner has ended
    (``owner_ended``: a finished run, which no runner will ever take up again) nothing would
    make that attempt, so ``retry`` settles it ``cancelled`` instead: it did not happen, and a
    restart or fork of the run does it anew. A repeat of the same resolution is
    :class:`Adopted`; an effect that is not ambiguous is a :class:`Conflict`.
    """
    effect = _require(tx, effect_id)
    retried = EffectStatus.CANCELLED if owner_ended else EffectStatus.PENDING
    if effect.status is not EffectStatus.AMBIGUOUS:
        if resolution == "applied" and effect.status is EffectStatus.APPLIED:
            return Adopted(effect)
        if resolution == "retry" and effect.status in (retried, EffectStatus.APPLYING):
            return Adopted(effect)
        return Conflict(_not_ambiguous_message(effect))
    payload = {"resolution": resolution, "note": note}
    if resolution == "retry" and owner_ended:
        payload["settled"] = EffectStatus.CANCELLED.value
    record_change(
        tx,
        effect.resource_id,
        effect.revision,
        f"effect.resolved_{resolution}",
        actor,
        payload=payload,
    )
    if resolution == "applied":
        tx.execute(
            "UPDATE effects SET status = 'applied', settled_at = ?, updated_at = ?"
            " WHERE effect_id = ?",
            (tx.now, tx.now, effect_id),
        )
    elif owner_ended:
        tx.execute(
            "UPDATE effects SET status = 'cancelled', settled_at = ?, updated_at = ?"
            " WHERE effect_id = ?",
            (tx.now, tx.now, effect_id),
        )
    else:
        tx.execute(
            "UPDATE effects SET status = 'pending', updated_at = ? WHERE effect_id = ?",
            (tx.now, effect_id),
        )
    return Applied(_require(tx, effect_id))


def _change(
    tx: Transaction,
    effect: Effect,
    event_type: str,
    actor: Actor,
    claim: Claim | None,
    lease_ms: int | None,
) -> None:
    record_change(
        tx, effect.resource_id, effect.revision, event_type, actor, claim=claim, lease_ms=lease_ms
    )


def _check_claim(tx: Transaction, claim: Claim, lease_ms: int | None) -> None:
    if lease_ms is None:
        verify_claim(tx, claim)
    else:
        renew_claim(tx, claim, lease_ms)


def _interrupt_open_attempt(tx: Transaction, effect: Effect) -> None:
    tx.execute(
        _FINISH_OPEN_ATTEMPT,
        (
            tx.now,
            EffectAttemptOutcome.INTERRUPTED.value,
            None,
            None,
            effect.effect_id,
            effect.attempt_count,
        ),
    )


def _require(tx: Transaction, effect_id: str) -> Effect:
    effect = get_effect(tx, effect_id)
    if effect is None:
        raise LookupError(f"no effect {effect_id}")
    return effect


def _effect_from_row(row: sqlite3.Row) -> Effect:
    return Effect(
        effect_id=row["effect_id"],
        resource_id=row["resource_id"],
        source_resource_id=row["source_resource_id"],
        source_revision=row["source_revision"],
        effect_type=row["effect_type"],
        idempotency_key=row["idempotency_key"],
        payload_hash=bytes(row["payload_hash"]),
        recovery=EffectRecovery(row["recovery"]),
        owner_scope=EffectOwnerScope(row["owner_scope"]),
        status=EffectStatus(row["status"]),
        attempt_count=row["attempt_count"],
        result_hash=None if row["result_hash"] is None else bytes(row["result_hash"]),
        error_hash=None if row["error_hash"] is None else bytes(row["error_hash"]),
        external_ref=row["external_ref"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        settled_at=row["settled_at"],
        revision=row["revision"],
    )


_OPEN_ATTEMPT_GENERATION = """
SELECT lease_generation FROM effect_attempts WHERE effect_id = ? AND finished_at IS NULL
"""

_FINISH_ATTEMPT_AMBIGUOUS = """
UPDATE effect_attempts SET finished_at = ?, outcome = 'ambiguous', error_hash = ?
WHERE effect_id = ? AND attempt_number = ? AND finished_at IS NULL
"""

_SET_EFFECT_AMBIGUOUS = """
UPDATE effects SET status = 'ambiguous', error_hash = ?, updated_at = ?
WHERE effect_id = ? AND status = 'applying'
"""


def open_attempt_generation(tx: Transaction, effect_id: str) -> int | None:
    """The claim generation of the effect's open attempt, or None when none is open."""
    found = tx.scalar(_OPEN_ATTEMPT_GENERATION, (effect_id,))
    return None if found is None else int(found)


def close_ambiguous(
    tx: Transaction, effect_id: str, attempt_number: int, error_hash: bytes | None
) -> None:
    """Close an ``applying`` effect and its open attempt ``ambiguous`` (an indeterminate outcome).

    Unlike :func:`settle_effect` this records no change of its own: the caller has already
    recorded the ``effect.ambiguous`` change under its claim in the same transaction.
    """
    tx.execute(_FINISH_ATTEMPT_AMBIGUOUS, (tx.now, error_hash, effect_id, attempt_number))
    tx.execute(_SET_EFFECT_AMBIGUOUS, (error_hash, tx.now, effect_id))
