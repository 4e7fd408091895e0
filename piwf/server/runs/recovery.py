"""Startup recovery of the runs a previous server left behind (steps 2 to 6 of seed 001
"Recovery"; :mod:`piwf.server.recovery` lists all twelve and runs this before the reconciles).

Every runner row still live from an older epoch is closed ``orphaned`` (its process group
killed only if that exact process still runs) and its run decided from its effects and
requests; then the runs the previous server claimed but never launched. Idempotent: a crash
half-way (fault ``recovery.after_each_fix``) leaves rows the next start recovers the same way.
"""

from __future__ import annotations

import logging

from piwf import faults
from piwf.errors import PiwfError
from piwf.processes import is_alive, kill_orphan_groups
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.enums import ActorType, OwnerType, RunnerStatus
from piwf.state.leases import expire_claims_of
from piwf.state.records import Actor

log = logging.getLogger("piwf.server")


def recover_runs(
    db: StateDatabase,
    *,
    epoch: int,
    previous_server_id: str | None,
    owner_id: str,
    lease_ms: int,
) -> int:
    """Recover the runners and runs of older epochs; return how many were closed or decided."""
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
    return len(orphans) + len(stranded)
