"""Startup recovery of what the previous server left behind (seed 001 "Recovery").

The seed's twelve steps, in order, and where piwf does each:

1. *take the global server epoch*: :func:`piwf.server.lifecycle.run_server` takes the
   single-instance lock, then ``epoch + 1`` in ``server_state`` (fault ``server.after_epoch``);
   every later command and runner transaction checks that epoch.
2. *reap runner records that match an exact stale process identity*: first the headless
   agent groups the dead server's runners left registered
   (:func:`~piwf.server.runs.agents.recover_agent_groups`: each killed only if it is provably
   still that group, marked ``reaped``, and every open active interval closed at its
   ``observed_at``, so the downtime is never charged); then
   (:func:`~piwf.server.runs.recovery.recover_runs`) every runner row
   still live from an older epoch; its process group is killed only if that exact process
   (start identity, never a bare pid) still runs, and the row is closed ``orphaned``.
3. *find expired running runs and active attempts*: there too, the previous server's claims end
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
8. *supervised timeout recovery of interactive requests whose active-time deadline passed*
   (:func:`expire_due_agent_deadlines`, after the runs are recovered and every interval the
   dead server left open was closed at its ``observed_at`` in step 2, so downtime is never
   charged): an agent request whose active time reached its ``timeout_ms`` is closed
   ``expired`` under a control claim and its run made eligible, before the scheduler starts
   any other work; the next runner records ``timed_out`` on the same attempt. Waiting, pause
   and server downtime consume no active time (docs/AGENTS.md "Deadlines"). A headless agent
   request whose runner died with time left is resumed by the next runner, which runs the
   command again (a resumed turn).
9. *resume provisional validating submissions in a new supervised child*:
   :func:`revalidate_left_by_crash` queues every ``validating`` agent submission (no child of
   this server validates it yet) for a new validation child, admitted first by the pool; the
   new child gets a new validation id, so nothing the old one might have said can settle it.
   A client that repeats its submit with the same idempotency key waits for that outcome.
10., 11. *branch reports and model turns*: no sessions yet; nothing to wait for.
12. *request a retention sweep once idle*: ``run_server`` calls
    :meth:`~piwf.server.maintenance.RetentionSweeper.request` after recovery.

Before the seed's steps, :func:`repair_left_by_older_versions` mends rows an older piwf wrote
in a shape this one no longer writes (today: a finished run still flagged ``paused``, which
kept it out of every prune). Each repair is idempotent.

Claim loss is a handoff, never a failure: the old owner writes nothing after it. Recovery is
idempotent: a crash half-way (fault ``recovery.after_each_fix``) leaves rows the next start
recovers the same way.
"""

from __future__ import annotations

import logging
from typing import Protocol

from piwf.errors import PiwfError
from piwf.server.resources.recovery import recover_reconciles
from piwf.server.runs.agents import recover_agent_groups
from piwf.server.runs.recovery import recover_runs
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.enums import ActorType
from piwf.state.execution import submissions
from piwf.state.records import Actor

log = logging.getLogger("piwf.server")


class ValidationQueue(Protocol):
    """Where recovery step 9 hands the submissions to validate again."""

    def request(self, submission_id: str, run_id: str) -> None:
        """Queue one ``validating`` submission for a new validation child."""
        ...


def recover_previous_server(
    db: StateDatabase,
    *,
    epoch: int,
    previous_server_id: str | None,
    owner_id: str,
    lease_ms: int,
) -> int:
    """Recover the agent groups, the runs, then the reconciles, of older epochs, then expire
    the agent requests already due; return how many agent processes were reaped, runner rows
    closed, runs decided or requests expired."""
    repair_left_by_older_versions(db)
    groups = recover_agent_groups(db)
    runs = recover_runs(
        db, epoch=epoch, previous_server_id=previous_server_id, owner_id=owner_id, lease_ms=lease_ms
    )
    reconciles = recover_reconciles(
        db, epoch=epoch, previous_server_id=previous_server_id, owner_id=owner_id, lease_ms=lease_ms
    )
    expired = expire_due_agent_deadlines(db, owner_id=owner_id, lease_ms=lease_ms)
    return groups + runs + reconciles + expired


def repair_left_by_older_versions(db: StateDatabase) -> int:
    """Clear the pause flag an older piwf left on terminal runs (it cancelled a paused run
    without clearing it, so prune kept the run as ``notTerminal`` for ever); return how many
    runs were repaired. Idempotent; one write transaction."""
    with db.write() as tx:
        repaired = ex.clear_stale_pauses(tx)
    if repaired:
        log.info("recovery: cleared a stale pause flag on %d finished run(s)", repaired)
    return repaired


def expire_due_agent_deadlines(db: StateDatabase, *, owner_id: str, lease_ms: int) -> int:
    """Step 8: expire every agent request whose active time already reached its deadline
    (one transaction; each under its own control claim); return how many. A failure is
    logged, not raised: the loop's deadline pass tries again right after startup."""
    try:
        with db.write() as tx:
            expired = ex.expire_due_agent_requests(
                tx,
                actor=Actor(ActorType.POLICY, owner_id),
                control_owner_id=owner_id,
                lease_ms=lease_ms,
            )
    except PiwfError as error:
        log.warning("recovery: expiring due agent deadlines failed: %s", error)
        return 0
    if expired:
        log.info("recovery: %d agent step(s) reached their active-time deadline", len(expired))
    return len(expired)


def revalidate_left_by_crash(db: StateDatabase, validations: ValidationQueue) -> int:
    """Recovery step 9: queue every ``validating`` submission a previous server left for a
    new validation child (called once, before this server admits any work); return how many."""
    with db.read() as tx:
        left = submissions.validating_left_by_crash(tx)
    for submission in left:
        validations.request(submission.submission_id, submission.run_id)
    return len(left)
