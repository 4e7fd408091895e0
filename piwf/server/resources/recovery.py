"""Startup recovery of the reconciles a killed server left behind.

Runs once, after this server took its epoch and before it listens (called from
:func:`piwf.server.recovery.recover_previous_server`):

1. end the reconcile claims the previous server held (it is proven dead);
2. for every resource-runner row still live from an older epoch, kill its process group if that
   exact process (start identity, never a bare pid) still runs, close the row ``orphaned``,
   fence its claim with a new generation, turn the effects it left ``applying`` into
   ``ambiguous`` (the next reconcile observes before it may apply again) and requeue the
   resource at once, with no error counted;
3. enqueue the parent of every child run that ended while no server watched.

Idempotent: a crash half-way leaves rows the next start recovers the same way.
"""

from __future__ import annotations

import logging

from piwf.errors import PiwfError
from piwf.processes import is_alive, kill_orphan_groups
from piwf.state import StateDatabase
from piwf.state.enums import OwnerType
from piwf.state.leases import expire_claims_of
from piwf.state.resources import calls as calls
from piwf.state.resources import reconciles as rc
from piwf.state.resources import runners as runners

log = logging.getLogger("piwf.server")


def recover_reconciles(
    db: StateDatabase,
    *,
    epoch: int,
    previous_server_id: str | None,
    owner_id: str,
    lease_ms: int,
) -> int:
    """Recover the reconciles of older epochs; return how many runner rows were closed."""
    if previous_server_id is not None:
        with db.write() as tx:
            expire_claims_of(tx, OwnerType.RESOURCE_MANAGER, previous_server_id)
    with db.read() as tx:
        orphans = runners.orphaned_runners(tx, epoch)
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
        try:
            with db.write() as tx:
                rc.recover_orphaned_reconcile(tx, runner, owner_id=owner_id, lease_ms=lease_ms)
        except PiwfError as error:
            log.warning("recovery: reconcile %s was not recovered: %s", runner.reconcile_id, error)
    with db.write() as tx:
        calls.notify_finished_children(tx)
    if orphans:
        log.info("recovery: closed %d reconcile(s) of an earlier server", len(orphans))
    return len(orphans)
