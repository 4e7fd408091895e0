"""Compaction after deletions: give free pages back to the file system, only when idle.

Runs outside any transaction, on the server's own connection::

    compact(db, still_idle)   checkpoint and truncate the WAL; then, only while still_idle()
                              holds and at least VACUUM_MIN_BYTES and VACUUM_MIN_FREE_RATIO of
                              the pages are free, VACUUM and truncate the WAL again

A skipped VACUUM loses nothing: SQLite reuses the free pages. What gets deleted, and when, is
:mod:`piwf.state.retention`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from piwf import faults
from piwf.errors import InvalidTransitionError
from piwf.state.database import StateDatabase

#: Automatic VACUUM needs at least this much reclaimable space and this share of free pages.
VACUUM_MIN_BYTES = 64 * 1024 * 1024
VACUUM_MIN_FREE_RATIO = 0.2


@dataclass(frozen=True)
class Space:
    """Pages of the database file and how many of them are free."""

    page_size: int
    page_count: int
    free_pages: int

    @property
    def reclaimable_bytes(self) -> int:
        """Bytes a VACUUM could give back to the file system."""
        return self.free_pages * self.page_size

    @property
    def free_ratio(self) -> float:
        """Share of the file's pages that are free."""
        return self.free_pages / self.page_count if self.page_count else 0.0


@dataclass(frozen=True)
class Compaction:
    """What :func:`compact` did."""

    wal_truncated: bool
    vacuumed: bool
    before: Space
    after: Space


def space(db: StateDatabase) -> Space:
    """Return the page counts of ``db`` (read outside a transaction)."""
    return Space(
        page_size=int(db.pragma("page_size")),
        page_count=int(db.pragma("page_count")),
        free_pages=int(db.pragma("freelist_count")),
    )


def truncate_wal(db: StateDatabase) -> bool:
    """Checkpoint the WAL and truncate it to zero bytes; False when a reader kept part of it
    (nothing is lost either way, the rest is checkpointed later)."""
    row = db.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return row is not None and int(row[0]) == 0


def compact(
    db: StateDatabase,
    *,
    still_idle: Callable[[], bool],
    min_bytes: int = VACUUM_MIN_BYTES,
    min_free_ratio: float = VACUUM_MIN_FREE_RATIO,
) -> Compaction:
    """After deletions: truncate the WAL, then ``VACUUM`` only if ``still_idle()`` and at least
    ``min_bytes`` are reclaimable and ``min_free_ratio`` of the pages are free.

    A skipped VACUUM leaves the free pages for SQLite to reuse. Raises ``sqlite3.Error`` when
    SQLite refuses; the deletions were committed before and stay.
    """
    if db.connection.in_transaction:
        raise InvalidTransitionError("compaction runs outside transactions")
    truncated = truncate_wal(db)
    before = space(db)
    vacuumed = False
    if (
        before.reclaimable_bytes >= min_bytes
        and before.free_ratio >= min_free_ratio
        and still_idle()
    ):
        faults.point("retention.before_vacuum")
        db.vacuum()  # its copy built on disk, not in the writer's in-memory temporary storage
        vacuumed = True
        truncated = truncate_wal(db)
    return Compaction(truncated, vacuumed, before, space(db) if vacuumed else before)
