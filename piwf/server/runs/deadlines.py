"""The loop duty that keeps agent steps' active-time deadlines (``timeout_ms`` of active time).

Active time only grows while an agent works (an interval of ``attempt_active_intervals`` is
open: a headless agent command runs under a live runner), so a deadline can only fall due then.
One pass::

    read the pending agent deadlines (state/execution/expiries.py)
    due, and this server executes the run now ─▶ stop that runner (the pool's stop path, once
        per generation); its exit shuts down and reaps the agent group, closes the interval
        and releases the run claim, and the exit nudges the next pass
    due, and no live claim holds the run ─▶ expire_due_agent_requests: one control claim
        closes the request ``expired`` and makes the run eligible; the scheduler is woken, and
        the next runner (the timeout-recovery child) records ``timed_out`` on the same attempt
    next pass ─▶ at the earliest instant a counting deadline falls due, or the poll interval

The pass runs once right after startup (after recovery closed every interval a dead server left
open at its ``observed_at``, and expired what was already due), after every run change (a runner
exit, an agent process registered or unregistered) and at least every poll interval as a
backstop. The scheduler applies the same expiry in its claim transaction before it picks the
next run (DESIGN.md §6), so a run whose runner was stopped at its deadline resumes into its
timeout and never runs its agent again. A paused run has no open interval and is never expired:
it continues with the time it had left when it is resumed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from piwf import faults
from piwf.errors import PiwfError
from piwf.server.loop import EventLoop, Timer
from piwf.state import StateDatabase, Transaction
from piwf.state import execution as ex
from piwf.state.enums import ActorType
from piwf.state.execution import active_time
from piwf.state.leases import Claim
from piwf.state.records import Actor

log = logging.getLogger("piwf.server")


class RunnerControl(Protocol):
    """What the duty needs from the runner pool."""

    @property
    def owner_id(self) -> str:
        """The lease owner id of this server's claims."""
        ...

    @property
    def lease_ms(self) -> int:
        """How long a claim lasts between renewals."""
        ...

    def verify_server_claim(self, tx: Transaction) -> None:
        """Raise unless this server still holds its epoch (inside ``tx``)."""
        ...

    def claim_of_run(self, run_id: str) -> Claim | None:
        """The live claim this server holds on ``run_id``, if it executes it now."""
        ...

    def stop_run(self, run_id: str, reason: str) -> None:
        """Stop the child of ``run_id`` (SIGTERM, then a bounded SIGKILL)."""
        ...


class AgentDeadlines:
    """Stops agents whose active time ran out and expires their requests."""

    def __init__(
        self,
        *,
        db: StateDatabase,
        loop: EventLoop,
        runners: RunnerControl,
        poll_s: float,
        expired: Callable[[list[str]], None],
    ) -> None:
        self.db = db
        self.loop = loop
        self.runners = runners
        self.poll_s = poll_s
        self.expired = expired
        #: Run id -> the claim generation whose runner this duty already stopped.
        self._stopped: dict[str, int] = {}
        self._timer: Timer | None = None
        self.nudge()

    def nudge(self) -> None:
        """Run a pass on the next loop turn (startup, a run change, an agent registered)."""
        self._schedule(0.0)

    def run_pass(self) -> None:
        """Stop the runners of due agents, expire what no live claim holds, reschedule."""
        self._timer = None
        expired: list[str] = []
        next_due: int | None = None
        now = 0
        try:
            with self.db.read() as tx:
                pending = ex.pending_agent_deadlines(tx)
            self._stop_due_runners({item.run_id for item in pending if item.due})
            if not pending:  # nothing counts: nothing to expire, no deadline to wait for
                self._schedule(self.poll_s)
                return
            with self.db.write() as tx:
                self.runners.verify_server_claim(tx)
                owner = self.runners.owner_id
                found = ex.expire_due_agent_requests(
                    tx,
                    actor=Actor(ActorType.POLICY, owner),
                    control_owner_id=owner,
                    lease_ms=self.runners.lease_ms,
                )
                expired = [item.run_id for item in found]
                next_due = ex.next_agent_deadline(tx)
                now = tx.now
        except PiwfError as error:
            log.warning("agent deadlines: a pass failed: %s", error)
        for run_id in expired:
            self._stopped.pop(run_id, None)
            log.info("run %s: its agent step reached its active-time deadline", run_id)
        if expired:
            self.expired(expired)
        delay = self.poll_s
        if next_due is not None and next_due > now:
            # A due instant already past is a runner being stopped: its exit nudges the next
            # pass, and the poll interval bounds the wait otherwise.
            delay = min(delay, (next_due - now) / 1000)
        self._schedule(delay)

    def _stop_due_runners(self, run_ids: set[str]) -> None:
        """Stop the live runner of each run, once per claim generation.

        The run's open interval is observed first: its agent was seen working up to this
        moment, so a server that dies before the stop completes charges exactly the time up to
        the deadline, and its restart expires the request at once.
        """
        for run_id in list(self._stopped):
            if run_id not in run_ids:
                del self._stopped[run_id]
        for run_id in sorted(run_ids):
            claim = self.runners.claim_of_run(run_id)
            if claim is None or self._stopped.get(run_id) == claim.generation:
                continue
            self._stopped[run_id] = claim.generation
            with self.db.write() as tx:
                active_time.observe_run(tx, run_id)
            faults.point("deadline.before_stop")
            log.info("run %s: active-time deadline reached; stopping its runner", run_id)
            self.runners.stop_run(run_id, "expired")

    def _schedule(self, delay_s: float) -> None:
        if self.loop.stop_requested:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(max(0.0, delay_s), self.run_pass)
