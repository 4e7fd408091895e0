"""Deleting many trees in one call (piwf/state/retention.py ``delete_trees``, what
``piwf state prune --apply`` runs): the same rows go as deleting each tree alone in turn, each
tree is still judged again after the deletions before it, and what the deleted trees referenced
(definitions, projects, blobs) is looked up in statements that do not grow with the trees.

Each case builds one home, copies it with the backup API, and deletes on the copies, so both
ways start from the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from piwf.clock import FakeClock
from piwf.lifecycle import Applied
from piwf.state import StateDatabase
from piwf.state import retention as rt
from piwf.state.backup import backup_database
from tests.state.test_execution_support import dump, violations
from tests.state.test_retention import (
    DAY,
    completed,
    cutoff,
    first_attempt,
    input_hash,
    orphan_blobs,
    sql,
)


def _copy(db: StateDatabase, clock: FakeClock, path: Path) -> StateDatabase:
    backup_database(db, path)
    return StateDatabase(path, clock=clock)


def _one_by_one(db: StateDatabase, clock: FakeClock, roots: list[str]) -> list[object]:
    results = []
    for root in roots:
        with db.write() as tx:
            results.append(rt.delete_tree(tx, root, tx.now, cutoff(clock)))
    return results


def _together(db: StateDatabase, clock: FakeClock, roots: list[str]) -> rt.TreesDeletion:
    with db.write() as tx:
        return rt.delete_trees(tx, roots, tx.now, cutoff(clock))


def _shape(result: object) -> object:
    """A result without its blob count (per tree alone, in the total together)."""
    if isinstance(result, Applied):
        return ("applied", result.value.root_run_id, result.value.run_ids, result.value.resources)
    return result


def test_deleting_trees_together_leaves_what_deleting_them_one_by_one_leaves(
    db: StateDatabase, clock: FakeClock, tmp_path: Path
) -> None:
    completed(db, "run-a", "same")
    completed(db, "run-b", "same")  # shares its input, outputs and definition with run-a
    completed(db, "run-c", "c")
    clock.advance(31 * DAY)
    completed(db, "run-d", "same")  # recent: protected, and it keeps the shared blobs
    completed(db, "run-e", "e")  # recent too; only its own blobs
    # A receipt outside any tree keeps run-c's input past its tree.
    sql(
        db,
        "INSERT INTO server_commands (request_id, client_id, operation, idempotency_key,"
        " request_fingerprint, run_id, outcome, receipt_hash, server_epoch, created_at,"
        " completed_at) VALUES ('r', 'c', 'run.start', 'k', ?, 'run-c', 'accepted', ?, 1, 0, 0)",
        (bytes(32), input_hash(db, "run-c")),
    )
    roots = ["run-a", "run-b", "run-c", "run-d", "run-missing"]
    alone = _copy(db, clock, tmp_path / "alone.sqlite")
    together = _copy(db, clock, tmp_path / "together.sqlite")
    try:
        each = _one_by_one(alone, clock, roots)
        done = _together(together, clock, roots)

        assert [root for root, _ in done.results] == roots
        assert [_shape(r) for _, r in done.results] == [_shape(r) for r in each]
        assert isinstance(each[3], rt.TreeProtected) and each[3].reasons == ("recent",)
        assert done.blobs == sum(r.value.blobs for r in each if isinstance(r, Applied)) > 0
        assert dump(together) == dump(alone)
        assert violations(together) == [] and orphan_blobs(together) == 0
        with together.read() as tx:
            assert tx.scalar("SELECT count(*) FROM workflow_definitions") == 1, "d and e use it"
    finally:
        alone.close()
        together.close()


def _borrow(db: StateDatabase, borrower: str, lender: str) -> None:
    """A row of ``borrower``'s tree (its first attempt) that references ``lender``'s run: the
    lender is protected until the borrower's tree, and that row with it, is gone."""
    db.connection.execute(
        "ALTER TABLE node_attempts ADD COLUMN borrowed_run TEXT REFERENCES runs(run_id)"
    )
    sql(
        db,
        "UPDATE node_attempts SET borrowed_run = ? WHERE attempt_id = ?",
        (lender, first_attempt(db, borrower)),
    )


