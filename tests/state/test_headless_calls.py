"""The runner's headless agent calls through the functions the server applies them with
(``decode_agent_call`` + ``apply_agent_call``), on a real database with a real engine.

The engine runs an agent visit through :class:`StorePort` until its request is committed and
hands it to a driver; the driver here stops the runner there (as a kill would), so each test
starts from a live runner whose agent request is pending.
"""

from __future__ import annotations

from typing import Any

import pytest

from piwf.clock import FakeClock
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.protocol.runner_v1 import ProcessRegistration, ProcessUnregistration
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.enums import AgentProcessEnd, RunnerStatus
from piwf.state.execution import active_time, agents
from piwf.state.execution.calls import (
    RunnerCallRejectedError,
    apply_agent_call,
    decode_agent_call,
)
from piwf.state.execution.headless import TurnEnd, TurnStart
from piwf.workflow import agent, define_workflow
from piwf.workflow.agent_driver import AgentOutcome, AgentTurn
from piwf.workflow.engine import execute

from .test_execution_support import (
    LEASE_MS,
    OPERATOR,
    SERVER_ID,
    Crash,
    StorePort,
    command_for,
    compiled,
    create,
    exit_and_recover,
    launch,
    queue_row,
    run_status,
    runner_of,
    violations,
)

WORKFLOW = compiled(
    define_workflow(
        name="ask",
        start_at="ask",
        nodes={"ask": agent(prompt="Summarise the tides.", expected_output="{}")},
        edges=[],
    )
)


class StopAtTheCommand:
    """A driver that stops the runner where a command would start (the request is committed)."""

    def __init__(self) -> None:
        self.turns: list[AgentTurn] = []

    def drive(self, turn: AgentTurn) -> AgentOutcome | None:
        self.turns.append(turn)
        raise Crash("the runner stops where its agent command would start")


def live_agent_runner(db: StateDatabase) -> tuple[ex.RunLaunch, str, str]:
    """A launched runner whose agent visit committed its request; (launch, epoch, request)."""
    create(db, WORKFLOW)
    launched = launch(db)
    driver = StopAtTheCommand()
    with pytest.raises(Crash):
        execute(command_for(launched), WORKFLOW, StorePort(db, launched), agents=driver)
    return launched, runner_of(db, launched).runner_epoch, driver.turns[0].request_id


def call(
    db: StateDatabase, launched: ex.RunLaunch, epoch: str, operation: str, payload: dict[str, Any]
) -> Any:
    decoded = decode_agent_call(launched.claim, operation, payload)
    with db.write() as tx:
        return apply_agent_call(tx, launched.claim, epoch, decoded, lease_ms=LEASE_MS)


def register(request_id: str, pid: int = 4242, run_id: str = "run-1") -> dict[str, Any]:
    return ProcessRegistration(
        runId=run_id, requestId=request_id, pid=pid, startIdentity=f"{pid}:1.0:boot", pgid=pid
    ).to_json()


def unregister(request_id: str, pid: int = 4242, code: int | None = 0) -> dict[str, Any]:
    return ProcessUnregistration(
        runId="run-1", requestId=request_id, startIdentity=f"{pid}:1.0:boot", exitCode=code
    ).to_json()


def test_a_turn_registers_opens_active_time_and_unregistering_counts_it(
    db: StateDatabase, clock: FakeClock
) -> None:
    launched, epoch, request_id = live_agent_runner(db)
    started = call(db, launched, epoch, "process.register", register(request_id))
    assert isinstance(started, Applied) and isinstance(started.value, TurnStart)
    assert (started.value.turn, started.value.unproductive_turns) == (1, 0)
    assert started.value.prompt == "Summarise the tides."
    assert started.value.request.status == "pending"
    # The same registration again adopts; it starts no second turn.
    again = call(db, launched, epoch, "process.register", register(request_id))
    assert isinstance(again, Adopted) and again.value.turn == 1
    clock.advance(700)
    ended = call(db, launched, epoch, "process.unregister", unregister(request_id))
    assert isinstance(ended, Applied) and isinstance(ended.value, TurnEnd)
    assert ended.value.unproductive_turns == 1 and ended.value.request.status == "pending"
    with db.read() as tx:
        row = agents.get_process(tx, "4242:1.0:boot")
        [interval] = active_time.intervals(tx, row.attempt_id if row else "")
    assert row is not None and (row.ended_by, row.exit_code) == (AgentProcessEnd.UNREGISTERED, 0)
    assert interval.elapsed_ms == 700
    # A repeat of the unregistration adopts and counts nothing more.
    repeat = call(db, launched, epoch, "process.unregister", unregister(request_id))
    assert isinstance(repeat, Adopted) and repeat.value.unproductive_turns == 1
    assert violations(db) == []


