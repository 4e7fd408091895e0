"""Reaping registered agent groups (``server/runs/agents.py``) with real processes.

The registry rows are written through the runner's own call path (``apply_agent_call``); the
processes are real, each in its own session, and every one is killed in a ``finally``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

from piwf.processes import start_identity
from piwf.server.runs.agents import reap_runner_groups, recover_agent_groups
from piwf.state import StateDatabase
from piwf.state.enums import AgentProcessEnd
from piwf.state.execution import agents
from tests.server.harness import wait_for
from tests.state.test_headless_calls import call, live_agent_runner


@contextmanager
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process unrelated to piwf, leading its own group."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def registered(db: StateDatabase, pid: int, identity: str) -> tuple[str, str]:
    """Register ``pid`` under ``identity`` for a live agent runner; (runner epoch, identity)."""
    launched, epoch, request_id = live_agent_runner(db)
    payload = {
        "runId": "run-1",
        "requestId": request_id,
        "pid": pid,
        "startIdentity": identity,
        "pgid": pid,
    }
    call(db, launched, epoch, "process.register", payload)
    return epoch, identity


def test_a_registered_pid_now_used_by_another_process_is_never_killed(db: StateDatabase) -> None:
    with sleeper() as unrelated:
        real = start_identity(unrelated.pid)
        assert real is not None
        # The registry recorded an earlier process under this pid (another create time).
        pid, _, boot = real.split(":")
        epoch, identity = registered(db, unrelated.pid, f"{pid}:12345.000:{boot}")
        with db.write() as tx:
            assert reap_runner_groups(tx, epoch) == 1
        assert unrelated.poll() is None and not gone(unrelated.pid)
        with db.read() as tx:
            row = agents.get_process(tx, identity)
        assert row is not None and row.ended_by is AgentProcessEnd.REAPED


def test_a_registered_group_that_is_still_itself_is_killed(db: StateDatabase) -> None:
    with sleeper() as agent:
        identity = start_identity(agent.pid)
        assert identity is not None
        epoch, _ = registered(db, agent.pid, identity)
        with db.write() as tx:
            assert reap_runner_groups(tx, epoch) == 1
        wait_for(lambda: agent.poll() is not None, timeout_s=10, what="the group to be killed")
        with db.write() as tx:
            assert reap_runner_groups(tx, epoch) == 0  # it left the registry once


def test_startup_recovery_reaps_what_a_dead_server_left_and_spares_strangers(
    db: StateDatabase,
) -> None:
    with sleeper() as unrelated:
        identity = f"{unrelated.pid}:1.000:elsewhere"
        registered(db, unrelated.pid, identity)
        assert recover_agent_groups(db) == 1
        assert unrelated.poll() is None
        with db.read() as tx:
            assert agents.live_processes(tx) == []
