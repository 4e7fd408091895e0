"""Judging many trees at once (piwf/state/retention.py ``select_trees``): each tree gets exactly
the reasons it gets judged alone, and the statements do not grow with the trees.

The protections are planted by the same helpers as tests/state/test_retention.py, all at once,
on one tree of a home where other trees sit beside it in the same chunk (one of them the
cross-tree reference's other end).
"""

from __future__ import annotations

from piwf.clock import FakeClock
from piwf.state import StateDatabase
from piwf.state import retention as rt
from tests.state.test_retention import DAY, PROTECTIONS, completed, cutoff, sql


def _verdicts(db: StateDatabase, clock: FakeClock) -> dict[str, tuple[str, ...]]:
    with db.read() as tx:
        return {v.root_run_id: v.reasons for v in rt.select_trees(tx, tx.now, cutoff(clock))}


def _alone(db: StateDatabase, clock: FakeClock, root: str) -> tuple[str, ...]:
    with db.read() as tx:
        verdict = rt.judge_tree(tx, root, tx.now, cutoff(clock))
    assert verdict is not None
    return verdict.reasons


def test_every_tree_judged_together_gets_the_reasons_it_gets_alone(
    db: StateDatabase, clock: FakeClock
) -> None:
    for run_id in ("run-a", "run-b", "run-c"):
        completed(db, run_id, run_id)
    clock.advance(31 * DAY)
    for reason, block, _unblock in PROTECTIONS:
        if reason != "request":  # the decision's block makes the same request (then cancels it)
            block(db, clock)
    sql(db, "UPDATE interactive_requests SET status = 'pending' WHERE request_id = 'req-a'")

    together = _verdicts(db, clock)

    assert together == {root: _alone(db, clock, root) for root in together}
    # Report order: the protections in their table's order, then the foreign keys by table name.
    # run-b, restarted from run-a now, is no root any more: no candidate (its tree is run-a's
    # crossTree reason).
    assert together == {
        "run-a": (
            "queue",
            "attempt",
            "request",
            "message",
            "decision",
            "lease",
            "effect",
            "runner",
            "reference:later_feature",
            "crossTree:runs",
        ),
        "run-c": (),
    }


def _statements(db: StateDatabase, clock: FakeClock) -> int:
    count = 0

    def counted(_statement: str) -> None:
        nonlocal count
        count += 1

    db.connection.set_trace_callback(counted)
    try:
        verdicts = _verdicts(db, clock)
    finally:
        db.connection.set_trace_callback(None)
    assert all(reasons == () for reasons in verdicts.values())
    return count


def test_judging_runs_the_same_statements_for_one_tree_or_many(
    db: StateDatabase, clock: FakeClock
) -> None:
    completed(db, "run-1", "1")
    clock.advance(31 * DAY)
    one = _statements(db, clock)
    for index in range(2, 7):
        completed(db, f"run-{index}", str(index))
    clock.advance(31 * DAY)

    assert _statements(db, clock) == one  # was about 75 statements per tree
