"""The process registry (``agent_processes``) and agent turns (``agent_turns``): their one writer.

A runner that drives a headless agent step starts the agent command in its own process group
and registers it here before it writes the prompt; once the group is shut down it unregisters
it. When the runner ends first (killed, crashed, stopped) or its server died, the server reaps
the group, identity-checked, and the row says so::

    insert_process ─▶ live ─end_process(unregistered)─▶ unregistered   (by its runner)
                           ─end_process(reaped)───────▶ reaped         (by the server)

A process is keyed by its start identity (``pid:create_time:boot_id``), never a bare pid; a run
has at most one live agent process. Each registration is one **turn** of its agent request:
``agent_turns`` counts the turns started and those that ended with the request still pending
(unproductive, the reminder rule). A request with a turn row is *driven* by a headless command:
a runner that stops during its turn is relaunched to run the command again rather than leaving
the run waiting for an outside submission (see :func:`is_driven`).

The run's own agent command (``piwf run start --agent-command``) is kept in the run's launch
options blob (``{"agentCommand": [...]}``); :func:`run_agent_command` reads it.

Writers run inside the caller's one change and never commit; their ``WHERE`` clause states the
state they expect.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import AgentProcessEnd, ExecutionMode

_SELECT_PROCESS = """
SELECT start_identity, run_id, runner_epoch, attempt_id, request_id, turn_number, pid, pgid,
       registered_at, ended_at, ended_by, exit_code
