"""State maintenance of one server: the automatic retention sweep and the prune operations.

The sweep (docs/RETENTION.md) is one pending step at a time on the server loop::

    request()   after startup recovery and after every workflow runner exit; a request while a
       |        step is pending joins it (a failure backoff is never cut short)
       v
    step        not due: a sweep completed less than an interval ago, in this process or in an
                       earlier one (``retention_state.last_completed_at``)  -> wait for due time
                not idle: a runner or resolver is active or pending, claimable work is queued,
                          or the server is stopping                         -> idle retry
                no sweep in progress: note the start, select the expired roots (ids only)
                one root left or more: delete ONE tree in one fenced write transaction (it is
                          judged again inside), then yield to the loop      -> next step now
                none left: compact (WAL truncate; VACUUM only when still idle and worth it),
                          note the completion                               -> wait an interval
    failure     one log line (error class, no payloads) and the stored last failure; the next
                step waits ``retry_s`` (no tight loop); no workflow fails, the server goes on

Work that appears stops the sweep between two trees; it stays due, and the next runner exit or
the idle retry continues it. ``state.prunePreview`` and ``state.prune`` use the same selector
and deletion (:mod:`piwf.state.retention`); an applied prune backs up first and deletes every
expired tree in the one transaction of its receipt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from piwf import faults
from piwf.lifecycle import Applied
from piwf.protocol.state_payloads import BackupReceipt, ProtectedTree, PruneReport, PruneTree
from piwf.server.children.resolvers import ResolverJobs
from piwf.server.loop import EventLoop, Timer
from piwf.server.runs.pool import Executor
from piwf.server.settings import ServerSettings
from piwf.state import StateDatabase, Transaction, compaction, retention
from piwf.state import execution as ex
from piwf.state.execution import attempt_logs
from piwf.state.server_epoch import ServerClaim, verify_server_claim

log = logging.getLogger("piwf.server")

#: Entries a prune report lists (its counts are complete).
REPORT_LIMIT = 100
#: Run ids listed per tree in a report.
RUN_IDS_LIMIT = 50
#: The shortest wait after a failure or a postponed sweep, whatever the settings say.
MIN_RETRY_S = 1.0

TimerKind = Literal["now", "idle", "backoff", "due"]


@dataclass(frozen=True)
class RetentionSettings:
    """How the automatic sweep is bounded (the ``PIWF_RETENTION_*`` settings)."""

    days: int = retention.DEFAULT_RETENTION_DAYS
    retry_s: float = 300.0
    interval_s: float = 86_400.0
    vacuum_min_bytes: int = compaction.VACUUM_MIN_BYTES

    @classmethod
    def from_server(cls, settings: ServerSettings) -> RetentionSettings:
        """The retention part of the server's settings."""
        return cls(
            days=settings.retention_days,
            retry_s=max(MIN_RETRY_S, settings.retention_retry_s),
            interval_s=max(MIN_RETRY_S, settings.retention_interval_s),
            vacuum_min_bytes=settings.retention_vacuum_min_bytes,
        )


@dataclass
class _Sweep:
    """The sweep in progress: roots still to try, and what was done so far."""

    roots: list[str]
    cutoff: int
    trees: int = 0
    runs: int = 0
    protected: int = 0


