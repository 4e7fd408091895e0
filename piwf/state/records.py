"""Aggregates, revisions and the immutable event log: the write contract in one place.

Every accepted domain command goes through :func:`record_change` inside a ``write()``
transaction, which applies the seed's order::

    verify the expected revision of the aggregate
    verify the claim (token, generation, expiry) and renew that exact live claim
    [the caller verifies its domain transition and writes blobs]
    increment the revision once
    write one immutable event with the new revision
    [the caller updates its domain rows and inserts follow-up effects]
    COMMIT (by the outermost write())

Any failed check raises, and the surrounding transaction rolls back the domain rows, the
revision and the event together.
"""

from __future__ import annotations

from dataclasses import dataclass

from piwf.errors import StaleRevisionError
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import ActorType, OwnerType, ResourceType
from piwf.state.leases import (
    Claim,
    claim_actor,
    read_lease,
    release_claim,
    renew_claim,
    take_claim,
    verify_claim,
)

_INSERT_RESOURCE = """
INSERT INTO resources (resource_id, resource_type, aggregate_key, revision, created_at,
                       updated_at)
VALUES (?, ?, ?, 0, ?, ?)
ON CONFLICT (resource_id) DO NOTHING
"""

_SELECT_RESOURCE = """
SELECT resource_type, aggregate_key, revision FROM resources WHERE resource_id = ?
"""

_BUMP_REVISION = """
UPDATE resources SET revision = revision + 1, updated_at = ?
WHERE resource_id = ? AND revision = ?
"""

_LATEST_EVENT_SEQ = "SELECT coalesce(max(event_seq), 0) FROM events"

