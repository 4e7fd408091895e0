"""Shared helpers for the execution-store tests (this module holds no tests).

- :func:`create` queues a run for a compiled workflow through ``runs.create_run``;
- :func:`launch` plays the server's launch sequence (claim, runner row, process, ready);
- :class:`StorePort` is the server side of the runner pipe in miniature: every engine call
  crosses its JSON form and is one ``db.write()`` through :func:`execution.decode_runner_call`
  and :func:`execution.apply_runner_call`, the functions the server uses, so the real engine
  drives the real store under the launched claim;
- :func:`exit_and_recover` plays a runner death: exit recorded, then the recovery decision;
- :func:`dump` snapshots every table, to prove that a refused call wrote nothing.
"""

from __future__ import annotations

import itertools
from typing import Any

from piwf.canonical import JsonValue
from piwf.errors import ClaimLostError
from piwf.lifecycle import Adopted, Applied, CommandKind
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.state.diagnostics import Violation, find_violations
from piwf.state.enums import ActorType, OwnerType, RunnerMessageOutcome, RunnerStatus, SourceType
from piwf.state.execution import runs
from piwf.state.leases import Claim
from piwf.state.records import Actor, claim_resource
from piwf.workflow import compute, define_workflow
from piwf.workflow import port as p
from piwf.workflow.commands import RestartCommand, ResumeCommand, RunCommand, StartCommand
from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.definition import WorkflowDefinition
from piwf.workflow.engine import ExecutionResult, execute
from piwf.workflow.port_codec import to_json
from piwf.workflow.sources import ReferenceKind

LEASE_MS = 30_000
SERVER_ID = "server-a"
SERVER = Actor(ActorType.SERVER, SERVER_ID)
OPERATOR = Actor(ActorType.HUMAN, "operator")
_RUNNER_EPOCHS = itertools.count(1)


class Crash(BaseException):
    """Stands for the runner process dying: it escapes the engine like a kill would."""


def compiled(definition: WorkflowDefinition) -> CompiledWorkflow:
    return compile_workflow(definition)


def two_step() -> CompiledWorkflow:
    return compiled(
        define_workflow(
            name="two-step",
            start_at="greet",
            nodes={
                "greet": compute(lambda ctx: {"greeting": f"hello {ctx.input['who']}"}),
                "shout": compute(lambda ctx: ctx.outputs["greet"]["greeting"].upper()),
            },
            edges=[{"from": "greet", "to": "shout"}],
        )
    )


def create(
    db: StateDatabase, workflow: CompiledWorkflow, run_id: str = "run-1", input: JsonValue = None
) -> str:
    new = runs.NewRun(
        workflow_ref=workflow.definition.name,
        workflow_name=workflow.definition.name,
        definition_digest=bytes.fromhex(workflow.digest),
        definition_snapshot=workflow.snapshot,
        input=input,
        sources=[
            runs.SourceFile(
                "", SourceType.BUILTIN, workflow.definition.name, "1", ReferenceKind.NAME, "w"
            )
        ],
    )
    with db.write() as tx:
        runs.create_run(tx, run_id, new, SERVER)
    return run_id


def launch(db: StateDatabase, *, owner: str = SERVER_ID, ready: bool = True) -> ex.RunLaunch:
    """Claim the next run and record its runner up to ``ready`` (as the server does)."""
    launched = launch_if_runnable(db, owner=owner, ready=ready)
    assert launched is not None, "nothing was claimable"
    return launched


