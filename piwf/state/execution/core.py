"""What every execution transition shares: run authority, the run change, closing a run.

Everything here runs inside a caller's ``write()`` (or ``read()``) transaction and never
commits. The tables are written by their own modules (``runs``, ``queue``, ``attempts``,
``requests``, ``updates``, ``runners``); the transitions of this package compose them, and this
module holds the steps they share.

Authority comes in two shapes:

- :func:`require_run_claim` is the first step of every runner-driven write: the exact live run
  claim is renewed, or :class:`~piwf.errors.ClaimLostError` is raised before anything is read.
- :func:`take_run_authority` is used by server-side transitions (control, recovery) that may find
  the claim gone: a live claim passed by the caller is renewed and reused; otherwise a new claim
  is taken with generation + 1, which is only possible when no other owner's lease is live.

:func:`close_run_dependents` is the terminal-closing step that finish and cancel share; it runs
inside the caller's one change.
"""

from __future__ import annotations

from dataclasses import dataclass

from piwf.errors import ClaimLostError
from piwf.lifecycle import CommandKind, Conflict, EffectStatus
from piwf.state import decisions
from piwf.state import effects as fx
from piwf.state.database import Transaction
from piwf.state.enums import ActorType, AttemptStatus, OwnerType
from piwf.state.execution import attempts, requests
from piwf.state.execution.attempts import AttemptRow
from piwf.state.execution.runs import RunRow, load_run, run_resource_id
from piwf.state.leases import Claim, read_lease, renew_claim, take_claim, verify_claim
from piwf.state.records import Actor, record_change

#: The actor of every change a runner proposes; the event's lease generation names the runner.
RUNNER_ACTOR = Actor(ActorType.RUNNER)


@dataclass(frozen=True)
class RunLaunch:
    """A run claimed for one runner generation, and the one command that runner executes.

    ``launch_revision`` is the run revision the claim committed; ``parent_run_id`` is set for a
    ``restart`` (the runner's ``RestartCommand`` names it). ``claim`` holds the raw token: keep it
    in the server process and never log it.
    """

    claim: Claim
    run_id: str
    command: CommandKind
    launch_revision: int
    parent_run_id: str | None = None

    @property
    def generation(self) -> int:
        """The claim generation this launch runs under."""
        return self.claim.generation


def require_run_claim(tx: Transaction, claim: Claim, run_id: str, lease_ms: int) -> Claim:
    """Renew the exact live claim on ``run_id`` and return it renewed.

    Raises :class:`ClaimLostError` (``missingAuthority`` for a claim on another aggregate) before
    anything else is read, so a stale runner learns nothing and changes nothing.
    """
    resource_id = run_resource_id(run_id)
    if claim.resource_id != resource_id:
        raise ClaimLostError("missingAuthority", resource_id, claim.generation)
    return renew_claim(tx, claim, lease_ms)


def take_run_authority(
    tx: Transaction,
    run: RunRow,
    *,
    claim: Claim | None,
    owner_type: OwnerType,
    owner_id: str,
    lease_ms: int,
) -> Claim | Conflict:
    """Return a live claim on ``run`` for a server-side transition (control or recovery).

    A ``claim`` that is still the exact live claim of this run is renewed and reused. Otherwise
    a new claim (generation + 1) is taken for ``(owner_type, owner_id)``, which fences every
    earlier token; that needs the lease to be free, released or expired, so a live claim of
    another owner is a :class:`Conflict` (nobody force-takes a live claim). Taking a claim does
    not bump the revision: the caller's one change records it with the new generation.
    """
    if claim is not None and claim.resource_id == run.resource_id:
        try:
            verify_claim(tx, claim)
        except ClaimLostError:
            pass
        else:
            return renew_claim(tx, claim, lease_ms)
    lease = read_lease(tx, run.resource_id)
    if lease is not None and lease.is_live(tx.now):
        holder = "unknown" if lease.owner_type is None else lease.owner_type.value
        return Conflict(
            f"run {run.run_id} is held by a live {holder} claim (generation {lease.generation})"
        )
    taken = take_claim(tx, run.resource_id, owner_type, owner_id, lease_ms)
    if isinstance(taken, Conflict):  # pragma: no cover - the lease was checked just above
        return taken
    return taken.value


