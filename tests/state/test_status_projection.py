"""Status is a projection of committed facts, and reading it repairs nothing (seed 000, S11).

A run is driven through the states a crash leaves behind: a server that died mid-node (its
claim expired, its runner row still live), the recovery that finds a manual effect it cannot
prove, then a queue row left stale beside a finished run. At each point every read a status
renderer uses (the run row and its display status, the server's counts, the state counts, the
invariant check, the expired-claim scan, the effects) is taken, and the whole database must be
row for row what it was before the reads.
"""

from __future__ import annotations

import itertools
from typing import Any

from piwf import canonical
from piwf.clock import FakeClock
from piwf.lifecycle import EffectStatus, RunStatus
from piwf.state import StateDatabase
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.diagnostics import find_violations, server_counts, status_counts
from piwf.state.enums import QueueStatus
from piwf.state.execution import runs
from piwf.workflow import identity
from piwf.workflow import port as p
from piwf.workflow.nodes import Recovery

from .test_execution_support import (
    LEASE_MS,
    StorePort,
    create,
    dump,
    exit_and_recover,
    launch,
    two_step,
)

RUN = "run-1"


def every_read(db: StateDatabase) -> dict[str, Any]:
    """What status renderers read, each through its production function."""
    with db.read() as tx:
        run = runs.load_run(tx, RUN)
        assert run is not None
        return {
            "display": run.display_status,
            "queue": run.queue_status,
            "server": server_counts(tx),
            "state": status_counts(tx),
            "violations": {violation.code for violation in find_violations(tx)},
            "expired": ex.expired_running_runs(tx),
            "effects": [effect.status for effect in fx.list_effects(tx, run.resource_id)],
        }


def read_without_writing(db: StateDatabase) -> dict[str, Any]:
    before = dump(db)
    seen = every_read(db)
    assert dump(db) == before, "a read changed the database"
    return seen


# conformance: S11
def test_status_shows_committed_facts_and_reading_it_repairs_nothing(
    db: StateDatabase, clock: FakeClock
) -> None:
    create(db, two_step(), RUN, {"who": "ada"})
    launched = launch(db)
    store = StorePort(db, launched)
    store.node_started(p.NodeStarted(RUN, "greet", 1, 1, "action", 1, None, None))
    request = {"x": 1}
    store.reserve_effect(
        p.EffectReservation(
            RUN,
            "greet",
            1,
            identity.effect_key(RUN, "svc.apply", "greet", 1),
            "svc.apply",
            Recovery.MANUAL,
            request,
            canonical.digest_hex(request),
        )
    )

    # The server dies mid-node: its claim expires with the runner row still live. The owner
    # is counted as expired, never as an active lease, and no read recovers the run.
    clock.advance(LEASE_MS + 1)
    stale = read_without_writing(db)
    assert stale["state"]["activeLeases"] == 0 and stale["state"]["expiredLeases"] == 1
    assert stale["server"]["expiredLeases"] == 1
    assert [expired.run_id for expired in stale["expired"]] == [RUN]
    assert (stale["display"], stale["effects"]) == ("running", [EffectStatus.APPLYING])
    assert read_without_writing(db) == stale, "a second read sees the same facts"

    # Recovery (a write) cannot prove the manual effect: it is shown unresolved, and the
    # ambiguous label wins over the parked queue row.
    exit_and_recover(db, launched)
    ambiguous = read_without_writing(db)
    assert (ambiguous["display"], ambiguous["queue"]) == ("ambiguous", QueueStatus.PARKED)
    assert ambiguous["effects"] == [EffectStatus.AMBIGUOUS]
    assert ambiguous["server"]["ambiguousEffects"] == 1
    assert ambiguous["violations"] == set()

    # A finished run beside a queue row that still says running (a stale row): the terminal
    # fact is what every renderer shows; the check reports the row and no read rewrites it.
    with db.write() as tx:
        tx.execute(
            "UPDATE runs SET status = 'completed', finished_at = updated_at WHERE run_id = ?",
            (RUN,),
        )
        tx.execute("UPDATE run_queue SET status = 'running' WHERE run_id = ?", (RUN,))
    finished = read_without_writing(db)
    assert (finished["display"], finished["queue"]) == ("completed", QueueStatus.RUNNING)
    assert finished["server"]["running"] == 0, "a finished run is not counted as running"
    assert finished["violations"], "the stale queue row is reported, not repaired"


def test_a_terminal_status_wins_over_every_queue_row_and_flag() -> None:
    """The seed's precedence: terminal > ambiguous > paused > waiting > running > queued."""
    for status, paused, ambiguous, pending, queue in itertools.product(
        RunStatus, (False, True), (False, True), (False, True), (None, *QueueStatus)
    ):
        shown = runs.display_status(
            status,
            paused=paused,
            has_ambiguous_effect=ambiguous,
            has_pending_request=pending,
            queue_status=queue,
        )
        if status.value in ("completed", "failed", "timed_out", "cancelled"):
            assert shown == status.value
        elif ambiguous:
            assert shown == "ambiguous"
        elif paused:
            assert shown == "paused"
        else:
            assert shown not in ("ambiguous", "paused", "completed", "failed", "cancelled")
