"""Startup recovery of what the previous server left behind (seed 001 "Recovery").

The seed's twelve steps, in order, and where piwf does each:

1. *take the global server epoch*: :func:`piwf.server.lifecycle.run_server` takes the
   single-instance lock, then ``epoch + 1`` in ``server_state`` (fault ``server.after_epoch``);
   every later command and runner transaction checks that epoch.
2. *reap runner records that match an exact stale process identity*: below, every runner row
   still live from an older epoch; its process group is killed only if that exact process
   (start identity, never a bare pid) still runs, and the row is closed ``orphaned``.
3. *find expired running runs and active attempts*: below, the previous server's claims end
   (it is proven dead: this server holds the lock), and runs it claimed but never launched are
   found by ``expired_running_runs``.
4. *read managed effect state before deciding whether work may repeat*, 5. *park uncertain
   effects for review*, 6. *make pure and settled work claimable*: each run goes through
   ``recover_after_runner_exit``, one transaction per run: an ``applying`` idempotent effect
   returns to ``pending``, an ``applying`` manual one becomes ``ambiguous`` and parks the run
   ``effectAmbiguous``; otherwise the run is claimable from its last committed boundary (a
   pure compute visit may run again). An ``orphaned`` runner counts no crash.
7. *restore pending requests, decisions and scheduled resource work*: requests and decisions
   are rows that survive as they are (a run with a pending request is ``waiting``); the
   :class:`~piwf.server.runs.answers.DecisionDeadlines` pass runs right after startup, so a deadline
   that passed while no server ran is settled at once; resource reconciles of the dead server
   are recovered by :mod:`piwf.server.resources.recovery` and due queue rows are admitted by
   the scheduler.
8. *supervised timeout recovery of interactive requests during a reported model turn*: piwf
   has no sessions or model turns yet; waiting and server downtime consume no node timeout.
9. *resume provisional validating submissions in a new supervised child*: an answer commits
   with its request ``answered`` and the run eligible, so the next runner child consumes and
   (for an agent node) validates it; the server never runs ``validate``.
10., 11. *branch reports and model turns*: no sessions yet; nothing to wait for.
12. *request a retention sweep once idle*: ``run_server`` calls
    :meth:`~piwf.server.maintenance.RetentionSweeper.request` after recovery.

Claim loss is a handoff, never a failure: the old owner writes nothing after it. Recovery is
idempotent: a crash half-way (fault ``recovery.after_each_fix``) leaves rows the next start
recovers the same way.
"""

from __future__ import annotations

import logging

from piwf import faults
from piwf.errors import PiwfError
from piwf.processes import is_alive, kill_orphan_groups
from piwf.server.resources.recovery import recover_reconciles
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.enums import ActorType, OwnerType, RunnerStatus
from piwf.state.leases import expire_claims_of
from piwf.state.records import Actor

log = logging.getLogger("piwf.server")


def recover_previous_server(
    db: StateDatabase,
    *,
    epoch: int,
    previous_server_id: str | None,
    owner_id: str,
    lease_ms: int,
) -> int:
    """Recover runners of older epochs; return how many runner rows were closed."""
    if previous_server_id is not None:
        with db.write() as tx:
            expired = expire_claims_of(tx, OwnerType.SERVER, previous_server_id)
        if expired:
            log.info("recovery: ended %d claim(s) of the previous server", expired)
    with db.read() as tx:
        orphans = ex.orphaned_runners(tx, epoch)
    actor = Actor(ActorType.SERVER, owner_id)
    kill_orphan_groups(
        [
            runner.pid
            for runner in orphans
            if runner.pid is not None
            and runner.process_start_identity is not None
            and is_alive(runner.process_start_identity)
        ]
    )
    for runner in orphans:
        faults.point("recovery.after_each_fix")
        try:
            with db.write() as tx:
                ex.close_runner_and_recover(
                    tx,
                    runner.run_id,
                    runner.runner_epoch,
                    RunnerStatus.ORPHANED,
                    actor=actor,
                    owner_id=owner_id,
                    lease_ms=lease_ms,
                )
        except PiwfError as error:
            log.warning("recovery: run %s was not recovered: %s", runner.run_id, error)
    if orphans:
        log.info("recovery: closed %d runner(s) of an earlier server", len(orphans))
    # Runs claimed by the previous server that never got a runner row (it died between the
    # claim and the launch record): their claims ended above, so they are expired now.
    with db.read() as tx:
        stranded = [run.run_id for run in ex.expired_running_runs(tx)]
    for run_id in stranded:
        faults.point("recovery.after_each_fix")
        try:
            with db.write() as tx:
                ex.recover_after_runner_exit(
                    tx,
                    run_id,
                    runner_epoch=None,
                    actor=actor,
                    owner_id=owner_id,
                    lease_ms=lease_ms,
                )
        except PiwfError as error:
            log.warning("recovery: run %s was not recovered: %s", run_id, error)
    reconciles = recover_reconciles(
        db,
        epoch=epoch,
        previous_server_id=previous_server_id,
        owner_id=owner_id,
        lease_ms=lease_ms,
    )
    return len(orphans) + len(stranded) + reconciles
