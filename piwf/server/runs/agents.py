"""The server's side of headless agent commands: a runner's agent calls, settled notices, reaping.

A runner that drives an agent step starts the agent command in its own process group and
talks about it over its pipe (docs/AGENTS.md)::

    process.register    checked here first: the pid is a direct child of that runner, exactly
                        the start identity it names, and leads its own group (else a protocol
                        violation); then applied under the runner's claim (calls.apply_agent_call)
    process.unregister  applied with no claim (valid after it was released)
    interaction.settled sent once, when the request the command works on stops being pending
                        while it runs (checked at every claim renewal and whenever
                        :meth:`AgentCalls.check_settled` is asked, e.g. after an acceptance)

The server owns the one process registry. When a runner ends with a group still registered
(:func:`reap_runner_groups`, in its exit transaction), or a dead server's runners left groups
(:func:`recover_agent_groups`, startup recovery), each group is killed only when it is provably
still that group (:func:`piwf.processes.kill_recorded_group`: never a recycled pid) and its row
is marked ``reaped``; its active interval closes (now, or at its ``observed_at`` after a crash).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.errors import ClaimLostError
from piwf.lifecycle import Applied, Conflict
from piwf.processes import is_direct_child, kill_recorded_group, leads_own_group
from piwf.protocol.runner_v1 import ChildMessage, InteractionSettled, ProcessRegistration
from piwf.state import StateDatabase, Transaction
from piwf.state.execution import agents, headless, requests
from piwf.state.execution.calls import (
    RunnerCallRejectedError,
    apply_agent_call,
    decode_agent_call,
)
from piwf.state.leases import Claim

log = logging.getLogger("piwf.server")


@dataclass(frozen=True)
class AgentAnswer:
    """How to answer one agent call: the response fields, and what the session does next
    (``violation``: stop the runner for breaking the protocol; ``claim_lost``: stop it)."""

    outcome: str
    result: JsonValue = None
    error: str | None = None
    violation: str | None = None
    claim_lost: bool = False
    #: The attempt whose agent request a ``process.register`` just registered a turn of.
    turn_of_attempt: str | None = None


class AgentCalls:
    """The agent calls of one runner session and the request its command works on."""

    def __init__(self, db: StateDatabase, run_id: str, runner_epoch: str) -> None:
        self.db = db
        self.run_id = run_id
        self.runner_epoch = runner_epoch
        #: The agent request of the registered command (None when none is registered).
        self.request_id: str | None = None
        self._notified = False

    def serve(
        self,
        message: ChildMessage,
        claim: Claim,
        runner_pid: int | None,
        *,
        lease_ms: int,
        verify_server_claim: Callable[[Transaction], None],
    ) -> AgentAnswer:
        """Decode, check and apply one agent call (``verify_server_claim(tx)`` proves the
        server's epoch in the same transaction). Raises ``StateUnavailableError`` when the
        database cannot serve (nothing was applied; the caller retries)."""
        try:
            call = decode_agent_call(claim, message.operation, message.payload or {})
        except RunnerCallRejectedError as error:
            return AgentAnswer("rejected", error=f"{error.code}: {error}", violation=str(error))
        if isinstance(call.message, ProcessRegistration):
            problem = _registration_problem(call.message, runner_pid)
            if problem is not None:
                return AgentAnswer(
                    "rejected", error=f"protocolRejected: {problem}", violation=problem
                )
        attempt_id = None
        try:
            with self.db.write() as tx:
                verify_server_claim(tx)
                result = apply_agent_call(tx, claim, self.runner_epoch, call, lease_ms=lease_ms)
                if isinstance(call.message, ProcessRegistration):
                    request = requests.get_request(tx, call.message.request_id)
                    attempt_id = None if request is None else request.attempt_id
        except ClaimLostError:
            return AgentAnswer("claimLost", error="claim lost", claim_lost=True)
        if isinstance(result, Conflict):
            return AgentAnswer("rejected", error=result.evidence)
        if isinstance(call.message, ProcessRegistration):
            self.request_id, self._notified = call.message.request_id, False
        else:
            self.request_id = None
        outcome = "accepted" if isinstance(result, Applied) else "adopted"
        return AgentAnswer(outcome, result=result.value.to_json(), turn_of_attempt=attempt_id)

    def check_settled(self) -> bytes | None:
        """The ``interaction.settled`` frame to send now, once: the registered command's
        request is no longer pending. None when there is nothing (new) to say."""
        request_id = self.request_id
        if request_id is None or self._notified:
            return None
        with self.db.read() as tx:
            request = requests.get_request(tx, request_id)
            state = None if request is None else headless.request_state(tx, request)
        if state is not None and state.status == "pending":
            return None
        self._notified = True
        return InteractionSettled(requestId=request_id).encode()


def reap_runner_groups(tx: Transaction, runner_epoch: str) -> int:
    """Reap every group still registered by ``runner_epoch`` (it has ended): kill each that is
    provably itself, mark it ``reaped`` and close its interval now. Returns how many."""
    reaped = 0
    for row in agents.live_processes_of_runner(tx, runner_epoch):
        if kill_recorded_group(row.pid, row.start_identity, row.pgid):
            log.info("run %s: killed the agent group its runner left", row.run_id)
        reaped += headless.reap_process(tx, row)
    return reaped


def recover_agent_groups(db: StateDatabase) -> int:
    """Startup recovery: kill every group a dead server's runners left registered (identity
    checked), mark them ``reaped`` and close every open interval at its ``observed_at``."""
    with db.read() as tx:
        left = agents.live_processes(tx)
    for row in left:
        if kill_recorded_group(row.pid, row.start_identity, row.pgid):
            log.info("recovery: killed an agent group of run %s", row.run_id)
    with db.write() as tx:
        reaped = headless.reap_after_server_death(tx)
    if reaped:
        log.info("recovery: reaped %d agent process(es) of an earlier server", reaped)
    return reaped


def _registration_problem(message: ProcessRegistration, runner_pid: int | None) -> str | None:
    """Why a registration cannot be the runner's own agent command (None when it can)."""
    if message.pgid != message.pid:
        return "process.register: an agent command must lead its own process group"
    if runner_pid is None or not is_direct_child(message.start_identity, runner_pid):
        return "process.register: the process is not a direct child of this runner"
    if not message.start_identity.startswith(f"{message.pid}:"):
        return "process.register: the start identity is not that pid's"
    if not leads_own_group(message.start_identity):
        return "process.register: the process does not lead its own process group"
    return None
