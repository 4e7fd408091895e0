"""Recovery of runs whose runner ended without parking or finishing them.

The server calls these after a runner exit (``recover_after_runner_exit``), when a runner reports
a broken source identity (``park_for_source_change``), or to park a run whose runner made no
progress (``park_for_no_progress``); startup recovery lists the runs a dead server left behind
(``expired_running_runs``) and clears the pause flag an older piwf left on finished runs
(``clear_stale_pauses``). Each call is one ``BEGIN IMMEDIATE`` transaction that takes authority
(the caller's still-live claim, or a new ``server`` claim with generation + 1 when the old one is
absent or expired), records one run change and releases the claim.

The no-progress rule (seed 003 "Retry only after progress")::

    the runner broke the protocol ─▶ applying effects decided as below; parked protocolRejected
    baseline = runner.ready_revision if the runner became ready else runner.launch_revision
    run revision <= baseline, the runner failed by itself ─▶ parked runnerNoProgress
    otherwise ─▶ applying effects: idempotent → pending, manual → ambiguous
               ├─ any ambiguous effect ─▶ parked effectAmbiguous
               ├─ the visit committed a pending request ─▶ waiting (unless a headless
               │                                           agent command drives it)
               └─ else ─▶ parked, claimable (runnerCrashed/runnerTimedOut evidence; the Nth
                          consecutive crash backs off, the CRASH_LOOP_LIMITth blocks)

A runner "failed by itself" unless the server stopped it: ``orphaned`` (server shutdown or
death) and ``claimLost`` (the server's own claim expired under it, e.g. the server was stopped
past the run lease) count no crash and no lack of progress. Every park except the claimable one
needs an explicit resume.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from piwf.lifecycle import Adopted, Applied, Conflict, EffectStatus, RunStatus, StrEnum
from piwf.state import effects as fx
from piwf.state.database import Transaction
from piwf.state.enums import (
    CRASH_LOOP_LIMIT,
    EffectRecovery,
    FailureClass,
    InteractionStatus,
    OwnerType,
    QueueStatus,
    RunnerStatus,
)
from piwf.state.execution import agents, attempts, queue, requests, runs
from piwf.state.execution.core import record_run_change, take_run_authority
from piwf.state.execution.runners import (
    RunnerRecord,
    get_runner,
    latest_runner_of_generation,
    record_runner_exit,
    runner_diagnostic,
)
from piwf.state.execution.runs import RunRow, require_run
from piwf.state.leases import Claim, read_lease, release_claim
from piwf.state.records import Actor

_FINISHED_AND_PAUSED = """
SELECT run_id FROM runs
WHERE paused = 1 AND status IN ('completed', 'failed', 'timed_out', 'cancelled')
ORDER BY run_id
"""


def clear_stale_pauses(tx: Transaction) -> int:
    """Clear the pause flag an older piwf left on finished runs; return how many were cleared.

    Before :func:`~piwf.state.execution.runs.finish` cleared it, cancelling a paused run kept
    ``paused = 1``: the run showed and counted as paused and prune kept it as ``notTerminal``.
    Nothing else of the run changes, so no change is recorded. Idempotent (a second call
    clears nothing). Expects a write transaction.
    """
    stale = [str(row[0]) for row in tx.all(_FINISHED_AND_PAUSED)]
    for run_id in stale:
        runs.set_paused(tx, run_id, False)
    return len(stale)


def crash_backoff_ms(consecutive_crashes: int) -> int:
    """The delay before relaunching after the Nth consecutive crash: 0, then 1 s, 2 s, 4 s..."""
    if consecutive_crashes <= 1:
        return 0
    return int(min(30_000, 1_000 * 2 ** (consecutive_crashes - 2)))


class RecoveryDecision(StrEnum):
    """What a server-side recovery transition decided for a run."""

    REQUEUED = "requeued"  # claimable again from the last durable boundary
    NO_PROGRESS = "noProgress"  # parked runnerNoProgress until an explicit resume
    SOURCE_CHANGED = "sourceChanged"  # parked sourceChanged until an explicit resume
    EFFECT_AMBIGUOUS = "effectAmbiguous"  # parked until the effect is resolved and resumed
    WAITING = "waiting"  # the visit had committed its request: the run waits for the answer
    PROTOCOL_REJECTED = "protocolRejected"  # parked: its runner broke the runner protocol
    UNCHANGED = "unchanged"  # the run was no longer executing under that runner


@dataclass(frozen=True)
class RunRecovery:
    """The outcome of a recovery transition for one run."""

    run_id: str
    decision: RecoveryDecision
    revision: int


def recover_after_runner_exit(
    tx: Transaction,
    run_id: str,
    *,
    runner_epoch: str | None,
    actor: Actor,
    owner_id: str,
    lease_ms: int,
    claim: Claim | None = None,
    protocol_rejection: str | None = None,
) -> Applied[RunRecovery] | Adopted[RunRecovery] | Conflict:
    """Decide a run after its runner exited without parking or finishing it (seed 003 rule).

    Precondition: the runner row is closed (``record_runner_exit``). ``runner_epoch=None``
    means "the latest runner of the current generation", or none at all when the server died
    before recording a launch. The decision:

    - the run is no longer executing under that runner's generation (it parked, finished, was
      paused or cancelled, or another generation took over): ``Adopted(UNCHANGED)``;
    - ``protocol_rejection`` (the server stopped the runner for a message that broke the
      runner protocol; the text is a bounded, payload-free detail): applying effects are decided
      as below and the run parks ``protocolRejected`` until an explicit resume (event
      ``run.protocol_rejected``), whatever its progress;
    - the run revision did not advance past the runner's baseline (``ready_revision``, or
      ``launch_revision`` if it never became ready) and the runner failed by itself (not
      ``orphaned`` or ``claimLost``: stopped by its server): park ``runnerNoProgress``, never
      relaunched automatically (event ``run.runner_no_progress``);
    - otherwise every ``applying`` effect goes through ``effects.recover_uncertain``
      (idempotent → pending for a retry; manual → ambiguous): any ambiguous effect parks the run
      ``effectAmbiguous``; a committed pending request makes it ``waiting``; else the queue row
      becomes ``parked`` and claimable (error code ``runnerCrashed`` or ``runnerTimedOut`` as
      evidence) — event ``run.runner_recovered``. A runner that failed by itself (not
      ``orphaned`` or ``claimLost``) counts one consecutive crash: the relaunch backs off
      (:func:`crash_backoff_ms`), and at :data:`CRASH_LOOP_LIMIT` crashes with no node finished
      in between the run stays parked ``runnerCrashed`` (the count in its error text) until an
      explicit resume.

    Authority: ``claim`` when it is still the live claim, else a new ``server`` claim for
    ``owner_id`` (generation + 1); it is released in the same transaction. A live claim of
    another owner, or a runner row still live, is a ``Conflict``.
    """
    run = require_run(tx, run_id)
    runner = _runner_for(tx, run, runner_epoch)
    if runner is not None and runner.live:
        return Conflict(f"runner {runner.runner_epoch} is still live; record its exit first")
    if not _executing_under(tx, run, runner):
        return Adopted(RunRecovery(run_id, RecoveryDecision.UNCHANGED, run.revision))
    authority = take_run_authority(
        tx, run, claim=claim, owner_type=OwnerType.SERVER, owner_id=owner_id, lease_ms=lease_ms
    )
    if isinstance(authority, Conflict):
        return authority
    if protocol_rejection is None and _made_no_progress(run, runner):
        assert runner is not None  # no runner, no baseline to compare
        reason = _no_progress_reason(tx, run, runner)
        return _park_blocked(
            tx, run, authority, actor, FailureClass.RUNNER_NO_PROGRESS, runner, reason
        )
    effects = fx.list_unsettled_effects(tx, run.resource_id)  # the only ones it decides
    applying = [effect for effect in effects if effect.status is EffectStatus.APPLYING]
    ambiguous = any(
        effect.status is EffectStatus.AMBIGUOUS
        or (effect.status is EffectStatus.APPLYING and effect.recovery is EffectRecovery.MANUAL)
        for effect in effects
    )
    active = attempts.active_attempt(tx, run.run_id)
    request = None if active is None else requests.open_request(tx, active.attempt_id)
    # A request a headless agent command drives is work to resume (the next runner runs the
    # command again), not a wait for an outside answer.
    waiting = (
        request is not None
        and request.status is InteractionStatus.PENDING
        and not agents.is_driven(tx, request.request_id)
    )
    payload = {"runnerEpoch": None if runner is None else runner.runner_epoch}
    if protocol_rejection is not None:
        decision = RecoveryDecision.PROTOCOL_REJECTED
        revision = record_run_change(tx, run, "run.protocol_rejected", actor, authority, payload)
    elif ambiguous:
        decision = RecoveryDecision.EFFECT_AMBIGUOUS
        revision = record_run_change(tx, run, "run.effect_ambiguous", actor, authority, payload)
    elif waiting:
        decision = RecoveryDecision.WAITING
        revision = record_run_change(tx, run, "run.waiting", actor, authority, payload)
    else:
        decision = RecoveryDecision.REQUEUED
        revision = record_run_change(tx, run, "run.runner_recovered", actor, authority, payload)
    for effect in applying:
        fx.recover_uncertain(tx, effect.effect_id, actor=actor, claim=authority)
    if decision is RecoveryDecision.PROTOCOL_REJECTED:
        queue.set_queue(
            tx,
            run.run_id,
            QueueStatus.PARKED,
            error_code=FailureClass.PROTOCOL_REJECTED,
            error_text=protocol_rejection,
        )
    elif decision is RecoveryDecision.EFFECT_AMBIGUOUS:
        queue.set_queue(
            tx,
            run.run_id,
            QueueStatus.PARKED,
            error_code=FailureClass.EFFECT_AMBIGUOUS,
            error_text=_ambiguous_reason(tx, run, runner, effects),
        )
    elif decision is RecoveryDecision.WAITING:
        runs.set_status(tx, run.run_id, RunStatus.WAITING)
        queue.set_queue(tx, run.run_id, QueueStatus.PARKED)
    else:
        failure = _exit_failure(runner)
        queue.set_queue(tx, run.run_id, QueueStatus.PARKED, error_code=failure, available_now=True)
        if failure is not None:
            _count_crash(tx, run.run_id)
    release_claim(tx, authority)
    return Applied(RunRecovery(run_id, decision, revision))


def close_runner_and_recover(
    tx: Transaction,
    run_id: str,
    runner_epoch: str | None,
    outcome: RunnerStatus,
    *,
    actor: Actor,
    owner_id: str,
    lease_ms: int,
    exit_code: int | None = None,
    signal: str | None = None,
    diagnostic: str | None = None,
    claim: Claim | None = None,
    protocol_rejection: str | None = None,
) -> Applied[RunRecovery] | Adopted[RunRecovery] | Conflict:
    """Close a runner row with its one ``outcome``, then decide its run, in one transaction.

    What every end of a runner (its exit, a rescue of an expired claim, startup recovery of a
    dead server's runners) commits: :func:`~piwf.state.execution.runners.record_runner_exit`
    (``exit_code``, ``signal``, ``diagnostic``) unless ``runner_epoch`` is None (the server died
    before it recorded a launch), then :func:`recover_after_runner_exit` with the rest. Claim
    loss stays a handoff: for a run a newer generation holds, the decision is ``UNCHANGED``.
    """
    if runner_epoch is not None:
        record_runner_exit(
            tx, runner_epoch, outcome, exit_code=exit_code, signal=signal, diagnostic=diagnostic
        )
    return recover_after_runner_exit(
        tx,
        run_id,
        runner_epoch=runner_epoch,
        actor=actor,
        owner_id=owner_id,
        lease_ms=lease_ms,
        claim=claim,
        protocol_rejection=protocol_rejection,
    )


def park_for_no_progress(
    tx: Transaction,
    run_id: str,
    *,
    runner_epoch: str,
    actor: Actor,
    owner_id: str,
    lease_ms: int,
    claim: Claim | None = None,
) -> Applied[RunRecovery] | Adopted[RunRecovery] | Conflict:
    """Park an executing run ``runnerNoProgress``: it stays ``running``, the queue ``parked``.

    The run must still be executing under ``runner_epoch``'s generation; a run already parked
    for this reason is ``Adopted``. Authority as in :func:`recover_after_runner_exit`; the claim
    is released. Event ``run.runner_no_progress``. Only :func:`resume_run` makes it eligible.
    """
    return _park_for(
        tx, run_id, runner_epoch, FailureClass.RUNNER_NO_PROGRESS, actor, owner_id, lease_ms, claim
    )


def park_for_source_change(
    tx: Transaction,
    run_id: str,
    *,
    runner_epoch: str,
    actor: Actor,
    owner_id: str,
    lease_ms: int,
    claim: Claim | None = None,
    detail: str | None = None,
) -> Applied[RunRecovery] | Adopted[RunRecovery] | Conflict:
    """Park an executing run ``sourceChanged`` (a runner found the saved source identity broken).

    Same contract as :func:`park_for_no_progress`; ``detail`` is stored as the queue's error
    text. Event ``run.source_changed``. Only :func:`resume_run` makes it eligible again.
    """
    return _park_for(
        tx,
        run_id,
        runner_epoch,
        FailureClass.SOURCE_CHANGED,
        actor,
        owner_id,
        lease_ms,
        claim,
        detail,
    )


def _park_for(
    tx: Transaction,
    run_id: str,
    runner_epoch: str,
    failure: FailureClass,
    actor: Actor,
    owner_id: str,
    lease_ms: int,
    claim: Claim | None,
    detail: str | None = None,
) -> Applied[RunRecovery] | Adopted[RunRecovery] | Conflict:
    run = require_run(tx, run_id)
    runner = _runner_for(tx, run, runner_epoch)
    if run.queue_status is QueueStatus.PARKED and run.error_code == failure.value:
        return Adopted(RunRecovery(run_id, _DECISION_OF[failure], run.revision))
    if not _executing_under(tx, run, runner):
        return Conflict(f"run {run_id} is not executing under runner {runner_epoch}")
    authority = take_run_authority(
        tx, run, claim=claim, owner_type=OwnerType.SERVER, owner_id=owner_id, lease_ms=lease_ms
    )
    if isinstance(authority, Conflict):
        return authority
    return _park_blocked(tx, run, authority, actor, failure, runner, detail)


#: Runner outcomes that are the server's doing, not a failure of the runner.
_STOPPED_BY_SERVER = frozenset({RunnerStatus.ORPHANED, RunnerStatus.CLAIM_LOST})

_DECISION_OF = {
    FailureClass.RUNNER_NO_PROGRESS: RecoveryDecision.NO_PROGRESS,
    FailureClass.SOURCE_CHANGED: RecoveryDecision.SOURCE_CHANGED,
}

_EVENT_OF = {
    FailureClass.RUNNER_NO_PROGRESS: "run.runner_no_progress",
    FailureClass.SOURCE_CHANGED: "run.source_changed",
}


def _park_blocked(
    tx: Transaction,
    run: RunRow,
    authority: Claim,
    actor: Actor,
    failure: FailureClass,
    runner: RunnerRecord | None,
    detail: str | None,
) -> Applied[RunRecovery]:
    payload = {"runnerEpoch": None if runner is None else runner.runner_epoch}
    revision = record_run_change(tx, run, _EVENT_OF[failure], actor, authority, payload)
    queue.set_queue(tx, run.run_id, QueueStatus.PARKED, error_code=failure, error_text=detail)
    release_claim(tx, authority)
    return Applied(RunRecovery(run.run_id, _DECISION_OF[failure], revision))


def _count_crash(tx: Transaction, run_id: str) -> None:
    """Count one more consecutive crash: back off the relaunch, or block a crash loop.

    The failure class stays ``runnerCrashed`` (the closed set has no crash-loop class); at
    :data:`CRASH_LOOP_LIMIT` the scheduler stops claiming the run (``claim_next_run`` checks the
    count) and the error text says how many crashes happened and what to do.
    """
    crashes = queue.count_crash(tx, run_id)
    if crashes >= CRASH_LOOP_LIMIT:
        detail = (
            f"the runner crashed {crashes} times in a row without finishing a node; "
            f"fix the cause, then resume the run (piwf run resume {run_id})"
        )
        queue.set_error_text(tx, run_id, detail)
    else:
        queue.delay(tx, run_id, tx.now + crash_backoff_ms(crashes))


def _runner_for(tx: Transaction, run: RunRow, runner_epoch: str | None) -> RunnerRecord | None:
    if runner_epoch is None:
        lease = read_lease(tx, run.resource_id)
        generation = 0 if lease is None else lease.generation
        found = latest_runner_of_generation(tx, run.run_id, generation)
        if found is None:
            return None
        runner_epoch = found
    runner = get_runner(tx, runner_epoch)
    if runner is None or runner.run_id != run.run_id:
        raise LookupError(f"run {run.run_id} has no runner {runner_epoch}")
    return runner


def _executing_under(tx: Transaction, run: RunRow, runner: RunnerRecord | None) -> bool:
    """Whether the run is still executing under the runner's generation (or no runner's)."""
    if not run.executing:
        return False
    lease = read_lease(tx, run.resource_id)
    generation = 0 if lease is None else lease.generation
    return runner is None or runner.generation == generation


def _made_no_progress(run: RunRow, runner: RunnerRecord | None) -> bool:
    """The seed 003 rule: the run revision did not advance past the runner's baseline.

    A runner its server stopped (``orphaned``: shutdown or death; ``claimLost``: the server's
    claim expired under it) did not fail by itself; it is requeued like any interrupted work
    instead of being parked.
    """
    if runner is None or runner.status in _STOPPED_BY_SERVER:
        return False
    return run.revision <= runner.progress_baseline


def _no_progress_reason(tx: Transaction, run: RunRow, runner: RunnerRecord) -> str:
    """The stored reason of a ``runnerNoProgress`` park: how the runner ended (exit code,
    signal, the server's diagnostic) and the node attempt that was active. Bounded, no
    payload: the node path is the workflow's own name for it."""
    how = _how_runner_ended(runner, runner_diagnostic(tx, runner.runner_epoch))
    active = attempts.active_attempt(tx, run.run_id)
    where = (
        "while no node was running"
        if active is None
        else f'while node "{active.path}" (visit {active.visit}, attempt {active.attempt}) ran'
    )
    return f"its runner {how} {where}, with no progress since it started"


def _ambiguous_reason(
    tx: Transaction, run: RunRow, runner: RunnerRecord | None, effects: list[fx.Effect]
) -> str:
    """The stored reason of an ``effectAmbiguous`` park: which effects may or may not have
    been applied and how their runner ended. Bounded, no payload (ids, types and the node
    path only); no command, since the run view adds the one that fits its state."""
    named = [
        f"{effect.effect_id} ({effect.effect_type})"
        for effect in effects
        if effect.status is EffectStatus.AMBIGUOUS
        or (effect.status is EffectStatus.APPLYING and effect.recovery is EffectRecovery.MANUAL)
    ]
    shown = ", ".join(named[:_AMBIGUOUS_NAMED])
    if len(named) > _AMBIGUOUS_NAMED:
        shown += f" and {len(named) - _AMBIGUOUS_NAMED} more"
    which = "effect" if len(named) == 1 else "effects"
    if runner is None or runner.status in _STOPPED_BY_SERVER:
        how = "its server stopped or died"
    else:
        how = f"its runner {_how_runner_ended(runner, runner_diagnostic(tx, runner.runner_epoch))}"
    active = attempts.active_attempt(tx, run.run_id)
    where = (
        ""
        if active is None
        else f' while node "{active.path}" (visit {active.visit}, attempt {active.attempt}) ran'
    )
    return f"{which} {shown} may or may not have been applied: {how}{where}"


#: How many ambiguous effects a park reason names; the run view lists them all.
_AMBIGUOUS_NAMED = 3


def _how_runner_ended(runner: RunnerRecord, diagnostic: str | None) -> str:
    if diagnostic is not None:
        return f"was killed by the server ({diagnostic})"
    if runner.status is RunnerStatus.TIMED_OUT:
        return "timed out and was killed"
    if runner.signal is not None:
        return f"was killed by {_signal_name(runner.signal)}"
    if runner.exit_code is not None:
        return f"exited with code {runner.exit_code}"
    return "ended"


def _signal_name(stored: str) -> str:
    """``signal 9`` as ``signal 9 (SIGKILL)``; any other text as it is."""
    number = stored.removeprefix("signal ")
    try:
        return f"{stored} ({signal.Signals(int(number)).name})"
    except ValueError:
        return stored


def _exit_failure(runner: RunnerRecord | None) -> FailureClass | None:
    if runner is None or runner.status in _STOPPED_BY_SERVER:
        return None
    if runner.status is RunnerStatus.TIMED_OUT:
        return FailureClass.RUNNER_TIMED_OUT
    return FailureClass.RUNNER_CRASHED