def record_run_change(
    tx: Transaction,
    run: RunRow,
    event_type: str,
    actor: Actor,
    claim: Claim | None,
    payload: object | None = None,
) -> int:
    """Bump the run revision once, append its event and return the new revision.

    ``claim`` was renewed by the caller; it is verified again here (not renewed twice).
    """
    return record_change(
        tx, run.resource_id, run.revision, event_type, actor, claim=claim, payload=payload
    ).revision


def close_run_dependents(
    tx: Transaction,
    run: RunRow,
    *,
    attempt_status: AttemptStatus,
    actor: Actor,
    claim: Claim,
) -> None:
    """Close what a terminal run leaves open, inside the terminal change.

    The active attempt gets ``attempt_status``, open requests become ``cancelled`` (an
    unresolved decision records an ``explicit_cancel`` winner first), pending
    effects ``cancelled`` and applying ones ``ambiguous`` (nothing that may have happened outside
    is forgotten). ``claim`` must be the live claim the terminal change is recorded under.
    """
    attempts.close_active(tx, run.run_id, attempt_status)
    reason = f"the run closed its open requests ({attempt_status.value})"
    decisions.cancel_unresolved_in(tx, run.run_id, reason=reason, actor=actor)
    requests.cancel_open_of_run(tx, run.run_id)
    for effect in fx.list_unsettled_effects(tx, run.resource_id):
        if effect.status in (EffectStatus.PENDING, EffectStatus.APPLYING):
            fx.cancel_effect(tx, effect.effect_id, actor=actor, claim=claim)


#: At most this many effects are named in a refusal.
_LISTED_EFFECTS = 20


def unsettled_effects_refusal(tx: Transaction, run: RunRow, *, then: str) -> str | None:
    """Why ``run`` cannot be restarted or forked while an effect of it is unsettled, naming
    each effect and the command that settles it, ending with ``then`` ("fork it"); None when
    every effect is settled."""
    unsettled = fx.list_unsettled_effects(tx, run.resource_id)
    if not unsettled:
        return None
    named = ", ".join(f"{e.effect_id} ({e.status.value})" for e in unsettled[:_LISTED_EFFECTS])
    steps = []
    if any(e.status is EffectStatus.AMBIGUOUS for e in unsettled):
        steps.append(
            "resolve each ambiguous one (piwf effect resolve EFFECT_ID --applied | --retry)"
        )
    if any(e.status is not EffectStatus.AMBIGUOUS for e in unsettled):
        steps.append(f"let the run settle its pending ones (piwf run resume {run.run_id})")
    return f"run {run.run_id} has unsettled effects: {named}; {' and '.join(steps)}, then {then}"


def executing_run(tx: Transaction, run_id: str) -> RunRow | Conflict:
    """Return the run when a runner generation holds it, else a ``Conflict``."""
    run = load_run(tx, run_id)
    if run is None:
        return Conflict(f"run {run_id} does not exist")
    if not run.executing:
        queue = "none" if run.queue_status is None else run.queue_status.value
        return Conflict(f"run {run_id} is {run.status.value} (queue {queue}), not executing")
    return run


def visit_attempt(tx: Transaction, run: RunRow, path: str, visit: int) -> AttemptRow | Conflict:
    """Return the active attempt when it belongs to visit ``visit`` of ``path``, else Conflict."""
    active = attempts.active_attempt(tx, run.run_id)
    if active is None or (active.path, active.visit) != (path, visit):
        return Conflict(f"visit {visit} of {path!r} is not the active visit")
    return active
