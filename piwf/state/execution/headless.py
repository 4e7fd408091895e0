"""Headless agent turns: the runner's two agent calls and the server's reaping, composed.

No SQL here: each function composes the process registry and turns
(:mod:`~piwf.state.execution.agents`), active time (:mod:`~piwf.state.execution.active_time`),
the request, attempt and runner rows into one change in the caller's ``BEGIN IMMEDIATE``
transaction. None of them changes the run revision or writes a run event: like the runner rows,
they are supervision records of the run's executing generation (so an agent turn alone never
counts as progress for the no-progress rule)::

    process.register    the runner's live claim renewed (ClaimLostError otherwise); its runner
                        row live and of the claim's generation; the request the run's, of kind
                        agent, on the active attempt ─▶ one more turn of the request, the
                        process registered, an active interval opened (while pending)
                        ─▶ TurnStart (turn, unproductive turns, stored prompt, request state)
    process.unregister  no claim (valid after it was released): the process registered by this
                        runner ─▶ unregistered, its interval closed, a turn that leaves the
                        request pending (run not paused) counted unproductive
                        ─▶ TurnEnd (unproductive turns, request state)
    reap_process        the server ended the group (its runner ended first): reaped, interval
                        closed now
    reap_after_server_death   startup recovery: every live process reaped, every open
                        interval closed at its observed_at (downtime is never charged)

A repeat of either call adopts (nothing more is written) and answers with the current state.
"""

from __future__ import annotations

from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.errors import BlobTypeError, ClaimLostError
from piwf.lifecycle import Adopted, AnsweredBy, Applied, Conflict, InteractionKind
from piwf.protocol.runner_v1 import (
    MAX_UNPRODUCTIVE_TURNS,
    ProcessRegistration,
    ProcessUnregistration,
)
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import AgentProcessEnd, InteractionStatus
from piwf.state.execution import active_time, agents, attempts, requests, runs
from piwf.state.execution.agents import AgentProcessRow
from piwf.state.execution.core import require_run_claim
from piwf.state.execution.requests import RequestRow
from piwf.state.execution.runners import get_runner
from piwf.state.leases import Claim


@dataclass(frozen=True)
class RequestState:
    """Where an agent request stands, as the runner is told (``value`` when ``answered``,
    the latest ``rejection`` text when ``pending``)."""

    status: str
    value: JsonValue = None
    rejection: str | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """The wire form (``AgentRequestState`` of ``piwf.runner.v1``)."""
        wire: dict[str, JsonValue] = {"status": self.status}
        if self.status == "answered":
            wire["value"] = self.value
        if self.rejection is not None:
            wire["rejection"] = self.rejection
        return wire


@dataclass(frozen=True)
class TurnStart:
    """What a registration answers: the turn, earlier unproductive turns, the stored prompt."""

    turn: int
    unproductive_turns: int
    prompt: str
    request: RequestState

    def to_json(self) -> dict[str, JsonValue]:
        """The wire form (``TurnStarted``)."""
        return {
            "turn": self.turn,
            "unproductiveTurns": self.unproductive_turns,
            "prompt": self.prompt,
            "request": self.request.to_json(),
        }


@dataclass(frozen=True)
class TurnEnd:
    """What an unregistration answers: unproductive turns so far and the request's state."""

    unproductive_turns: int
    request: RequestState

    def to_json(self) -> dict[str, JsonValue]:
        """The wire form (``TurnEnded``)."""
        return {"unproductiveTurns": self.unproductive_turns, "request": self.request.to_json()}


def request_state(tx: Transaction, request: RequestRow) -> RequestState:
    """The state of an agent request as a runner sees it.

    ``answered`` (or ``settled``) with the accepted value; ``expired`` when its deadline closed
    it; ``pending`` with the latest rejection; ``cancelled`` otherwise.
    """
    if request.status in (InteractionStatus.ANSWERED, InteractionStatus.SETTLED):
        if request.answered_by is AnsweredBy.EXPIRED:
            return RequestState("expired")
        assert request.answer_hash is not None
        return RequestState("answered", value=blobs.read_json(tx, request.answer_hash))
    if request.status is InteractionStatus.PENDING:
        return RequestState("pending", rejection=_rejection(tx, request.rejection_hash))
    return RequestState("cancelled")