_INSERT_EVENT = """
INSERT INTO events (event_id, resource_id, resource_revision, event_type, actor_type,
                    actor_id, lease_generation, payload_hash, recorded_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""


@dataclass(frozen=True)
class Actor:
    """Who caused a change; ``actor_id`` is a private local id and never shown in status."""

    actor_type: ActorType
    actor_id: str | None = None


@dataclass(frozen=True)
class Change:
    """The outcome of one accepted change: the new revision and its event."""

    resource_id: str
    revision: int
    event_seq: int
    claim: Claim | None


def resource_id_for(resource_type: ResourceType, aggregate_key: str) -> str:
    """Return the stable resource id of an aggregate."""
    return f"{resource_type.value}:{aggregate_key}"


def ensure_resource(tx: Transaction, resource_type: ResourceType, aggregate_key: str) -> str:
    """Create the aggregate at revision 0 if it does not exist; return its resource id."""
    resource_id = resource_id_for(resource_type, aggregate_key)
    tx.execute(_INSERT_RESOURCE, (resource_id, resource_type.value, aggregate_key, tx.now, tx.now))
    return resource_id


def latest_event_seq(tx: Transaction) -> int:
    """The sequence number of the newest event (0: none): it moves with every committed change
    of any resource, so a reader can tell whether anything changed since it last looked."""
    return int(tx.scalar(_LATEST_EVENT_SEQ) or 0)


def read_revision(tx: Transaction, resource_id: str) -> int | None:
    """Return the current revision of ``resource_id``, or None when it does not exist."""
    row = tx.one(_SELECT_RESOURCE, (resource_id,))
    return None if row is None else int(row["revision"])


def record_change(
    tx: Transaction,
    resource_id: str,
    expected_revision: int,
    event_type: str,
    actor: Actor,
    *,
    claim: Claim | None = None,
    lease_ms: int | None = None,
    payload: object | None = None,
) -> Change:
    """Verify, bump the revision of ``resource_id`` once and append its event.

    ``claim``, when given, must be the exact live claim (of this or another aggregate, such as
    the run that owns an effect); it is renewed by ``lease_ms`` when that is given. Raises
    :class:`StaleRevisionError` or :class:`~piwf.errors.ClaimLostError`; the caller's
    transaction then rolls back everything it wrote.
    """
    current = read_revision(tx, resource_id)
    if current != expected_revision:
        raise StaleRevisionError(resource_id, expected_revision, current)
    renewed: Claim | None = None
    if claim is not None:
        if lease_ms is not None:
            renewed = renew_claim(tx, claim, lease_ms)
        else:
            verify_claim(tx, claim)
            renewed = claim
    payload_hash = None if payload is None else blobs.put_json(tx, payload)
    cursor = tx.execute(_BUMP_REVISION, (tx.now, resource_id, expected_revision))
    if cursor.rowcount != 1:  # pragma: no cover - checked above inside the same transaction
        raise StaleRevisionError(resource_id, expected_revision, read_revision(tx, resource_id))
    revision = expected_revision + 1
    event = tx.execute(
        _INSERT_EVENT,
        (
            f"{resource_id}@{revision}",
            resource_id,
            revision,
            event_type,
            actor.actor_type.value,
            actor.actor_id,
            None if claim is None else claim.generation,
            payload_hash,
            tx.now,
        ),
    )
    assert event.lastrowid is not None
    return Change(resource_id, revision, event.lastrowid, renewed)


def claim_resource(
    tx: Transaction,
    resource_id: str,
    owner_type: OwnerType,
    owner_id: str,
    lease_ms: int,
    *,
    expected_revision: int | None = None,
) -> Applied[Claim] | Conflict:
    """Take a claim on an existing aggregate and record it as a ``lease.claimed`` change.

    Returns :class:`Conflict` while another owner's lease is live or when
    ``expected_revision`` (if given) is not the stored one.
    """
    current = read_revision(tx, resource_id)
    if current is None:
        return Conflict(f"{resource_id} does not exist")
    if expected_revision is not None and current != expected_revision:
        return Conflict(f"{resource_id} is at revision {current}, not {expected_revision}")
    taken = take_claim(tx, resource_id, owner_type, owner_id, lease_ms)
    if isinstance(taken, Conflict):
        return taken
    claim = taken.value
    record_change(
        tx,
        resource_id,
        current,
        "lease.claimed",
        Actor(claim_actor(claim), owner_id),
        claim=claim,
    )
    return taken


def release_resource(
    tx: Transaction, claim: Claim, *, event_type: str = "lease.released"
) -> Applied[None] | Adopted[None]:
    """Release the exact live ``claim`` and record it; a repeated release is adopted.

    Raises :class:`~piwf.errors.ClaimLostError` when the claim expired or was replaced.
    """
    lease = read_lease(tx, claim.resource_id)
    if lease is not None and lease.generation == claim.generation and lease.owner_id is None:
        return Adopted(None)
    current = read_revision(tx, claim.resource_id)
    if current is None:
        raise StaleRevisionError(claim.resource_id, 0, None)
    record_change(
        tx,
        claim.resource_id,
        current,
        event_type,
        Actor(claim_actor(claim), claim.owner_id),
        claim=claim,
    )
    return release_claim(tx, claim)


@dataclass(frozen=True)
class Event:
    """One row of the immutable audit log."""

    event_seq: int
    resource_id: str
    resource_revision: int
    event_type: str
    actor_type: ActorType
    lease_generation: int | None
    recorded_at: int


def list_events(tx: Transaction, resource_id: str) -> list[Event]:
    """Return the events of one aggregate in commit order (its revision order)."""
    rows = tx.all(
        "SELECT event_seq, resource_id, resource_revision, event_type, actor_type,"
        " lease_generation, recorded_at FROM events WHERE resource_id = ?"
        " ORDER BY resource_revision",
        (resource_id,),
    )
    return [
        Event(
            event_seq=row["event_seq"],
            resource_id=row["resource_id"],
            resource_revision=row["resource_revision"],
            event_type=row["event_type"],
            actor_type=ActorType(row["actor_type"]),
            lease_generation=row["lease_generation"],
            recorded_at=row["recorded_at"],
        )
        for row in rows
    ]
