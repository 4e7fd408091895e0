"""Active-time deadlines of agent requests: what is left of them, and the expiry transition.

An agent request's deadline is its ``timeout_ms`` (committed with the request) of **active**
time: the sum of its attempt's intervals in ``attempt_active_intervals``
(:mod:`piwf.state.execution.active_time`), which only grow while its agent works under a live
server. With no interval open nothing about a deadline depends on the wall clock: the time a run
waits, is paused, or the server is down is never charged::

    pending agent request, timeout_ms = T, active time A (an open interval counts up to now)
      A < T                      not due: T - A is left (falls due at now + T - A only while
                                 an interval is open)
      A >= T, a live claim       due, but its runner still holds the run: the server stops it
                                 first (server/runs/deadlines.py), then expires it
      A >= T, no live claim      expire_agent_request: one control claim (generation + 1)
                                 closes any open interval, the request pending → answered
                                 (answered_by = expired, answer JSON null) and makes the run
                                 eligible; the claim is released in the same transaction

The next runner resumes the same attempt; the engine turns the ``expired`` answer into
``Outcome.TIMED_OUT`` and follows a ``$result.outcome`` edge, else the run ends ``timed_out``.

A paused run is never expired (it has no interval open, so nothing is charged meanwhile; a due
request expires once the run is resumed), nor a run whose queue row is not ``parked`` (a runner
is launching or executing it, or stranded-run recovery has not decided it yet). Reads run in any
transaction; the transition runs inside the caller's ``BEGIN IMMEDIATE`` and never commits.
"""

from __future__ import annotations

from dataclasses import dataclass

from piwf.lifecycle import AnsweredBy, Applied, Conflict, InteractionKind, RunStatus
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import FailureClass, InteractionStatus, OwnerType, QueueStatus
from piwf.state.execution import active_time, queue, requests, runs
from piwf.state.execution.core import record_run_change, take_run_authority
from piwf.state.leases import release_claim
from piwf.state.records import Actor

# ``status IN (...)`` repeats the partial index's condition so the open-request index serves
# this read instead of a scan of every request ever made.
_SELECT_PENDING_AGENT_IDS = """
SELECT request_id FROM interactive_requests
WHERE status IN ('pending', 'answered') AND status = 'pending' AND kind = 'agent'
  AND timeout_ms IS NOT NULL AND (:run_id IS NULL OR run_id = :run_id)
ORDER BY created_at, request_id
"""


@dataclass(frozen=True)
class AgentDeadline:
    """Where one pending agent request's active-time budget stands at ``as_of``.

    ``active_ms`` counts an open interval up to ``as_of``; ``counting`` says one is open (its
    agent works now, so the remainder shrinks with the clock). Without an open interval the
    remainder stays as it is however long the run waits.
    """

    request_id: str
    run_id: str
    attempt_id: str
    timeout_ms: int
    active_ms: int
    counting: bool
    as_of: int

    @property
    def remaining_ms(self) -> int:
        """Active time left before the deadline (0 once it is due)."""
        return max(0, self.timeout_ms - self.active_ms)

    @property
    def due(self) -> bool:
        """Whether the request has used its whole budget."""
        return self.active_ms >= self.timeout_ms

    @property
    def due_at(self) -> int | None:
        """The instant the deadline falls due if the open interval stays open; None while no
        interval is open (no wall-clock time counts then)."""
        return self.as_of + self.remaining_ms if self.counting else None


@dataclass(frozen=True)
class Expiry:
    """One agent request closed at its deadline, and the run revision that recorded it."""

    request_id: str
    run_id: str
    attempt_id: str
    timeout_ms: int
    active_ms: int
    revision: int


# Reads -----------------------------------------------------------------------------------


def pending_agent_deadlines(tx: Transaction, run_id: str | None = None) -> list[AgentDeadline]:
    """Return the deadline of every pending agent request that has one (of one run, or of
    all), oldest request first, as of ``tx.now``."""
    rows = tx.all(_SELECT_PENDING_AGENT_IDS, {"run_id": run_id})
    if not rows:  # the common case: no agent deadline is counting anywhere
        return []
    open_attempts = {interval.attempt_id for interval in active_time.open_intervals(tx)}
    found = []
    for row in rows:
        request = requests.get_request(tx, row["request_id"])
        if request is None or request.timeout_ms is None:  # pragma: no cover - just selected
            continue
        found.append(_deadline(tx, request, request.attempt_id in open_attempts))
    return found


def agent_deadline(tx: Transaction, request_id: str) -> AgentDeadline | None:
    """Return the deadline of one pending agent request as of ``tx.now``; None for a request
    that is not a pending agent request or has no deadline (``timeout_ms=None``)."""
    request = requests.get_request(tx, request_id)
    if (
        request is None
        or request.kind is not InteractionKind.AGENT
        or request.status is not InteractionStatus.PENDING
        or request.timeout_ms is None
    ):
        return None
    intervals = active_time.intervals(tx, request.attempt_id)
    counting = any(interval.ended_at is None for interval in intervals)
    return _deadline(tx, request, counting)


