"""Group commit on a real database file: queued writes share one transaction and one commit,
each in its own savepoint, and nothing that follows a write runs before the commit."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from piwf.errors import InvalidTransitionError, PiwfError, StateUnavailableError
from piwf.server.loop import EventLoop
from piwf.state import StateDatabase, Transaction, blobs


def committed_projects(db: StateDatabase) -> list[str]:
    """What another connection sees: only what was committed."""
    outside = sqlite3.connect(f"file:{db.path}?mode=ro", uri=True)
    try:
        rows = outside.execute("SELECT project_id FROM projects ORDER BY rowid").fetchall()
    finally:
        outside.close()
    return [row[0] for row in rows]


@dataclass
class Insert:
    """A queued write inserting one project row; it records what it saw and was told."""

    db: StateDatabase
    name: str
    seen: list[str]
    refuse: bool = False
    outcome: list[str] = field(default_factory=list)

    def apply(self, tx: Transaction) -> Callable[[], None]:
        tx.execute("INSERT INTO projects VALUES (?, ?, 1)", (self.name, f"/{self.name}"))
        if self.refuse:
            raise InvalidTransitionError(f"{self.name} is refused")
        return lambda: self.seen.append(f"{self.name} committed: {committed_projects(self.db)}")

    def refused(self, error: PiwfError) -> Callable[[], None]:
        return lambda: self.seen.append(f"{self.name} refused: {error}")

    def unavailable(self, error: StateUnavailableError) -> None:
        self.seen.append(f"{self.name} unavailable: {type(error).__name__}")


def test_queued_writes_commit_together_and_follow_up_only_after_the_commit(
    db: StateDatabase,
) -> None:
    seen: list[str] = []
    for name in ("a", "b", "c"):
        db.group.defer(Insert(db, name, seen))
    assert db.group.pending
    assert committed_projects(db) == [], "queued, not applied"
    db.group.flush()
    # Each follow-up ran after the one commit: every row is already visible from outside.
    assert seen == [f"{name} committed: ['a', 'b', 'c']" for name in ("a", "b", "c")]
    assert (db.group.groups, db.group.writes) == (1, 3)
    assert not db.group.pending
    assert not db.connection.in_transaction


def test_a_refused_write_is_undone_alone(db: StateDatabase) -> None:
    seen: list[str] = []
    for name, refuse in (("a", False), ("b", True), ("c", False)):
        db.group.defer(Insert(db, name, seen, refuse=refuse))
    db.group.flush()
    assert committed_projects(db) == ["a", "c"]
    assert seen == [
        "a committed: ['a', 'c']",
        "b refused: b is refused",
        "c committed: ['a', 'c']",
    ]


def test_a_failing_file_commits_nothing_and_tells_every_write(db: StateDatabase) -> None:
    seen: list[str] = []

    @dataclass
    class Large(Insert):
        def apply(self, tx: Transaction) -> Callable[[], None]:
            blobs.put_text(tx, secrets.token_hex(1 << 20))  # needs pages the file may not have
            return super().apply(tx)

    db.group.defer(Insert(db, "a", seen))
    db.group.defer(Large(db, "b", seen))
    db.connection.execute(f"PRAGMA max_page_count = {db.pragma('page_count')}")
    db.group.flush()
    assert seen == ["a unavailable: StateFullError", "b unavailable: StateFullError"]
    assert committed_projects(db) == []
    assert not db.connection.in_transaction


def test_a_later_write_commits_the_queued_ones_first(db: StateDatabase) -> None:
    seen: list[str] = []
    db.group.defer(Insert(db, "queued", seen))
    with db.write() as tx:
        seen.append(f"later write began: {committed_projects(db)}")
        tx.execute("INSERT INTO projects VALUES ('later', '/later', 1)")
    assert seen == ["queued committed: ['queued']", "later write began: ['queued']"]
    assert committed_projects(db) == ["queued", "later"]


def test_a_write_inside_an_open_transaction_does_not_flush(db: StateDatabase) -> None:
    seen: list[str] = []
    with db.write() as tx:
        db.group.defer(Insert(db, "queued", seen))
        with db.write() as inner:  # joins the outer transaction
            inner.execute("INSERT INTO projects VALUES ('inner', '/inner', 1)")
        assert db.group.pending
        assert tx is inner
    db.group.flush()
    assert committed_projects(db) == ["inner", "queued"]


def test_the_loop_commits_what_its_io_and_its_timers_queued_in_the_same_turn(
    db: StateDatabase,
) -> None:
    loop = EventLoop()
    try:
        loop.after_dispatch.append(db.group.flush)
        seen: list[str] = []
        loop.call_later(0, lambda: db.group.defer(Insert(db, "from a timer", seen)))
        loop.run_once()
        assert seen == ["from a timer committed: ['from a timer']"]
        assert not db.group.pending
    finally:
        loop.close()


@pytest.mark.parametrize("count", [1, 2])
def test_an_unexpected_error_in_one_write_undoes_it_and_spares_the_rest(
    db: StateDatabase, count: int
) -> None:
    seen: list[str] = []

    @dataclass
    class Broken(Insert):
        def apply(self, tx: Transaction) -> Callable[[], None]:
            super().apply(tx)
            raise RuntimeError("a bug")

    db.group.defer(Broken(db, "broken", seen))
    for index in range(count):
        db.group.defer(Insert(db, f"fine{index}", seen))
    db.group.flush()
    names = [f"fine{index}" for index in range(count)]
    assert committed_projects(db) == names
    assert seen == [f"{name} committed: {names}" for name in names]
