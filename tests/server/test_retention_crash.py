"""Crash cases for the retention fault points: SIGKILL the server inside the sweep, restart,
converge (tests/server/test_crash_matrix.py covers the command and runner paths).

- ``retention.after_tree_delete@1``: one tree's deletion committed, the rest not started. The
  file holds whole trees only; the next server completes the sweep.
- ``retention.before_vacuum@1``: every deletion and the sweep's completion committed, VACUUM
  not started. The next server finds a sound file and does not sweep again within the interval.

Both start from the planted old state of tests/server/test_retention.py (five 40-day-old
trees with large inputs, so that VACUUM is due once ``PIWF_RETENTION_VACUUM_MIN_BYTES`` is low).
"""

from __future__ import annotations

from pathlib import Path

from piwf.state import StateDatabase, compaction
from piwf.state import retention as rt
from piwf.state.diagnostics import find_violations
from tests.server.harness import ServerFactory, raw_client, wait_for
from tests.server.test_execution import FAST
from tests.server.test_retention import (
    OldState,
    old_state,  # noqa: F401 - a fixture used by name
    restore,
    retention_status,
    run_ids,
    verify,
)

#: The retention fault points and the hit each case kills at (for the matrix's coverage check).
POINTS = {"retention.after_tree_delete": 1, "retention.before_vacuum": 1}
VACUUM_NOW = {"PIWF_RETENTION_VACUUM_MIN_BYTES": "1"}


def killed_at(servers: ServerFactory, state: OldState, point: str, log: Path) -> None:
    """Start a server on the old state armed to SIGKILL itself at ``point``; wait for it."""
    restore(state, servers.home)
    armed = servers.start(
        env={**FAST, **VACUUM_NOW, "PIWF_FAULTS": f"{point}@1=kill", "PIWF_FAULTS_LOG": str(log)}
    )
    assert armed.ready["ok"] is True, armed.ready
    assert armed.process.wait(timeout=30) == -9, "the server died at the fault point"
    assert log.read_text().split()[1:3] == [point, "1"]


def whole_trees(home: Path, roots: tuple[str, ...]) -> dict[str, bool]:
    """For each root: True if its tree is complete, False if nothing of it is left; a partial
    tree fails the test."""
    found = {}
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        assert [v.code for v in find_violations(tx)] == []
        for root in roots:
            tree = rt.Tree(root, (root,), (f"run:{root}",))
            counts = {
                table: tx.scalar(f"SELECT count(*) FROM {table} WHERE {where}", tree.params())
                for table, where in rt.TREE_ROWS.items()
                if table in ("runs", "resources", "events", "run_queue", "node_attempts")
            }
            present = {table for table, count in counts.items() if count}
            assert present in (set(counts), set()), f"tree {root} is partial: {counts}"
            found[root] = bool(present)
    return found


def test_a_kill_after_a_tree_deletion_leaves_whole_trees_and_the_sweep_completes(
    servers: ServerFactory,
    old_state: OldState,  # noqa: F811
    tmp_path: Path,
) -> None:
    killed_at(servers, old_state, "retention.after_tree_delete", tmp_path / "faults.log")
    left = whole_trees(servers.home, old_state.old)
    assert sorted(left.values()) == [False, True, True, True, True], "one tree went, whole"
    survivor = servers.start(env={**FAST, **VACUUM_NOW})
    assert survivor.ready["ok"] is True
    with raw_client(survivor) as client:
        wait_for(lambda: run_ids(client) == {old_state.waiting}, timeout_s=30)
        done = wait_for(lambda: (s := retention_status(client)).get("lastCompletedAt") and s)
        assert done["totalTreesDeleted"] == 5
        assert verify(client) == {"valid": True, "violations": []}
    assert survivor.terminate() == 0
    assert whole_trees(servers.home, old_state.old) == dict.fromkeys(old_state.old, False)


def test_a_kill_before_vacuum_keeps_the_committed_deletions(
    servers: ServerFactory,
    old_state: OldState,  # noqa: F811
    tmp_path: Path,
) -> None:
    killed_at(servers, old_state, "retention.before_vacuum", tmp_path / "faults.log")
    assert whole_trees(servers.home, old_state.old) == dict.fromkeys(old_state.old, False)
    with StateDatabase(servers.home / "state.sqlite", mode="read-only") as db:
        with db.read() as tx:
            completed_at = rt.read_status(tx).last_completed_at
        assert completed_at is not None, "the sweep completed before compaction"
        assert compaction.space(db).free_pages > 0, "free pages stay reusable without VACUUM"
    survivor = servers.start(env={**FAST, **VACUUM_NOW})
    assert survivor.ready["ok"] is True
    with raw_client(survivor) as client:
        assert run_ids(client) == {old_state.waiting}
        assert verify(client) == {"valid": True, "violations": []}
        assert retention_status(client)["lastCompletedAt"] == completed_at, "no second sweep"