def launch_if_runnable(
    db: StateDatabase,
    *,
    owner: str = SERVER_ID,
    ready: bool = True,
    exclude: tuple[str, ...] = (),
) -> ex.RunLaunch | None:
    """Like :func:`launch`, but None when the scheduler would start nothing (``exclude`` aside)."""
    epoch = f"runner-{next(_RUNNER_EPOCHS)}"
    with db.write() as tx:
        claimed = ex.claim_next_run(tx, owner_id=owner, lease_ms=LEASE_MS, exclude=exclude)
        if claimed is None:
            return None
        envelope = {"runId": claimed.run_id, "generation": claimed.generation, "epoch": epoch}
        recorded = ex.record_runner_launch(
            tx,
            claimed,
            runner_epoch=epoch,
            server_epoch=1,
            envelope=envelope,
            lease_ms=LEASE_MS,
        )
        assert isinstance(recorded, Applied), recorded
    with db.write() as tx:
        process = ex.record_runner_process(
            tx, claimed.claim, epoch, 4242, f"4242:{epoch}", lease_ms=LEASE_MS
        )
        assert isinstance(process, Applied), process
    if ready:
        with db.write() as tx:
            marked = ex.mark_runner_ready(tx, claimed.claim, epoch, lease_ms=LEASE_MS)
            assert isinstance(marked, Applied), marked
    return claimed


def runner_of(db: StateDatabase, launched: ex.RunLaunch) -> ex.RunnerRecord:
    with db.read() as tx:
        runners = [
            runner
            for runner in ex.list_runners(tx, launched.run_id)
            if runner.generation == launched.generation
        ]
    assert len(runners) == 1
    return runners[0]


def command_for(launched: ex.RunLaunch) -> RunCommand:
    if launched.command is CommandKind.START:
        return StartCommand(launched.run_id)
    if launched.command is CommandKind.RESTART:
        assert launched.parent_run_id is not None
        return RestartCommand(launched.run_id, launched.parent_run_id)
    return ResumeCommand(launched.run_id)


class StorePort:
    """A :class:`~piwf.workflow.port.WorkflowPort` backed by the execution store.

    ``crash_after`` (a message class) makes the port commit that message and then raise
    :class:`Crash`, the way a runner dies right after the server committed its change.
    """

    def __init__(self, db: StateDatabase, launched: ex.RunLaunch) -> None:
        self.db = db
        self.launched = launched
        self.epoch = runner_of(db, launched).runner_epoch
        self.replies: list[ex.RunnerReply] = []
        self.crash_after: type | None = None
        self._ids = itertools.count(1)

    def read_run(self, run_id: str) -> p.SavedRun | None:
        with self.db.read() as tx:
            return ex.read_saved_run(tx, run_id)

    def _send(self, operation: str, message: Any) -> p.PortResult:
        # The same two functions the server applies a runner call with: the message crosses
        # its JSON form, and the claim is always the launched one, never one the payload names.
        claim = self.launched.claim
        call = ex.decode_runner_call(claim, operation, to_json(message))
        message_id = f"m{next(self._ids)}"
        with self.db.write() as tx:
            reply = ex.apply_runner_call(
                tx, claim, self.epoch, message_id, call, expected_revision=None, lease_ms=LEASE_MS
            )
        self.replies.append(reply)
        if reply.outcome is RunnerMessageOutcome.CLAIM_LOST:
            raise ClaimLostError("generationChanged", claim.resource_id, claim.generation)
        assert reply.result is not None
        if self.crash_after is not None and isinstance(message, self.crash_after):
            self.crash_after = None
            raise Crash(f"runner died after {type(message).__name__}")
        return reply.result

    def begin_run(self, message: p.RunBegun) -> p.PortResult:
        return self._send("begin_run", message)

    def node_started(self, message: p.NodeStarted) -> p.PortResult:
        return self._send("node_started", message)

    def node_finished(self, message: p.NodeFinished) -> p.PortResult:
        return self._send("node_finished", message)

    def node_failed(self, message: p.NodeFailed) -> p.PortResult:
        return self._send("node_failed", message)

    def reserve_effect(self, message: p.EffectReservation) -> p.PortResult:
        return self._send("reserve_effect", message)

    def settle_effect(self, message: p.EffectSettlement) -> p.PortResult:
        return self._send("settle_effect", message)

    def publish_update(self, message: p.UpdatePublished) -> p.PortResult:
        return self._send("publish_update", message)

    def notify(self, message: p.NotificationRequested) -> p.PortResult:
        return self._send("notify", message)

    def request_interaction(self, message: p.InteractionRequested) -> p.PortResult:
        return self._send("request_interaction", message)

    def park(self, message: p.RunParked) -> p.PortResult:
        return self._send("park", message)

    def finish(self, message: p.RunFinished) -> p.PortResult:
        return self._send("finish", message)


