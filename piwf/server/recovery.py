"""Startup recovery of what the previous server left behind.

Runs once, after this server took its epoch and before it listens:

1. end the run claims the previous server held (it is proven dead: this server holds the
   single-instance lock and the previous process identity is gone);
2. for every runner row still marked live from an older epoch, kill its process group if that
   exact process (start identity, never a bare pid) still runs, close the row ``orphaned`` and
   decide its run like any interrupted work: claimable again from the last committed boundary,
   with uncertain effects decided by their recovery policy;
3. make claimable the runs the previous server claimed but never launched;
4. recover its resource reconciles (:mod:`piwf.server.reconcile_recovery`).

Recovery is idempotent: a crash half-way leaves rows the next start recovers the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import psutil

from piwf import faults
from piwf.errors import PiwfError
from piwf.server.processes import is_alive
from piwf.server.reconcile_recovery import recover_reconciles
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.enums import ActorType, OwnerType, RunnerStatus
from piwf.state.leases import expire_claims_of
from piwf.state.records import Actor

log = logging.getLogger("piwf.server")

_ORPHANED_RUNNERS = """
SELECT runner_epoch, run_id, pid, process_start_identity FROM run_runners
WHERE status IN ('starting', 'ready', 'running') AND server_epoch < ?
ORDER BY started_at
"""


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
        orphans = [tuple(row) for row in tx.all(_ORPHANED_RUNNERS, (epoch,))]
    actor = Actor(ActorType.SERVER, owner_id)
    for runner_epoch, run_id, pid, identity in orphans:
        if pid is not None and identity is not None and is_alive(identity):
            _kill_group(pid)
        faults.point("recovery.after_each_fix")
        try:
            with db.write() as tx:
                ex.record_runner_exit(tx, runner_epoch, RunnerStatus.ORPHANED)
                ex.recover_after_runner_exit(
                    tx,
                    run_id,
                    runner_epoch=runner_epoch,
                    actor=actor,
                    owner_id=owner_id,
                    lease_ms=lease_ms,
                )
        except PiwfError as error:
            log.warning("recovery: run %s was not recovered: %s", run_id, error)
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


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(psutil.Error):
        psutil.Process(pid).wait(timeout=5)
