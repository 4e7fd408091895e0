"""Claims on aggregates: who may write, under which generation, until when.

A lease row per resource holds the current owner, the SHA-256 of its random token, the lease
times and a generation that only ever grows::

    free (gen g) --claim--> owned (gen g+1) --renew--> owned (gen g+1, later expiry)
         ^                        |   \\--(expiry passes)--> expired: cannot renew itself
         |                        |                            |
         +-------release----------+          claim by anyone: gen g+2 (fences the old token)

- A new owner always gets generation+1, set by compare-and-set on the old generation.
- Renewal needs the exact owner, token hash and generation and an expiry still in the future.
- Release clears the owner fields and keeps the generation.
- Every failed check raises :class:`~piwf.errors.ClaimLostError` with exactly one reason.

The raw token lives only in the :class:`Claim` object of the process that claimed; the database
stores its hash, and neither ever appears in a message, log or ``repr``.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field, replace

from piwf.errors import ClaimLostError, ClaimLostReason
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.state.database import Transaction
from piwf.state.enums import ActorType, OwnerType

_SELECT_LEASE = """
SELECT generation, owner_type, owner_id, token_hash, expires_at
FROM leases WHERE resource_id = ?
"""

_ENSURE_LEASE = """
INSERT INTO leases (resource_id, generation) VALUES (?, 0)
ON CONFLICT (resource_id) DO NOTHING
"""

_TAKE_LEASE = """
UPDATE leases
SET generation = generation + 1, owner_type = ?, owner_id = ?, token_hash = ?,
    acquired_at = ?, heartbeat_at = ?, expires_at = ?
WHERE resource_id = ? AND generation = ?
"""

_RENEW_LEASE = """
UPDATE leases SET heartbeat_at = ?, expires_at = ?
WHERE resource_id = ? AND owner_type = ? AND owner_id = ? AND token_hash = ?
  AND generation = ? AND expires_at > ?
"""

_RELEASE_LEASE = """
UPDATE leases
SET owner_type = NULL, owner_id = NULL, token_hash = NULL,
    acquired_at = NULL, heartbeat_at = NULL, expires_at = NULL
WHERE resource_id = ? AND owner_type = ? AND owner_id = ? AND token_hash = ?
  AND generation = ? AND expires_at > ?