def run_once(
    db: StateDatabase, workflow: CompiledWorkflow, *, crash_after: type | None = None
) -> tuple[ex.RunLaunch, StorePort, ExecutionResult]:
    """Launch the next run and execute its command to the end (no crash expected)."""
    launched = launch(db)
    store = StorePort(db, launched)
    store.crash_after = crash_after
    result = execute(command_for(launched), workflow, store)
    return launched, store, result


def exit_and_recover(
    db: StateDatabase,
    launched: ex.RunLaunch,
    status: RunnerStatus = RunnerStatus.CRASHED,
    *,
    pass_claim: bool = True,
) -> ex.RunRecovery:
    """Record the runner's exit and let the server decide the run (one transaction each)."""
    epoch = runner_of(db, launched).runner_epoch
    with db.write() as tx:
        ex.record_runner_exit(tx, epoch, status, exit_code=1)
    with db.write() as tx:
        result = ex.recover_after_runner_exit(
            tx,
            launched.run_id,
            runner_epoch=epoch,
            actor=SERVER,
            owner_id=SERVER_ID,
            lease_ms=LEASE_MS,
            claim=launched.claim if pass_claim else None,
        )
    assert isinstance(result, (Applied, Adopted)), result
    return result.value


def dump(db: StateDatabase) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to compare before and after a refused call."""
    with db.read() as tx:
        tables = [
            row[0]
            for row in tx.all(
                "SELECT name FROM sqlite_schema WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        return {table: [tuple(row) for row in tx.all(f"SELECT * FROM {table}")] for table in tables}


def violations(db: StateDatabase) -> list[Violation]:
    with db.read() as tx:
        return find_violations(tx)


def queue_row(db: StateDatabase, run_id: str) -> tuple[str, str | None]:
    with db.read() as tx:
        row = tx.one("SELECT status, error_code FROM run_queue WHERE run_id = ?", (run_id,))
    assert row is not None
    return row[0], row[1]


def run_status(db: StateDatabase, run_id: str) -> str:
    with db.read() as tx:
        return str(tx.scalar("SELECT status FROM runs WHERE run_id = ?", (run_id,)))


def revision(db: StateDatabase, run_id: str) -> int:
    with db.read() as tx:
        return int(
            tx.scalar("SELECT revision FROM resources WHERE resource_id = ?", (f"run:{run_id}",))
        )


def attempts(db: StateDatabase, run_id: str) -> list[tuple[str, int, int, str]]:
    with db.read() as tx:
        rows = tx.all(
            "SELECT node_path, visit, attempt_number, status FROM node_attempts"
            " WHERE run_id = ? ORDER BY rowid",
            (run_id,),
        )
    return [(row[0], row[1], row[2], row[3]) for row in rows]


def claim_is_free(db: StateDatabase, run_id: str) -> bool:
    with db.read() as tx:
        owner = tx.scalar("SELECT owner_id FROM leases WHERE resource_id = ?", (f"run:{run_id}",))
    return owner is None


def takeover(db: StateDatabase, run_id: str, owner: str = "server-b") -> Claim:
    """Take the run's claim after its lease expired (a newer generation), queue untouched."""
    with db.write() as tx:
        taken = claim_resource(tx, f"run:{run_id}", OwnerType.SERVER, owner, LEASE_MS)
    assert isinstance(taken, Applied), taken
    return taken.value
