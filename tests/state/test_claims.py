"""Claims, revisions and events: fencing by generation, token and expiry."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest

from piwf.clock import FakeClock
from piwf.errors import CLAIM_LOST_REASONS, ClaimLostError, StaleRevisionError
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.state import StateDatabase
from piwf.state.enums import ActorType, OwnerType, ResourceType
from piwf.state.leases import Claim, hash_token, read_lease, renew_claim, verify_claim
from piwf.state.records import (
    Actor,
    claim_resource,
    ensure_resource,
    list_events,
    read_revision,
    record_change,
    release_resource,
)

LEASE_MS = 30_000
SERVER = Actor(ActorType.SERVER, "server-a")


def new_resource(db: StateDatabase, key: str = "run-1") -> str:
    with db.write() as tx:
        return ensure_resource(tx, ResourceType.RUN, key)


def claim(db: StateDatabase, resource_id: str, owner: str = "server-a") -> Claim:
    with db.write() as tx:
        result = claim_resource(tx, resource_id, OwnerType.SERVER, owner, LEASE_MS)
    assert isinstance(result, Applied), result
    return result.value


def write_as(db: StateDatabase, resource_id: str, held: Claim, lease_ms: int | None = None) -> int:
    with db.write() as tx:
        revision = read_revision(tx, resource_id)
        assert revision is not None
        return record_change(
            tx, resource_id, revision, "run.progressed", SERVER, claim=held, lease_ms=lease_ms
        ).revision


def lost_reason(db: StateDatabase, resource_id: str, held: Claim) -> str:
    with pytest.raises(ClaimLostError) as raised:
        write_as(db, resource_id, held)
    return raised.value.reason


# conformance: S5
def test_each_new_owner_gets_a_new_generation_and_release_keeps_it(
    db: StateDatabase, clock: FakeClock
) -> None:
    resource = new_resource(db)
    first = claim(db, resource)
    assert first.generation == 1
    with db.write() as tx:
        assert isinstance(release_resource(tx, first), Applied)
    with db.read() as tx:
        lease = read_lease(tx, resource)
    assert lease is not None and lease.generation == 1 and lease.owner_id is None
    second = claim(db, resource, owner="server-b")
    assert second.generation == 2
    clock.advance(LEASE_MS + 1)  # let it expire, then a third owner takes over
    third = claim(db, resource, owner="server-c")
    assert third.generation == 3


# conformance: S5
def test_a_live_claim_of_another_owner_cannot_be_taken(db: StateDatabase) -> None:
    resource = new_resource(db)
    claim(db, resource, owner="server-a")
    with db.write() as tx:
        result = claim_resource(tx, resource, OwnerType.SERVER, "server-b", LEASE_MS)
    assert isinstance(result, Conflict)
    assert "live server claim" in result.evidence


# conformance: S5
def test_a_stale_generation_cannot_write(db: StateDatabase, clock: FakeClock) -> None:
    resource = new_resource(db)
    old = claim(db, resource, owner="server-a")
    clock.advance(LEASE_MS)
    claim(db, resource, owner="server-b")
    assert lost_reason(db, resource, old) == "generationChanged"


# conformance: S5
def test_a_changed_token_cannot_write(db: StateDatabase) -> None:
    resource = new_resource(db)
    held = claim(db, resource)
    forged = replace(held, token="not-the-token")
    assert lost_reason(db, resource, forged) == "tokenChanged"


def test_another_owner_with_the_same_generation_cannot_write(db: StateDatabase) -> None:
    resource = new_resource(db)
    held = claim(db, resource)
    impostor = replace(held, owner_id="server-z")
    assert lost_reason(db, resource, impostor) == "ownerChanged"


# conformance: S5
def test_an_expired_claim_can_neither_write_nor_renew(db: StateDatabase, clock: FakeClock) -> None:
    resource = new_resource(db)
    held = claim(db, resource)
    clock.advance(LEASE_MS)  # expiry is exclusive: at expires_at the claim is already dead
    assert lost_reason(db, resource, held) == "expired"
    with pytest.raises(ClaimLostError) as raised, db.write() as tx:
        renew_claim(tx, held, LEASE_MS)
    assert raised.value.reason == "expired"


# conformance: S5
def test_a_released_claim_can_neither_write_nor_renew(db: StateDatabase) -> None:
    resource = new_resource(db)
    held = claim(db, resource)
    with db.write() as tx:
        release_resource(tx, held)
    assert lost_reason(db, resource, held) == "missingAuthority"
    with pytest.raises(ClaimLostError) as raised, db.write() as tx:
        renew_claim(tx, held, LEASE_MS)
    assert raised.value.reason == "missingAuthority"
    with db.write() as tx:
        assert isinstance(release_resource(tx, held), Adopted), "a repeated release adopts"


def test_a_released_claim_cannot_release_a_newer_owner(db: StateDatabase) -> None:
    resource = new_resource(db)
    old = claim(db, resource, owner="server-a")
    with db.write() as tx:
        release_resource(tx, old)
    newer = claim(db, resource, owner="server-b")
    with pytest.raises(ClaimLostError) as raised, db.write() as tx:
        release_resource(tx, old)
    assert raised.value.reason == "generationChanged"
    with db.read() as tx:
        verify_claim(tx, newer)


# conformance: X1
def test_every_protected_write_renews_the_exact_claim(db: StateDatabase, clock: FakeClock) -> None:
    resource = new_resource(db)
    held = claim(db, resource)
    for _ in range(5):  # five writes spaced over more than one lease
        clock.advance(LEASE_MS // 2)
        write_as(db, resource, held, lease_ms=LEASE_MS)
    with db.read() as tx:
        lease = read_lease(tx, resource)
    assert lease is not None and lease.expires_at == clock.now_ms() + LEASE_MS


# conformance: S6
def test_a_failed_check_rolls_back_domain_row_revision_and_event(
    db: StateDatabase, clock: FakeClock
) -> None:
    resource = new_resource(db)
    held = claim(db, resource)
    with db.read() as tx:
        revision_before = read_revision(tx, resource)
        events_before = len(list_events(tx, resource))
    clock.advance(LEASE_MS + 1)
    with pytest.raises(ClaimLostError), db.write() as tx:
        tx.execute("INSERT INTO projects VALUES ('p', '/domain/row', 1)")
        record_change(tx, resource, revision_before or 0, "run.progressed", SERVER, claim=held)
    with db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM projects") == 0
        assert read_revision(tx, resource) == revision_before
        assert len(list_events(tx, resource)) == events_before


# conformance: S4
def test_an_accepted_change_checks_and_increments_the_revision_once(db: StateDatabase) -> None:
    resource = new_resource(db)
    with db.write() as tx:
        change = record_change(tx, resource, 0, "run.created", SERVER, payload={"n": 1})
    assert change.revision == 1
    with pytest.raises(StaleRevisionError) as raised, db.write() as tx:
        record_change(tx, resource, 0, "run.created", SERVER)
    assert raised.value.actual == 1
    with db.read() as tx:
        events = list_events(tx, resource)
    assert [(e.resource_revision, e.event_type) for e in events] == [(1, "run.created")]


# conformance: S6
def test_events_are_immutable(db: StateDatabase) -> None:
    resource = new_resource(db)
    with db.write() as tx:
        record_change(tx, resource, 0, "run.created", SERVER)
    with pytest.raises(sqlite3.IntegrityError, match="immutable"), db.write() as tx:
        tx.execute("UPDATE events SET event_type = 'rewritten'")


def test_claim_events_carry_the_generation(db: StateDatabase) -> None:
    resource = new_resource(db)
    claim(db, resource)
    with db.read() as tx:
        events = list_events(tx, resource)
    assert [(e.event_type, e.lease_generation) for e in events] == [("lease.claimed", 1)]


# conformance: S13
def test_the_raw_token_never_reaches_the_database_or_repr(db: StateDatabase) -> None:
    resource = new_resource(db)
    held = claim(db, resource)
    assert held.token not in repr(held)
    with db.read() as tx:
        stored = tx.scalar("SELECT token_hash FROM leases WHERE resource_id = ?", (resource,))
    assert bytes(stored) == hash_token(held.token)
    db.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert held.token.encode() not in db.path.read_bytes()


def test_claim_lost_errors_have_exactly_one_known_reason() -> None:
    for reason in CLAIM_LOST_REASONS:
        error = ClaimLostError(reason, "run:x", 3)
        assert error.reason == reason and error.code == "claimLost"
    with pytest.raises(ValueError, match="unknown"):
        ClaimLostError("stolen", "run:x", 3)  # type: ignore[arg-type]