class RetentionSweeper:
    """The automatic retention sweep of one server process (one pending step at most)."""

    def __init__(
        self,
        *,
        db: StateDatabase,
        loop: EventLoop,
        executor: Executor,
        resolvers: ResolverJobs,
        server_claim: Callable[[], ServerClaim],
        settings: RetentionSettings,
    ) -> None:
        self.db = db
        self.loop = loop
        self.executor = executor
        self.resolvers = resolvers
        self.server_claim = server_claim
        self.settings = settings
        self._timer: Timer | None = None
        self._timer_kind: TimerKind | None = None
        self._sweep: _Sweep | None = None
        self._last_completed_ms: int | None = None
        self._loaded = False

    def request(self) -> None:
        """Ask for a sweep step soon; joins a pending step or a failure backoff."""
        if self.loop.stop_requested:
            return
        if self._timer is not None:
            if self._timer_kind in ("now", "backoff"):
                return
            self._timer.cancel()
        self._schedule("now", 0.0)

    def idle(self) -> bool:
        """No runner or resolver active or pending, nothing claimable, not stopping."""
        if self.loop.stop_requested or self.executor.busy_slots() or self.resolvers.active:
            return False
        with self.db.read() as tx:
            return ex.count_runnable(tx) == 0

    # -- the step ---------------------------------------------------------------------------

    def _schedule(self, kind: TimerKind, delay_s: float) -> None:
        self._timer_kind = kind
        self._timer = self.loop.call_later(delay_s, self._step)

    def _step(self) -> None:
        self._timer = None
        self._timer_kind = None
        if self.loop.stop_requested:
            return
        try:
            self._advance()
        except Exception as error:  # any failure: one diagnostic and a backoff, never a crash
            self._failed(error)

    def _advance(self) -> None:
        now = self.db.clock.now_ms()
        due_at = self._due_at()
        if now < due_at:
            self._schedule("due", (due_at - now) / 1000)
            return
        if not self.idle():
            self._schedule("idle", self.settings.retry_s)
            return
        if self._sweep is None:
            self._sweep = self._begin(now)
        sweep = self._sweep
        if sweep.roots:
            self._delete_one(sweep, sweep.roots.pop(0))
            self._schedule("now", 0.0)  # yield: requests and runner messages go first
            return
        self._complete(sweep)

    def _due_at(self) -> int:
        if not self._loaded:
            with self.db.read() as tx:
                self._last_completed_ms = retention.read_status(tx).last_completed_at
            self._loaded = True
        if self._last_completed_ms is None:
            return 0
        return self._last_completed_ms + int(self.settings.interval_s * 1000)

    def _begin(self, now: int) -> _Sweep:
        """Select the expired roots; a sweep with none to check writes nothing at all."""
        cutoff = retention.cutoff_for(now, self.settings.days)
        with self.db.read() as tx:
            roots = retention.expired_roots(tx, cutoff)
        if roots:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                retention.record_sweep_started(tx)
            log.info("retention: sweep started, %d expired tree(s) to check", len(roots))
        return _Sweep(roots, cutoff)

    def _delete_one(self, sweep: _Sweep, root_run_id: str) -> None:
        with self.db.write() as tx:
            verify_server_claim(tx, self.server_claim())
            result = retention.delete_tree(tx, root_run_id, tx.now, sweep.cutoff)
            if isinstance(result, Applied):
                retention.record_trees_deleted(tx, 1)
        if isinstance(result, Applied):
            faults.point("retention.after_tree_delete")
            # Committed: the runs' attempt log files go now (a crash here leaves them to the
            # orphan check when the sweep completes).
            attempt_logs.remove_run_logs(self.db.path.parent, result.value.run_ids)
            sweep.trees += 1
            sweep.runs += len(result.value.run_ids)
        elif isinstance(result, retention.TreeProtected):
            sweep.protected += 1

    def _complete(self, sweep: _Sweep) -> None:
        """Note the completion: in this process always, in the database only for a sweep that
        found expired trees (an empty sweep costs one read, so a restart may repeat it; the
        common start writes nothing)."""
        self._last_completed_ms = self.db.clock.now_ms()
        if sweep.trees or sweep.protected:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                retention.record_sweep_completed(
                    tx, trees=sweep.trees, runs=sweep.runs, protected=sweep.protected
                )
                self._last_completed_ms = tx.now
        self._sweep = None
        if sweep.trees or sweep.protected:
            log.info(
                "retention: sweep done: %d tree(s) with %d run(s) deleted, %d protected",
                sweep.trees,
                sweep.runs,
                sweep.protected,
            )
        if sweep.trees:
            remove_orphaned_logs(self.db)
            self._compact()
        self._schedule("due", self.settings.interval_s)

    def _compact(self) -> None:
        """Give space back after deletions; a failure here leaves them committed."""
        try:
            done = compaction.compact(
                self.db, still_idle=self.idle, min_bytes=self.settings.vacuum_min_bytes
            )
        except Exception as error:  # best effort: the deletions are committed either way
            log.warning("retention: compaction skipped: %s", _diagnostic(error))
            return
        if done.vacuumed:
            log.info(
                "retention: vacuumed %d free page(s) of %d",
                done.before.free_pages,
                done.before.page_count,
            )

    def _failed(self, error: BaseException) -> None:
        diagnostic = _diagnostic(error)
        log.warning(
            "retention: sweep failed, retrying in %.0f s: %s", self.settings.retry_s, diagnostic
        )
        self._sweep = None
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                retention.record_sweep_failed(tx, diagnostic)
        except Exception as again:  # the database itself may be what failed
            log.warning("retention: the failure was not recorded: %s", _diagnostic(again))
        self._schedule("backoff", self.settings.retry_s)