FROM agent_processes
"""

_SELECT_LIVE_OF_RUN = _SELECT_PROCESS + " WHERE run_id = ? AND ended_at IS NULL"

_SELECT_LIVE_OF_RUNNER = (
    _SELECT_PROCESS + " WHERE runner_epoch = ? AND ended_at IS NULL ORDER BY registered_at"
)

_SELECT_ALL_LIVE = _SELECT_PROCESS + " WHERE ended_at IS NULL ORDER BY registered_at"

_SELECT_OF_RUN = _SELECT_PROCESS + " WHERE run_id = ? ORDER BY registered_at, rowid"

_INSERT_PROCESS = """
INSERT INTO agent_processes (start_identity, run_id, runner_epoch, attempt_id, request_id,
                             turn_number, pid, pgid, registered_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

_END_PROCESS = """
UPDATE agent_processes SET ended_at = ?, ended_by = ?, exit_code = ?
WHERE start_identity = ? AND ended_at IS NULL
"""

_SELECT_TURNS = """
SELECT request_id, run_id, turns_started, unproductive_turns FROM agent_turns
WHERE request_id = ?
"""

_BEGIN_TURN = """
INSERT INTO agent_turns (request_id, run_id, turns_started, created_at, updated_at)
VALUES (:request, :run, 1, :now, :now)
ON CONFLICT (request_id) DO UPDATE SET turns_started = turns_started + 1, updated_at = :now
"""

_COUNT_UNPRODUCTIVE = """
UPDATE agent_turns SET unproductive_turns = unproductive_turns + 1, updated_at = ?
WHERE request_id = ? AND unproductive_turns < turns_started
"""

_SELECT_LAUNCH_OPTIONS = "SELECT launch_options_hash FROM runs WHERE run_id = ?"

_SELECT_EXECUTION_MODE = "SELECT execution_mode FROM run_bindings WHERE run_id = ?"


@dataclass(frozen=True)
class AgentProcessRow:
    """One registered agent command process; ``ended_by`` is None while it is live."""

    start_identity: str
    run_id: str
    runner_epoch: str
    attempt_id: str
    request_id: str
    turn_number: int
    pid: int
    pgid: int
    registered_at: int
    ended_at: int | None
    ended_by: AgentProcessEnd | None
    exit_code: int | None

    @property
    def live(self) -> bool:
        """Whether the row still stands for a process group that may be running."""
        return self.ended_by is None


@dataclass(frozen=True)
class AgentTurns:
    """The turns of one agent request: how many started, how many ended unproductive."""

    request_id: str
    run_id: str
    turns_started: int
    unproductive_turns: int


# Reads -------------------------------------------------------------------------------------


def get_process(tx: Transaction, start_identity: str) -> AgentProcessRow | None:
    """Return the process registered under ``start_identity``, or None."""
    row = tx.one(_SELECT_PROCESS + " WHERE start_identity = ?", (start_identity,))
    return None if row is None else _process(row)


def live_process_of_run(tx: Transaction, run_id: str) -> AgentProcessRow | None:
    """Return the run's live agent process (at most one), or None."""
    row = tx.one(_SELECT_LIVE_OF_RUN, (run_id,))
    return None if row is None else _process(row)


def live_processes_of_runner(tx: Transaction, runner_epoch: str) -> list[AgentProcessRow]:
    """Return the live agent processes a runner registered, oldest first."""
    return [_process(row) for row in tx.all(_SELECT_LIVE_OF_RUNNER, (runner_epoch,))]


def live_processes(tx: Transaction) -> list[AgentProcessRow]:
    """Return every live agent process, oldest first (startup recovery: all of them belong to
    runners of a dead server)."""
    return [_process(row) for row in tx.all(_SELECT_ALL_LIVE)]


def processes_of_run(tx: Transaction, run_id: str) -> list[AgentProcessRow]:
    """Return every agent process of a run, live or ended, oldest first."""
    return [_process(row) for row in tx.all(_SELECT_OF_RUN, (run_id,))]


def turns_of(tx: Transaction, request_id: str) -> AgentTurns | None:
    """Return the turns of an agent request, or None when no command ever ran for it."""
    row = tx.one(_SELECT_TURNS, (request_id,))
    if row is None:
        return None
    return AgentTurns(
        request_id=row["request_id"],
        run_id=row["run_id"],
        turns_started=row["turns_started"],
        unproductive_turns=row["unproductive_turns"],
    )


def is_driven(tx: Transaction, request_id: str) -> bool:
    """Whether a headless command has run for the request (it has a turn row): its runner
    is relaunched to run the command again after it stopped, instead of the run waiting."""
    return turns_of(tx, request_id) is not None


def run_agent_command(tx: Transaction, run_id: str) -> tuple[str, ...] | None:
    """Return the agent command the run was started with (its launch options), or None."""
    digest = tx.scalar(_SELECT_LAUNCH_OPTIONS, (run_id,))
    if digest is None:
        return None
    options = blobs.read_json(tx, bytes(digest))
    command = options.get("agentCommand") if isinstance(options, dict) else None
    if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
        return None
    return tuple(str(part) for part in command) or None


def execution_mode(tx: Transaction, run_id: str) -> ExecutionMode:
    """Return how the run is bound (``headless`` unless bound to an interactive session)."""
    value = tx.scalar(_SELECT_EXECUTION_MODE, (run_id,))
    return ExecutionMode.HEADLESS if value is None else ExecutionMode(value)


# Writes (inside the caller's one change) ---------------------------------------------------


def insert_process(
    tx: Transaction,
    *,
    start_identity: str,
    run_id: str,
    runner_epoch: str,
    attempt_id: str,
    request_id: str,
    turn_number: int,
    pid: int,
    pgid: int,
) -> None:
    """Register a live agent process (``sqlite3.IntegrityError`` if the identity is known or
    the run already has a live one)."""
    tx.execute(
        _INSERT_PROCESS,
        (
            start_identity,
            run_id,
            runner_epoch,
            attempt_id,
            request_id,
            turn_number,
            pid,
            pgid,
            tx.now,
        ),
    )


def end_process(
    tx: Transaction, start_identity: str, ended_by: AgentProcessEnd, exit_code: int | None = None
) -> bool:
    """A live process leaves the registry (``exit_code`` only when its runner unregistered
    it); False when it had already left."""
    code = exit_code if ended_by is AgentProcessEnd.UNREGISTERED else None
    return tx.execute(_END_PROCESS, (tx.now, ended_by.value, code, start_identity)).rowcount > 0


def begin_turn(tx: Transaction, request_id: str, run_id: str) -> AgentTurns:
    """Count one more turn of the request (the first creates its row); return the turns."""
    tx.execute(_BEGIN_TURN, {"request": request_id, "run": run_id, "now": tx.now})
    turns = turns_of(tx, request_id)
    assert turns is not None
    return turns


def count_unproductive(tx: Transaction, request_id: str) -> AgentTurns | None:
    """Count one more turn of the request that ended without an accepted submission (never
    more than the turns started); return the turns, None for a request with no turn."""
    tx.execute(_COUNT_UNPRODUCTIVE, (tx.now, request_id))
    return turns_of(tx, request_id)


def _process(row: sqlite3.Row) -> AgentProcessRow:
    return AgentProcessRow(
        start_identity=row["start_identity"],
        run_id=row["run_id"],
        runner_epoch=row["runner_epoch"],
        attempt_id=row["attempt_id"],
        request_id=row["request_id"],
        turn_number=row["turn_number"],
        pid=row["pid"],
        pgid=row["pgid"],
        registered_at=row["registered_at"],
        ended_at=row["ended_at"],
        ended_by=None if row["ended_by"] is None else AgentProcessEnd(row["ended_by"]),
        exit_code=row["exit_code"],
    )