def next_agent_deadline(tx: Transaction) -> int | None:
    """Return the earliest instant an open interval makes a pending agent request due (it may
    be in the past: a runner still being stopped), or None when no deadline is counting."""
    due = [d.due_at for d in pending_agent_deadlines(tx) if d.due_at is not None]
    return min(due) if due else None


def count_open_agent_deadlines(tx: Transaction) -> int:
    """Return how many pending agent requests have a deadline (``server status``)."""
    return len(tx.all(_SELECT_PENDING_AGENT_IDS, {"run_id": None}))


# The transition ----------------------------------------------------------------------------


def expire_agent_request(
    tx: Transaction, request_id: str, *, actor: Actor, control_owner_id: str, lease_ms: int
) -> Applied[Expiry] | Conflict:
    """Close the pending agent request ``request_id`` at its active-time deadline.

    Preconditions, each a ``Conflict`` that writes nothing: the request is a pending agent
    request with a deadline that is due by ``tx.now``; its run is neither paused nor terminal;
    its queue row is ``parked``; no live claim holds the run. Then one change (event
    ``interaction.expired``, under a ``control`` claim, generation + 1): an interval still open
    is closed (its agent is gone: the claim was not live), the request becomes ``answered``
    with ``answered_by = expired`` and a JSON ``null`` answer, a ``waiting`` run becomes
    ``running``, and the queue row is parked and available now (its error code kept, so a
    blocked run stays blocked); the claim is released.
    """
    deadline = agent_deadline(tx, request_id)
    if deadline is None:
        return Conflict(f"request {request_id} is not a pending agent request with a deadline")
    if not deadline.due:
        return Conflict(f"request {request_id} has {deadline.remaining_ms} ms of active time left")
    run = runs.require_run(tx, deadline.run_id)
    if run.terminal:
        return Conflict(f"run {run.run_id} is {run.status.value}")
    if run.paused:
        return Conflict(f"run {run.run_id} is paused; its deadline waits for the resume")
    if run.queue_status is not QueueStatus.PARKED:
        queue_status = "none" if run.queue_status is None else run.queue_status.value
        return Conflict(f"run {run.run_id} is not parked (queue {queue_status})")
    authority = take_run_authority(
        tx,
        run,
        claim=None,
        owner_type=OwnerType.CONTROL,
        owner_id=control_owner_id,
        lease_ms=lease_ms,
    )
    if isinstance(authority, Conflict):
        return authority
    payload = {
        "requestId": request_id,
        "timeoutMs": deadline.timeout_ms,
        "activeMs": deadline.active_ms,
    }
    revision = record_run_change(tx, run, "interaction.expired", actor, authority, payload)
    active_time.close_interval(tx, deadline.attempt_id)
    requests.answer(
        tx, request_id, answer_hash=blobs.put_json(tx, None), answered_by=AnsweredBy.EXPIRED
    )
    if run.status is RunStatus.WAITING:
        runs.resume_waiting(tx, run.run_id)
    error_code = None if run.error_code is None else FailureClass(run.error_code)
    queue.set_queue(tx, run.run_id, QueueStatus.PARKED, error_code=error_code, available_now=True)
    release_claim(tx, authority)
    return Applied(
        Expiry(
            request_id=request_id,
            run_id=run.run_id,
            attempt_id=deadline.attempt_id,
            timeout_ms=deadline.timeout_ms,
            active_ms=deadline.active_ms,
            revision=revision,
        )
    )


def expire_due_agent_requests(
    tx: Transaction, *, actor: Actor, control_owner_id: str, lease_ms: int
) -> list[Expiry]:
    """Expire every due agent request :func:`expire_agent_request` may expire now; return
    those expired. A due request whose run is held (a live runner, a pause, a launch in
    progress) is left for a later pass."""
    expired = []
    for deadline in pending_agent_deadlines(tx):
        if not deadline.due:
            continue
        result = expire_agent_request(
            tx,
            deadline.request_id,
            actor=actor,
            control_owner_id=control_owner_id,
            lease_ms=lease_ms,
        )
        if isinstance(result, Applied):
            expired.append(result.value)
    return expired


def _deadline(tx: Transaction, request: requests.RequestRow, counting: bool) -> AgentDeadline:
    assert request.timeout_ms is not None
    return AgentDeadline(
        request_id=request.request_id,
        run_id=request.run_id,
        attempt_id=request.attempt_id,
        timeout_ms=request.timeout_ms,
        active_ms=active_time.active_elapsed_ms(tx, request.attempt_id, tx.now),
        counting=counting,
        as_of=tx.now,
    )