def test_register_from_a_runner_whose_claim_was_lost_is_refused(
    db: StateDatabase, clock: FakeClock
) -> None:
    launched, epoch, request_id = live_agent_runner(db)
    clock.advance(LEASE_MS + 1)  # the server stopped renewing: the claim expired
    with pytest.raises(ClaimLostError) as lost:
        call(db, launched, epoch, "process.register", register(request_id))
    assert lost.value.reason == "expired"
    with db.read() as tx:
        assert agents.processes_of_run(tx, "run-1") == []
        assert agents.turns_of(tx, request_id) is None


def test_unregister_after_the_claim_was_released_is_accepted(db: StateDatabase) -> None:
    launched, epoch, request_id = live_agent_runner(db)
    call(db, launched, epoch, "process.register", register(request_id))
    with db.write() as tx:  # a pause commits and releases the runner's claim
        paused = ex.pause_run(
            tx,
            "run-1",
            actor=OPERATOR,
            control_owner_id="control",
            lease_ms=LEASE_MS,
            claim=launched.claim,
        )
    assert isinstance(paused, Applied)
    ended = call(db, launched, epoch, "process.unregister", unregister(request_id))
    assert isinstance(ended, Applied)
    # A pause is not the agent's failure: the turn is not counted.
    assert ended.value.unproductive_turns == 0
    with db.read() as tx:
        row = agents.get_process(tx, "4242:1.0:boot")
    assert row is not None and row.ended_by is AgentProcessEnd.UNREGISTERED


def test_registrations_that_do_not_fit_change_nothing(db: StateDatabase) -> None:
    launched, epoch, request_id = live_agent_runner(db)
    unknown = call(db, launched, epoch, "process.register", register("request-nope"))
    assert isinstance(unknown, Conflict)
    call(db, launched, epoch, "process.register", register(request_id, pid=4242))
    second = call(db, launched, epoch, "process.register", register(request_id, pid=4343))
    assert isinstance(second, Conflict) and "already has a live agent process" in second.evidence
    stranger = call(db, launched, "runner-other", "process.unregister", unregister(request_id))
    assert isinstance(stranger, Conflict)
    for bad in (register(request_id, run_id="run-2"), {"runId": "run-1"}):
        with pytest.raises(RunnerCallRejectedError):
            decode_agent_call(launched.claim, "process.register", bad)
    with pytest.raises(RunnerCallRejectedError):
        decode_agent_call(launched.claim, "begin_run", register(request_id))


def test_a_runner_that_dies_during_its_turn_is_relaunched_not_left_waiting(
    db: StateDatabase,
) -> None:
    launched, epoch, request_id = live_agent_runner(db)
    call(db, launched, epoch, "process.register", register(request_id))
    decided = exit_and_recover(db, launched, RunnerStatus.CRASHED)
    # The command drives the request: the next runner runs it again (a resumed turn).
    assert decided.decision is ex.RecoveryDecision.REQUEUED
    assert run_status(db, "run-1") == "running"
    assert queue_row(db, "run-1") == ("parked", "runnerCrashed")
    with db.write() as tx:
        relaunch = ex.claim_next_run(tx, owner_id=SERVER_ID, lease_ms=LEASE_MS)
    assert relaunch is not None and relaunch.run_id == "run-1"


def test_a_request_no_command_ever_ran_for_still_waits_for_its_answer(db: StateDatabase) -> None:
    launched, _, _ = live_agent_runner(db)
    assert exit_and_recover(db, launched).decision is ex.RecoveryDecision.WAITING
    assert run_status(db, "run-1") == "waiting"
    with db.write() as tx:
        assert ex.claim_next_run(tx, owner_id=SERVER_ID, lease_ms=LEASE_MS) is None
