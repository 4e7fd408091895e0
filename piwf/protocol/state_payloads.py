"""Payloads and receipts of the ``state.*`` operations (the database's status, verify,
backup and prune), shared by server and client; split from :mod:`piwf.protocol.payloads`
(whose docstring lists every operation) so each stays one readable module."""

from __future__ import annotations

from pydantic import Field

from piwf.protocol.payloads import WireModel


class StateBackupPayload(WireModel):
    """Write a verified backup to an absolute path that does not exist yet."""

    destination: str = Field(min_length=1, max_length=4096)


class RetentionInfo(WireModel):
    """The automatic retention sweep's bookkeeping: times (epoch ms), counts and the last
    failure's bounded diagnostic (error class and ids, never payloads)."""

    last_started_at: int | None = None
    last_completed_at: int | None = None
    last_trees_deleted: int = 0
    last_runs_deleted: int = 0
    last_trees_protected: int = 0
    total_trees_deleted: int = 0
    last_failure_at: int | None = None
    last_failure: str | None = None


class StateStatus(WireModel):
    """Privacy-safe database counts."""

    runs: dict[str, int]
    queue: dict[str, int]
    paused_runs: int
    active_leases: int
    expired_leases: int
    unsettled_effects: int
    ambiguous_effects: int
    events: int
    blobs: int
    database_bytes: int
    retention: RetentionInfo | None = None


class ViolationInfo(WireModel):
    """One broken invariant."""

    code: str
    detail: str


class VerifyReceipt(WireModel):
    """Receipt of state.verify."""

    valid: bool
    violations: list[ViolationInfo]


class BackupReceipt(WireModel):
    """Receipt of state.backup."""

    destination: str
    bytes: int


#: Latest timestamp a prune cutoff may name (the last millisecond of year 9999, UTC).
MAX_TIMESTAMP_MS = 253_402_300_799_999


class StatePrunePreviewPayload(WireModel):
    """List what a prune with cutoff ``before`` (epoch ms) would delete; deletes nothing."""

    before: int = Field(ge=0, le=MAX_TIMESTAMP_MS)


class StatePrunePayload(WireModel):
    """Back up to ``backup`` (absolute, must not exist), then delete the expired trees."""

    before: int = Field(ge=0, le=MAX_TIMESTAMP_MS)
    backup: str = Field(min_length=1, max_length=4096)


class PruneTree(WireModel):
    """One tree a prune deletes (or would): its root, its run count and up to 50 run ids."""

    root_run_id: str
    runs: int
    run_ids: list[str]


class ProtectedTree(WireModel):
    """A tree old enough to expire that protected state keeps (reason codes of
    docs/RETENTION.md)."""

    root_run_id: str
    reasons: list[str]


class PruneReport(WireModel):
    """Receipt of state.prunePreview and state.prune: ids and counts only, never payloads.

    ``trees`` and ``protected`` list at most 100 entries each (``truncated`` says when more
    exist); the counts are complete. ``backup`` is the verified backup an applied prune made
    first.
    """

    before: int
    applied: bool
    tree_count: int
    run_count: int
    trees: list[PruneTree]
    protected_count: int
    protected: list[ProtectedTree]
    truncated: bool
    blobs_deleted: int | None = None
    backup: BackupReceipt | None = None