def test_each_tree_is_judged_again_after_the_deletions_before_it(
    db: StateDatabase, clock: FakeClock, tmp_path: Path
) -> None:
    completed(db, "run-a", "a")
    completed(db, "run-b", "b")
    clock.advance(31 * DAY)
    a_first = _copy(db, clock, tmp_path / "a-first.sqlite")
    for home in (db, a_first):
        _borrow(home, "run-a", "run-b")
    with db.read() as tx:
        verdicts = {v.root_run_id: v.reasons for v in rt.select_trees(tx, tx.now, cutoff(clock))}
    assert verdicts == {"run-a": (), "run-b": ("crossTree:node_attempts",)}
    try:
        # run-a first: run-b is judged again after run-a went, and goes too. A verdict kept
        # from before the call would have kept it.
        done = _together(a_first, clock, ["run-a", "run-b"])
        assert [type(r) for _, r in done.results] == [Applied, Applied]
        with a_first.read() as tx:
            assert tx.scalar("SELECT count(*) FROM runs") == 0
        assert orphan_blobs(a_first) == 0
    finally:
        a_first.close()
    # run-b first: still referenced when its turn comes, so it stays.
    done = _together(db, clock, ["run-b", "run-a"])
    protected = done.results[0][1]
    assert isinstance(protected, rt.TreeProtected)
    assert protected.reasons == ("crossTree:node_attempts",)
    assert isinstance(done.results[1][1], Applied)
    assert violations(db) == [] and orphan_blobs(db) == 0


def _statements(db: StateDatabase, clock: FakeClock, roots: list[str]) -> int:
    seen: list[str] = []

    def counted(statement: str) -> None:
        if not seen or seen[-1] != statement:  # a cascade reports its DELETE once per step
            seen.append(statement)

    db.connection.set_trace_callback(counted)
    try:
        done = _together(db, clock, roots)
    finally:
        db.connection.set_trace_callback(None)
    assert all(isinstance(result, Applied) for _, result in done.results)
    return len(seen)


def _judging_one(db: StateDatabase, clock: FakeClock, root: str) -> int:
    """Statements to judge one tree again inside a deletion: judge_tree's, without reading the
    schema's foreign keys (read once per call)."""
    counts = []
    for judge in (
        lambda tx: rt.judge_tree(tx, root, tx.now, cutoff(clock)),
        rt.foreign_keys,
    ):
        count = 0

        def counted(_statement: str) -> None:
            nonlocal count
            count += 1

        with db.read() as tx:
            db.connection.set_trace_callback(counted)
            try:
                judge(tx)
            finally:
                db.connection.set_trace_callback(None)
        counts.append(count)
    return counts[0] - counts[1]


def test_what_the_trees_referenced_is_looked_up_in_statements_that_do_not_grow_with_them(
    db: StateDatabase, clock: FakeClock, tmp_path: Path
) -> None:
    roots = [completed(db, f"run-{index}", str(index)) for index in range(6)]
    clock.advance(31 * DAY)
    judging = _judging_one(db, clock, roots[0])
    one = _copy(db, clock, tmp_path / "one.sqlite")
    six = _copy(db, clock, tmp_path / "six.sqlite")
    try:
        more = _statements(six, clock, roots) - _statements(one, clock, roots[:1])
    finally:
        one.close()
        six.close()
    # Each further tree: loaded and judged again, then its savepoint, its one DELETE and the
    # check that its runs went (81 here). The blob columns, definitions and projects it
    # referenced add nothing beyond a statement or two for all of them (they added about 50
    # statements per tree, and a read of every foreign key, when each tree looked them up alone).
    assert more <= 5 * (judging + 4) + 2, (more, judging)