def _diagnostic(error: BaseException) -> str:
    """One bounded line: the error class and its message cut short (messages name ids and
    states, never payloads)."""
    return f"{type(error).__name__}: {str(error)[:300]}"


# -- state.prunePreview / state.prune ----------------------------------------------------------


def preview_prune(db: StateDatabase, before: int) -> PruneReport:
    """What a prune with cutoff ``before`` would delete, judged in one read snapshot."""
    with db.read() as tx:
        verdicts = retention.select_trees(tx, tx.now, before)
    expired = [(v.root_run_id, v.run_ids) for v in verdicts if v.expired]
    protected = [(v.root_run_id, v.reasons) for v in verdicts if not v.expired]
    return _report(before, applied=False, deleted=expired, protected=protected)


def apply_prune(tx: Transaction, before: int, backup: BackupReceipt) -> PruneReport:
    """Delete every expired tree in the caller's transaction, each in its own savepoint and
    judged again first, then the definitions, projects and blobs they alone used, looked up
    once for all of them; return the receipt. Never commits."""
    deleted: list[tuple[str, Sequence[str]]] = []
    protected: list[tuple[str, Sequence[str]]] = []
    done = retention.delete_trees(tx, retention.expired_roots(tx, before), tx.now, before)
    for root, result in done.results:
        if isinstance(result, Applied):
            deleted.append((root, result.value.run_ids))
        elif isinstance(result, retention.TreeProtected):
            protected.append((root, result.reasons))
    retention.record_trees_deleted(tx, len(deleted))
    report = _report(before, applied=True, deleted=deleted, protected=protected)
    return report.model_copy(update={"blobs_deleted": done.blobs, "backup": backup})


def _report(
    before: int,
    *,
    applied: bool,
    deleted: Sequence[tuple[str, Sequence[str]]],
    protected: Sequence[tuple[str, Sequence[str]]],
) -> PruneReport:
    return PruneReport(
        before=before,
        applied=applied,
        tree_count=len(deleted),
        run_count=sum(len(run_ids) for _, run_ids in deleted),
        trees=[
            PruneTree(root_run_id=root, runs=len(run_ids), run_ids=list(run_ids[:RUN_IDS_LIMIT]))
            for root, run_ids in deleted[:REPORT_LIMIT]
        ],
        protected_count=len(protected),
        protected=[
            ProtectedTree(root_run_id=root, reasons=list(reasons))
            for root, reasons in protected[:REPORT_LIMIT]
        ],
        truncated=len(deleted) > REPORT_LIMIT or len(protected) > REPORT_LIMIT,
    )


def remove_orphaned_logs(db: StateDatabase) -> None:
    """Delete the attempt log files of runs that no longer exist (best effort: files left now
    are found again by the next sweep or prune)."""
    try:
        with db.read() as tx:
            attempt_logs.remove_orphaned_logs(tx, db.path.parent)
    except Exception as error:  # best effort: the deletions are committed either way
        log.warning("retention: attempt logs not removed: %s", _diagnostic(error))


def compact_after_prune(db: StateDatabase, still_idle: Callable[[], bool]) -> None:
    """Remove the pruned runs' attempt log files, truncate the WAL after an applied prune and
    VACUUM under the automatic rule."""
    remove_orphaned_logs(db)
    try:
        compaction.compact(db, still_idle=still_idle)
    except Exception as error:  # best effort: the deletions are committed either way
        log.warning("prune: compaction skipped: %s", _diagnostic(error))
