"""Human output of the server's and the state database's reports: ``server status``, ``state
status``, ``state verify``, ``state backup`` and ``state prune``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from piwf.cli.render import fields, one_line, timestamp

if TYPE_CHECKING:
    from piwf.protocol.payloads import ServerStatus
    from piwf.protocol.state_payloads import (
        BackupReceipt,
        PruneReport,
        StateStatus,
        VerifyReceipt,
    )


def server_status(status: ServerStatus) -> str:
    """The server's counts."""
    return "\n".join(
        [
            f"piwf server {status.state} (pid {status.pid}, epoch {status.epoch}, version "
            f"{status.package_version})",
            fields(
                [
                    ("runners", f"{status.active_runners} active of {status.max_workers}"),
                    ("connections", status.connections),
                    (
                        "runs",
                        f"{status.queued_runs} queued, {status.running_runs} running, "
                        f"{status.waiting_runs} waiting, {status.parked_runs} parked",
                    ),
                    ("parked", _counts(status.parked_by_reason)),
                    ("paused", status.paused_runs),
                    (
                        "interactions",
                        f"{status.pending_interactions} pending, "
                        f"{status.agent_deadlines} with an active-time deadline",
                    ),
                    ("effects", f"{status.ambiguous_effects} ambiguous"),
                    ("claims", f"{status.expired_claims} expired"),
                ]
            ),
        ]
    )


def _counts(counts: dict[str, int]) -> str:
    """``"2 queued, 1 failed"``: the non-zero counts by name, or ``"none"``."""
    shown = [f"{count} {name}" for name, count in sorted(counts.items()) if count]
    return ", ".join(shown) or "none"


def state_status(status: StateStatus) -> str:
    """The database's counts."""
    return "\n".join(
        [
            "piwf state",
            fields(
                [
                    ("runs", _counts(status.runs)),
                    ("queue", _counts(status.queue)),
                    ("paused runs", status.paused_runs),
                    ("leases", f"{status.active_leases} active, {status.expired_leases} expired"),
                    (
                        "effects",
                        f"{status.unsettled_effects} unsettled, "
                        f"{status.ambiguous_effects} ambiguous",
                    ),
                    ("events", status.events),
                    ("blobs", status.blobs),
                    ("size", f"{status.database_bytes} bytes"),
                    ("retention", None if status.retention is None else _retention(status)),
                ]
            ),
        ]
    )


def _retention(status: StateStatus) -> str:
    info = status.retention
    assert info is not None
    text = f"last sweep {timestamp(info.last_completed_at)}"
    if info.last_completed_at is not None:
        text += (
            f" ({info.last_trees_deleted} tree(s), {info.last_runs_deleted} run(s) deleted,"
            f" {info.last_trees_protected} kept)"
        )
    # The running total counts what sweeps and applied prunes deleted.
    if info.total_trees_deleted:
        text += f"; {info.total_trees_deleted} tree(s) deleted in all"
    if info.last_failure is not None:
        text += f"; last failure {timestamp(info.last_failure_at)}: {one_line(info.last_failure)}"
    return text


def verify(receipt: VerifyReceipt) -> str:
    """The verification result, one line per violation."""
    if receipt.valid:
        return "state is valid: every invariant holds"
    lines = [f"state is INVALID: {len(receipt.violations)} violation(s)"]
    lines += [f"  {violation.code}: {violation.detail}" for violation in receipt.violations]
    lines.append(
        "nothing was repaired: keep this file for a report, and restore a backup that verifies"
        " (piwf state verify BACKUP, then piwf state restore BACKUP with the server stopped)"
    )
    return "\n".join(lines)


def backup(receipt: BackupReceipt) -> str:
    """Where the backup went (the path as typed may hold control characters: escaped)."""
    return f"backup written to {one_line(receipt.destination)} ({receipt.bytes} bytes, verified)"


def prune(report: PruneReport) -> str:
    """What a prune deleted (or would), then the trees protected state keeps."""
    verb = "deleted" if report.applied else "would delete"
    lines = []
    if report.backup is not None:
        lines.append(backup(report.backup))
    lines.append(
        f"{verb} {report.tree_count} run tree(s), {report.run_count} run(s),"
        f" finished before {timestamp(report.before, offset=True)}"
    )
    lines += [f"  {tree.root_run_id}  ({tree.runs} run(s))" for tree in report.trees]
    if report.protected_count:
        lines.append(f"kept {report.protected_count} expired tree(s) that protected state holds:")
        lines += [f"  {tree.root_run_id}  {', '.join(tree.reasons)}" for tree in report.protected]
        lines.append(
            "(piwf run explain RUN_ID says what holds a run; docs/RETENTION.md lists the reasons)"
        )
    if report.truncated:
        lines.append("(lists cut at 100 entries; the counts are complete)")
    return "\n".join(lines)
