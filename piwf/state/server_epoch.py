"""The server claim: one row that says which server process owns the database, and its epoch.

A server acquires the claim before it handles any work. A live claim of another server is a
:class:`Conflict`, unless the caller proves that server dead (``previous_dead=True``: it holds
the single-instance lock and the recorded process is gone). Every acquisition takes
``epoch + 1``; renewal needs the exact server id, token hash and epoch and an unexpired lease,
so an expired server can never revive itself. Messages stamped with an older epoch are refused
by the server (see :func:`verify_server_claim`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from piwf.errors import ClaimLostError, ClaimLostReason
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.state.database import Transaction
from piwf.state.leases import hash_token

#: The ``resource_id`` of a :class:`ClaimLostError` about the server epoch itself.
SERVER_RESOURCE = "server"

_SELECT = """
SELECT epoch, server_id, token_hash, pid, process_start_identity, expires_at
FROM server_state WHERE id = 1
"""

_ACQUIRE = """
UPDATE server_state
SET epoch = epoch + 1, server_id = ?, token_hash = ?, pid = ?, process_start_identity = ?,
    started_at = ?, heartbeat_at = ?, expires_at = ?
WHERE id = 1 AND epoch = ?
"""

_RENEW = """
UPDATE server_state SET heartbeat_at = ?, expires_at = ?
WHERE id = 1 AND epoch = ? AND server_id = ? AND token_hash = ? AND expires_at > ?
"""

_RELEASE = """
UPDATE server_state
SET server_id = NULL, token_hash = NULL, pid = NULL, process_start_identity = NULL,
    started_at = NULL, heartbeat_at = NULL, expires_at = NULL
WHERE id = 1 AND epoch = ? AND server_id = ? AND token_hash = ?
"""


@dataclass(frozen=True)
class ServerClaim:
    """Proof that this process is the server of one epoch; ``token`` never leaves it."""

    epoch: int
    server_id: str
    expires_at: int
    token: str = field(repr=False)


@dataclass(frozen=True)
class ServerOwner:
    """Who holds (or last held) the server claim."""

    epoch: int
    server_id: str | None
    pid: int | None
    process_start_identity: str | None
    expires_at: int | None

    def is_live(self, now: int) -> bool:
        """Whether an owner is recorded and its lease has not expired."""
        return self.server_id is not None and self.expires_at is not None and self.expires_at > now


def read_server_owner(tx: Transaction) -> ServerOwner:
    """Return the current server claim row."""
    row = tx.one(_SELECT)
    assert row is not None, "server_state has exactly one row by construction"
    return ServerOwner(
        epoch=row["epoch"],
        server_id=row["server_id"],
        pid=row["pid"],
        process_start_identity=row["process_start_identity"],
        expires_at=row["expires_at"],
    )


def acquire_server_claim(
    tx: Transaction,
    *,
    server_id: str,
    pid: int,
    process_start_identity: str,
    lease_ms: int,
    previous_dead: bool = False,
) -> Applied[ServerClaim] | Conflict:
    """Take the server claim with ``epoch + 1``.

    Returns :class:`Conflict` while another server's lease is live, unless ``previous_dead``
    says the caller proved that server's process gone.
    """
    current = read_server_owner(tx)
    if current.is_live(tx.now) and not previous_dead:
        return Conflict(
            f"a live piwf server (epoch {current.epoch}, pid {current.pid}) owns this state"
        )
    token = secrets.token_urlsafe(32)
    expires_at = tx.now + lease_ms
    cursor = tx.execute(
        _ACQUIRE,
        (
            server_id,
            hash_token(token),
            pid,
            process_start_identity,
            tx.now,
            tx.now,
            expires_at,
            current.epoch,
        ),
    )
    if cursor.rowcount != 1:  # pragma: no cover - BEGIN IMMEDIATE serialises writers
        return Conflict("the server epoch changed while it was being acquired")
    return Applied(ServerClaim(current.epoch + 1, server_id, expires_at, token))


def renew_server_claim(tx: Transaction, claim: ServerClaim, lease_ms: int) -> ServerClaim:
    """Extend the exact live server claim; raise :class:`ClaimLostError` otherwise."""
    expires_at = tx.now + lease_ms
    cursor = tx.execute(
        _RENEW,
        (tx.now, expires_at, claim.epoch, claim.server_id, hash_token(claim.token), tx.now),
    )
    if cursor.rowcount != 1:
        raise ClaimLostError(_loss_reason(tx, claim), SERVER_RESOURCE, claim.epoch)
    return ServerClaim(claim.epoch, claim.server_id, expires_at, claim.token)


def verify_server_claim(tx: Transaction, claim: ServerClaim) -> None:
    """Raise :class:`ClaimLostError` unless ``claim`` is the live server claim right now."""
    current = tx.one(_SELECT)
    assert current is not None
    if (
        current["epoch"] == claim.epoch
        and current["server_id"] == claim.server_id
        and current["token_hash"] is not None
        and bytes(current["token_hash"]) == hash_token(claim.token)
        and current["expires_at"] > tx.now
    ):
        return
    raise ClaimLostError(_loss_reason(tx, claim), SERVER_RESOURCE, claim.epoch)


def release_server_claim(tx: Transaction, claim: ServerClaim) -> Applied[None] | Adopted[None]:
    """Clear the owner of this epoch (keeping the epoch); a repeated release is adopted.

    Raises :class:`ClaimLostError` when a newer epoch owns the database.
    """
    cursor = tx.execute(_RELEASE, (claim.epoch, claim.server_id, hash_token(claim.token)))
    if cursor.rowcount == 1:
        return Applied(None)
    current = read_server_owner(tx)
    if current.epoch == claim.epoch and current.server_id is None:
        return Adopted(None)
    raise ClaimLostError(_loss_reason(tx, claim), SERVER_RESOURCE, claim.epoch)


def _loss_reason(tx: Transaction, claim: ServerClaim) -> ClaimLostReason:
    current = tx.one(_SELECT)
    assert current is not None
    if current["epoch"] != claim.epoch:
        return "generationChanged"
    if current["server_id"] is None:
        return "missingAuthority"
    if current["server_id"] != claim.server_id:
        return "ownerChanged"
    if bytes(current["token_hash"]) != hash_token(claim.token):
        return "tokenChanged"
    return "expired"