"""


def hash_token(token: str) -> bytes:
    """Return the stored form of a claim token."""
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True)
class Claim:
    """The in-memory proof of one claim; ``token`` never leaves this process."""

    resource_id: str
    owner_type: OwnerType
    owner_id: str
    generation: int
    expires_at: int
    token: str = field(repr=False)

    @property
    def token_hash(self) -> bytes:
        """SHA-256 of the token, as stored in ``leases``."""
        return hash_token(self.token)


@dataclass(frozen=True)
class LeaseState:
    """What a lease row says now (no token hash: callers never need it)."""

    resource_id: str
    generation: int
    owner_type: OwnerType | None
    owner_id: str | None
    expires_at: int | None

    def is_live(self, now: int) -> bool:
        """Whether an owner holds the lease and its expiry is still in the future."""
        return self.owner_id is not None and self.expires_at is not None and self.expires_at > now


def read_lease(tx: Transaction, resource_id: str) -> LeaseState | None:
    """Return the lease of ``resource_id``, or None when it has never been claimed."""
    row = tx.one(_SELECT_LEASE, (resource_id,))
    if row is None:
        return None
    return LeaseState(
        resource_id=resource_id,
        generation=row["generation"],
        owner_type=None if row["owner_type"] is None else OwnerType(row["owner_type"]),
        owner_id=row["owner_id"],
        expires_at=row["expires_at"],
    )


def take_claim(
    tx: Transaction,
    resource_id: str,
    owner_type: OwnerType,
    owner_id: str,
    lease_ms: int,
) -> Applied[Claim] | Conflict:
    """Claim ``resource_id`` with a fresh token and generation+1.

    Returns :class:`Conflict` while another owner's lease is live. A free, released or
    expired lease (including one the same owner let expire) is taken by compare-and-set on the
    old generation, which fences every earlier token. The caller records the claim as a
    change of the resource (see :func:`piwf.state.records.record_change`).
    """
    if lease_ms <= 0:
        raise ValueError("lease_ms must be positive")
    tx.execute(_ENSURE_LEASE, (resource_id,))
    current = read_lease(tx, resource_id)
    assert current is not None
    if current.is_live(tx.now) and (current.owner_type, current.owner_id) != (
        owner_type,
        owner_id,
    ):
        holder = current.owner_type.value if current.owner_type else "unknown"
        return Conflict(
            f"{resource_id} is held by a live {holder}"
            f" claim (generation {current.generation}) until {current.expires_at}"
        )
    token = secrets.token_urlsafe(32)
    expires_at = tx.now + lease_ms
    cursor = tx.execute(
        _TAKE_LEASE,
        (
            owner_type.value,
            owner_id,
            hash_token(token),
            tx.now,
            tx.now,
            expires_at,
            resource_id,
            current.generation,
        ),
    )
    if cursor.rowcount != 1:  # pragma: no cover - BEGIN IMMEDIATE serialises writers
        return Conflict(f"{resource_id} changed generation while being claimed")
    return Applied(
        Claim(
            resource_id=resource_id,
            owner_type=owner_type,
            owner_id=owner_id,
            generation=current.generation + 1,
            expires_at=expires_at,
            token=token,
        )
    )


def verify_claim(tx: Transaction, claim: Claim) -> None:
    """Raise :class:`ClaimLostError` unless ``claim`` is the exact live claim right now."""
    reason = _loss_reason(tx, claim)
    if reason is not None:
        raise ClaimLostError(reason, claim.resource_id, claim.generation)


def renew_claim(tx: Transaction, claim: Claim, lease_ms: int) -> Claim:
    """Extend the exact live ``claim`` to ``now + lease_ms`` and return the renewed claim.

    An expired claim cannot renew itself, even with a matching owner, token and generation.
    Raises :class:`ClaimLostError`.
    """
    if lease_ms <= 0:
        raise ValueError("lease_ms must be positive")
    expires_at = tx.now + lease_ms
    cursor = tx.execute(
        _RENEW_LEASE,
        (
            tx.now,
            expires_at,
            claim.resource_id,
            claim.owner_type.value,
            claim.owner_id,
            claim.token_hash,
            claim.generation,
            tx.now,
        ),
    )
    if cursor.rowcount != 1:
        verify_claim(tx, claim)
        raise ClaimLostError("missingAuthority", claim.resource_id, claim.generation)
    return replace(claim, expires_at=expires_at)


def release_claim(tx: Transaction, claim: Claim) -> Applied[None] | Adopted[None]:
    """Clear the owner of the exact live ``claim``, keeping its generation.

    Returns :class:`Adopted` when this generation was already released (a repeated release);
    raises :class:`ClaimLostError` when the claim expired or another owner took over.
    """
    cursor = tx.execute(
        _RELEASE_LEASE,
        (
            claim.resource_id,
            claim.owner_type.value,
            claim.owner_id,
            claim.token_hash,
            claim.generation,
            tx.now,
        ),
    )
    if cursor.rowcount == 1:
        return Applied(None)
    current = read_lease(tx, claim.resource_id)
    if current is not None and current.generation == claim.generation and current.owner_id is None:
        return Adopted(None)
    verify_claim(tx, claim)
    raise ClaimLostError("missingAuthority", claim.resource_id, claim.generation)


def expire_claims_of(tx: Transaction, owner_type: OwnerType, owner_id: str) -> int:
    """End every live claim of one owner now (its process is proven dead); return how many.

    Only startup recovery calls this, after the single-instance lock and the process registry
    proved the previous server gone. The generation is kept, so the next owner still gets
    generation + 1 and the dead owner's tokens stay fenced.
    """
    cursor = tx.execute(
        "UPDATE leases SET expires_at = ? WHERE owner_type = ? AND owner_id = ? AND expires_at > ?",
        (tx.now, owner_type.value, owner_id, tx.now),
    )
    return cursor.rowcount


def claim_actor(claim: Claim) -> ActorType:
    """The event actor type that corresponds to a claim's owner type."""
    return {
        OwnerType.SERVER: ActorType.SERVER,
        OwnerType.CONTROL: ActorType.CONTROL,
        OwnerType.RESOURCE_MANAGER: ActorType.RESOURCE_MANAGER,
        OwnerType.SESSION: ActorType.SESSION,
        OwnerType.CHANNEL: ActorType.CHANNEL,
        OwnerType.SYSTEM: ActorType.SYSTEM,
    }[claim.owner_type]


def _loss_reason(tx: Transaction, claim: Claim) -> ClaimLostReason | None:
    row = tx.one(_SELECT_LEASE, (claim.resource_id,))
    if row is None:
        return "missingAuthority"
    if row["generation"] != claim.generation:
        return "generationChanged"
    if row["owner_id"] is None:
        return "missingAuthority"
    if (row["owner_type"], row["owner_id"]) != (claim.owner_type.value, claim.owner_id):
        return "ownerChanged"
    if bytes(row["token_hash"]) != claim.token_hash:
        return "tokenChanged"
    if row["expires_at"] <= tx.now:
        return "expired"
    return None