def apply_process_register(
    tx: Transaction,
    claim: Claim,
    runner_epoch: str,
    message: ProcessRegistration,
    *,
    lease_ms: int,
) -> Applied[TurnStart] | Adopted[TurnStart] | Conflict:
    """Register the agent command process of ``runner_epoch`` and start one turn.

    Renews ``claim`` first: :class:`ClaimLostError` for a stale claim, a closed runner or a
    runner of another generation (nothing is written). ``Conflict`` for a request that is not
    this run's agent request on its active attempt, an identity registered for something else,
    or a run that already has another live agent process. The same registration again is
    ``Adopted``. A request that is no longer pending is still registered (so the group is
    reaped if its runner dies) but opens no active interval: the runner stops the command.
    """
    claim = require_run_claim(tx, claim, message.run_id, lease_ms)
    runner = get_runner(tx, runner_epoch)
    if runner is None or not runner.live or runner.generation != claim.generation:
        raise ClaimLostError("generationChanged", claim.resource_id, claim.generation)
    request = requests.get_request(tx, message.request_id)
    active = attempts.active_attempt(tx, message.run_id)
    if (
        request is None
        or request.run_id != message.run_id
        or request.kind is not InteractionKind.AGENT
        or active is None
        or active.attempt_id != request.attempt_id
    ):
        return Conflict(f"{message.request_id} is not the open agent request of the active visit")
    existing = agents.get_process(tx, message.start_identity)
    if existing is not None:
        same = (existing.runner_epoch, existing.request_id, existing.pid, existing.pgid) == (
            runner_epoch,
            message.request_id,
            message.pid,
            message.pgid,
        )
        if not same:
            return Conflict("that process is registered for another runner or request")
        return Adopted(_turn_start(tx, request, existing.turn_number))
    other = agents.live_process_of_run(tx, message.run_id)
    if other is not None:
        return Conflict(f"run {message.run_id} already has a live agent process")
    turns = agents.begin_turn(tx, request.request_id, request.run_id)
    agents.insert_process(
        tx,
        start_identity=message.start_identity,
        run_id=message.run_id,
        runner_epoch=runner_epoch,
        attempt_id=request.attempt_id,
        request_id=request.request_id,
        turn_number=turns.turns_started,
        pid=message.pid,
        pgid=message.pgid,
    )
    if request.status is InteractionStatus.PENDING:
        active_time.open_interval(tx, request.attempt_id)
    return Applied(_turn_start(tx, request, turns.turns_started))


def apply_process_unregister(
    tx: Transaction, runner_epoch: str, message: ProcessUnregistration
) -> Applied[TurnEnd] | Adopted[TurnEnd] | Conflict:
    """The runner shut its agent command's group down: unregister it and end its turn.

    Needs no claim (the runner may unregister after its claim was released). ``Conflict`` for
    a process this runner did not register for this run and request. A process that already
    left the registry (unregistered before, or reaped) is ``Adopted`` with the current state.
    Otherwise the process is ``unregistered``, its attempt's active interval closes, and a
    turn that leaves the request pending counts as unproductive unless the run is paused (a
    pause is not the agent's failure) or the count already reached
    :data:`MAX_UNPRODUCTIVE_TURNS` (the attempt fails; a turn after that is not counted).
    """
    row = agents.get_process(tx, message.start_identity)
    if (
        row is None
        or row.runner_epoch != runner_epoch
        or row.run_id != message.run_id
        or row.request_id != message.request_id
    ):
        return Conflict("that process was not registered by this runner for this request")
    request = requests.get_request(tx, row.request_id)
    assert request is not None  # the registry row references it
    if not row.live:
        return Adopted(_turn_end(tx, request))
    agents.end_process(tx, row.start_identity, AgentProcessEnd.UNREGISTERED, message.exit_code)
    active_time.close_interval(tx, row.attempt_id)
    turns = agents.turns_of(tx, request.request_id)
    counted = turns is not None and turns.unproductive_turns >= MAX_UNPRODUCTIVE_TURNS
    paused = runs.require_run(tx, row.run_id).paused
    if request.status is InteractionStatus.PENDING and not paused and not counted:
        agents.count_unproductive(tx, request.request_id)
    return Applied(_turn_end(tx, request))


def reap_process(tx: Transaction, row: AgentProcessRow) -> bool:
    """The server ended a registered group whose runner ended first: ``reaped``, and its
    attempt's open interval closes now. False when the process had already left."""
    if not agents.end_process(tx, row.start_identity, AgentProcessEnd.REAPED):
        return False
    active_time.close_interval(tx, row.attempt_id)
    return True


def reap_after_server_death(tx: Transaction) -> int:
    """Startup recovery: every live agent process belongs to a runner of a dead server (the
    caller ended their groups first); mark each ``reaped`` and close every open interval at
    its ``observed_at``. Returns how many processes were reaped."""
    reaped = 0
    for row in agents.live_processes(tx):
        reaped += agents.end_process(tx, row.start_identity, AgentProcessEnd.REAPED)
    active_time.close_all_at_observed(tx)
    return reaped


def _turn_start(tx: Transaction, request: RequestRow, turn: int) -> TurnStart:
    turns = agents.turns_of(tx, request.request_id)
    content = blobs.read_json(tx, request.content_hash)
    prompt = content.get("prompt") if isinstance(content, dict) else None
    return TurnStart(
        turn=turn,
        unproductive_turns=0 if turns is None else turns.unproductive_turns,
        prompt=prompt if isinstance(prompt, str) else "",
        request=request_state(tx, request),
    )


def _turn_end(tx: Transaction, request: RequestRow) -> TurnEnd:
    fresh = requests.get_request(tx, request.request_id)
    assert fresh is not None
    turns = agents.turns_of(tx, request.request_id)
    return TurnEnd(
        unproductive_turns=0 if turns is None else turns.unproductive_turns,
        request=request_state(tx, fresh),
    )


def _rejection(tx: Transaction, digest: bytes | None) -> str | None:
    if digest is None:
        return None
    try:
        return blobs.read_text(tx, digest)
    except BlobTypeError:  # a rejection stored as a JSON value
        value = blobs.read_json(tx, digest)
        return value if isinstance(value, str) else str(value)
