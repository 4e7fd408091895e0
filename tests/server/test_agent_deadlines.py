"""Active-time deadlines of agent steps through real servers, runners and agent commands.

The agent command is ``fixtures/agents/hangs.py``: it appends its pid to a file once it has
read its prompt (so its interval is open) and then never returns. A deadline is ``timeout_ms``
of *active* time: only while such a command runs. Where the point of a test is that wall-clock
time passes without being charged (paused, server down, no command), the test waits a bounded
wall-clock span on purpose; everything else waits on a condition.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cli_process import run_piwf
from tests.server.harness import (
    RawClient,
    ServerFactory,
    ServerProcess,
    raw_client,
    wait_for,
)
from tests.server.test_execution import FAST, query, run_view, wait_run, write_workflow

HANGS = str(Path(__file__).resolve().parents[2] / "fixtures" / "agents" / "hangs.py")
#: The backstop between deadline passes is a minute: a deadline that fires within a test's
#: bounded waits was fired by the timer the agent's registration armed, not by the poll.
DEADLINE_ENV = {**FAST, "PIWF_CLAIM_POLL_S": "60"}


def hanging_workflow(directory: Path, name: str, timeout_ms: int | None, *, routed: bool) -> str:
    """One agent step fulfilled by the hanging command; ``routed`` adds a ``timed_out`` case."""
    command = [sys.executable, HANGS, str(directory / "pids")]
    nodes = [
        f'"ask": agent(prompt="Think forever.", expected_output="{{}}", '
        f"timeout_ms={timeout_ms!r}, command={command!r})"
    ]
    edges = "[]"
    if routed:
        nodes += [
            '"late": compute(lambda ctx: {"late": ctx.outputs.get("ask")})',
            '"done": compute(lambda ctx: "done")',
        ]
        edges = (
            '[{"from": "ask", "switch": {"on": "$result.outcome", '
            '"cases": {"timed_out": "late", "ok": "done"}}}]'
        )
    body = ", ".join(nodes)
    return write_workflow(
        directory,
        name,
        f"""
        from piwf.workflow import agent, compute, define_workflow

        workflow = define_workflow(
            name={name!r}, start_at="ask", nodes={{{body}}}, edges={edges}
        )
        """,
    )


@pytest.fixture
def agent_pids(tmp_path: Path) -> Iterator[Path]:
    """The hanging command's pid file; every pid in it is killed after the test."""
    pids = tmp_path / "pids"
    _SEEN.clear()  # the pids of one test only: an earlier test's may have been reused
    yield pids
    for pid in read_pids(pids):
        process = _SEEN.get(pid)
        with contextlib.suppress(psutil.Error):
            if process is not None and process.is_running():  # never a pid reused since
                process.kill()
    _SEEN.clear()


#: Each agent pid seen, as the process it named when first read (the hanging command writes
#: its pid as it starts). With two test workers the suite starts processes fast enough for a
#: 32768-pid space to wrap within a test, so ``gone`` must not ask about a bare pid.
_SEEN: dict[int, psutil.Process | None] = {}
ZOMBIE = psutil.STATUS_ZOMBIE


def read_pids(pids: Path) -> list[int]:
    if not pids.exists():
        return []
    found = [int(line) for line in pids.read_text().split()]
    for pid in found:
        if pid not in _SEEN:
            try:
                _SEEN[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                _SEEN[pid] = None  # it ended already
    return found


def agent_runs(pids: Path, count: int, timeout_s: float = 30) -> list[int]:
    """Wait until the command has started ``count`` times; return its pids."""
    return list(
        wait_for(
            lambda: (found := read_pids(pids)) and len(found) >= count and found,
            timeout_s=timeout_s,
            what=f"agent run {count}",
        )
    )


def gone(pid: int) -> bool:
    """The agent process ``pid`` named when it was read has ended (or is a zombie); a new
    process that reuses the pid does not count as the agent."""
    process = _SEEN.get(pid)  # every pid a test asks about came through read_pids
    try:
        return process is None or not process.is_running() or process.status() == ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start_run(client: RawClient, workflow: str, key: str) -> str:
    response = client.request("run.start", {"workflow": workflow, "input": {}}, key=key)
    assert response.outcome == "accepted", response
    assert response.receipt is not None
    return str(response.receipt["run"]["runId"])


def pending_agent_request(client: RawClient, run_id: str) -> dict[str, Any] | None:
    listed = client.request("requests.list", {"runId": run_id}).receipt
    assert listed is not None
    found = [item for item in listed["requests"] if item["kind"] == "agent"]
    return found[0] if found else None


def active_time(client: RawClient, run_id: str) -> dict[str, Any]:
    request = pending_agent_request(client, run_id)
    assert request is not None, "the agent request is no longer pending"
    active: dict[str, Any] = request["activeTime"]
    return active


def intervals(server: ServerProcess, run_id: str) -> list[tuple[Any, ...]]:
    return query(
        server,
        "SELECT v.interval_number, v.started_at, v.observed_at, v.ended_at, v.elapsed_ms"
        " FROM attempt_active_intervals v JOIN node_attempts a USING (attempt_id)"
        " WHERE a.run_id = ? ORDER BY v.interval_number",
        (run_id,),
    )


def attempts_of(server: ServerProcess, run_id: str) -> list[tuple[Any, ...]]:
    return query(
        server,
        "SELECT attempt_id, node_path, visit, attempt_number, status FROM node_attempts"
        " WHERE run_id = ? ORDER BY rowid",
        (run_id,),
    )


def answered_by(server: ServerProcess, run_id: str) -> list[tuple[Any, ...]]:
    return query(
        server, "SELECT status, answered_by FROM interactive_requests WHERE run_id = ?", (run_id,)
    )


def piwf(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_piwf(args, env={**os.environ, "PIWF_HOME": str(server.home)})


def hold_for(seconds: float, check: Callable[[], None]) -> None:
    """Let ``seconds`` of wall-clock time pass (elapsed time is what such a test is about,
    not a synchronisation), calling ``check`` every 0.1 s so a premature change fails at once."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        check()
        select.select([], [], [], min(0.1, left))
    check()


# conformance: I4
@pytest.mark.parametrize("routed", [False, True], ids=["no-route", "timed-out-route"])
def test_a_hanging_agent_is_stopped_at_its_active_time_deadline(
    servers: ServerFactory, tmp_path: Path, agent_pids: Path, routed: bool
) -> None:
    server = servers.start(env=DEADLINE_ENV)
    workflow = hanging_workflow(tmp_path, "hang", 1_500, routed=routed)
    with raw_client(server) as client:
        run_id = start_run(client, workflow, "hang")
        [pid] = agent_runs(agent_pids, 1)
        counting = active_time(client, run_id)
        assert counting["timeoutMs"] == 1_500 and counting["counting"] is True
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    wait_for(lambda: gone(pid), timeout_s=15, what="the agent command's end")
    assert read_pids(agent_pids) == [pid]  # it never ran again
    [ask, *rest] = attempts_of(server, run_id)
    assert ask[1:] == ("ask", 1, 1, "timed_out")  # the same attempt recorded the timeout
    assert answered_by(server, run_id) == [("cancelled", "expired")]
    [(_, _, _, ended, elapsed)] = intervals(server, run_id)
    assert ended is not None and elapsed >= 1_500
    # A late submission is told the deadline closed the request, not that it was cancelled.
    [(request_id,)] = query(
        server, "SELECT request_id FROM interactive_requests WHERE run_id = ?", (run_id,)
    )
    late = piwf(server, "submit", "--json", request_id, '{"summary": "late"}')
    assert late.returncode == 1, late.stderr
    refused = json.loads(late.stdout)["error"]
    assert refused["code"] == "requestNotOpen"
    assert "reached its active-time deadline" in refused["message"], refused
    assert "cancelled" not in refused["message"]
    if routed:
        assert run["status"] == "completed"
        assert [row[1:] for row in rest] == [("late", 1, 1, "completed")]
        assert view["output"] == {"late": None}
    else:
        assert run["status"] == "timed_out" and rest == []
        shown = piwf(server, "run", "show", run_id)
        assert shown.returncode == 0, shown.stderr
        assert "timed_out" in shown.stdout
        assert "active-time deadline" in shown.stdout  # the error says why


def test_a_request_that_expired_after_a_rejection_shows_as_expired(
    servers: ServerFactory, tmp_path: Path, agent_pids: Path
) -> None:
    server = servers.start(env=DEADLINE_ENV)
    command = [sys.executable, HANGS, str(agent_pids), '["not an object"]']
    workflow = write_workflow(
        tmp_path,
        "rejected",
        f"""
        from piwf.workflow import agent, define_workflow

        def refuse(output, ctx):
            raise ValueError("submit an object")

        workflow = define_workflow(name="rejected", start_at="ask", nodes={{
            "ask": agent(prompt="Try.", expected_output="{{}}", validate=refuse,
                         timeout_ms=4_000, command={command!r})}}, edges=[])
        """,
    )
    with raw_client(server) as client:
        run_id = start_run(client, workflow, "rejected")
        assert wait_run(client, run_id)["status"] == "timed_out"
        [shown] = run_view(client, run_id)["agentRequests"]
    assert [item["outcome"] for item in shown["submissions"]] == ["rejected"]
    assert shown["status"] == "expired"  # not "cancelled": nobody cancelled it
    text = piwf(server, "run", "show", run_id)
    assert f"{shown['requestId']} (expired)" in text.stdout, text.stdout


# conformance: I4
def test_paused_time_does_not_count(
    servers: ServerFactory, tmp_path: Path, agent_pids: Path
) -> None:
    budget_ms = 2_000
    server = servers.start(env=DEADLINE_ENV)
    workflow = hanging_workflow(tmp_path, "pausing", budget_ms, routed=False)
    with raw_client(server) as client:
        run_id = start_run(client, workflow, "pausing")
        [first] = agent_runs(agent_pids, 1)
        wait_for(
            lambda: active_time(client, run_id)["activeMs"] >= 400,
            timeout_s=30,
            what="some active time",
        )
        assert client.request("run.pause", run_id=run_id, key="pause").outcome == "accepted"
        wait_for(lambda: gone(first), timeout_s=15, what="the paused agent's end")
        wait_for(lambda: not active_time(client, run_id)["counting"], what="the interval to close")
        left = active_time(client, run_id)
        assert 0 < left["remainingMs"] < budget_ms and "dueAt" not in left

        def unchanged() -> None:
            assert active_time(client, run_id) == left

        hold_for(budget_ms / 1000 + 1.0, unchanged)  # paused longer than the whole budget
        assert client.request("run.resume", run_id=run_id, key="resume").outcome == "accepted"
        [_, second] = agent_runs(agent_pids, 2)
        # Not expired at resume: the command runs again with the time that was left.
        assert answered_by(server, run_id) == [("pending", None)]
        run = wait_run(client, run_id)
    wait_for(lambda: gone(second), timeout_s=15, what="the resumed agent's end")
    assert run["status"] == "timed_out"
    closed = intervals(server, run_id)
    assert len(closed) == 2
    (_, _, _, paused_at, used_before), (_, resumed_at, _, _, used_after) = closed
    assert used_before == budget_ms - left["remainingMs"]
    # The remainder was used after the resume; the pause charged nothing.
    assert used_after >= left["remainingMs"]
    assert resumed_at - paused_at >= budget_ms


# conformance: I4
def test_server_downtime_does_not_count(
    servers: ServerFactory, tmp_path: Path, agent_pids: Path
) -> None:
    budget_ms = 3_000
    first_server = servers.start(env=DEADLINE_ENV)
    workflow = hanging_workflow(tmp_path, "downtime", budget_ms, routed=False)
    with raw_client(first_server) as client:
        run_id = start_run(client, workflow, "downtime")
        [first] = agent_runs(agent_pids, 1)
        wait_for(
            lambda: active_time(client, run_id)["activeMs"] >= 500,
            timeout_s=30,
            what="some active time",
        )
    first_server.kill()
    killed_at = time.monotonic()
    # Down for longer than the whole budget (the elapsed time is the point of this wait).
    hold_for(budget_ms / 1000 + 0.5, lambda: None)
    assert time.monotonic() - killed_at > budget_ms / 1000
    second_server = servers.start(env=DEADLINE_ENV)
    assert second_server.ready["ok"] is True, second_server.ready
    wait_for(lambda: gone(first), timeout_s=15, what="the dead server's agent group to end")
    # Recovery closed the first interval at its last observation; the resumed runner's may
    # have opened already (its run is admitted as soon as the server listens).
    (_, started, observed, ended, used_before), *resumed = intervals(second_server, run_id)
    assert ended == observed and used_before == observed - started < budget_ms
    assert len(resumed) <= 1
    # Not expired at restart: the next runner runs the command again for the time left.
    [_, second] = agent_runs(agent_pids, 2)
    assert answered_by(second_server, run_id) == [("pending", None)]
    with raw_client(second_server) as client:
        run = wait_run(client, run_id)
    wait_for(lambda: gone(second), timeout_s=15, what="the resumed agent's end")
    assert run["status"] == "timed_out"
    (_, _, _, _, first_used), (_, _, _, _, second_used) = intervals(second_server, run_id)
    assert first_used + second_used >= budget_ms and second_used >= budget_ms - first_used


# conformance: I4
def test_a_restart_with_a_due_expiry_takes_the_timeout_path_first(
    servers: ServerFactory, tmp_path: Path, agent_pids: Path
) -> None:
    # The server dies right at the deadline, after it saw the agent working up to it and
    # before it stopped the runner: the budget is spent and observed_at is past it.
    crashing = {**DEADLINE_ENV, "PIWF_FAULTS": "deadline.before_stop@1=kill"}
    first_server = servers.start(env=crashing)
    workflow = hanging_workflow(tmp_path, "due", 1_000, routed=True)
    with raw_client(first_server) as client:
        run_id = start_run(client, workflow, "due")
        [pid] = agent_runs(agent_pids, 1)
    # The armed fault kills it at the deadline.
    assert first_server.process.wait(timeout=60) == -signal.SIGKILL
    second_server = servers.start(env=DEADLINE_ENV)
    assert second_server.ready["ok"] is True, second_server.ready
    with raw_client(second_server) as client:
        run = wait_run(client, run_id)
    wait_for(lambda: gone(pid), timeout_s=15, what="the dead server's agent group to end")
    assert run["status"] == "completed"
    assert read_pids(agent_pids) == [pid]  # the agent never ran again
    assert [row[1:] for row in attempts_of(second_server, run_id)] == [
        ("ask", 1, 1, "timed_out"),
        ("late", 1, 1, "completed"),
    ]
    [(_, _, observed, ended, used)] = intervals(second_server, run_id)
    assert ended == observed and used >= 1_000
    # The expiry was recorded before the new server launched any runner for the run.
    events = [
        row[0]
        for row in query(
            second_server,
            "SELECT e.event_type FROM events e JOIN resources r USING (resource_id)"
            " WHERE r.resource_id = ? ORDER BY e.rowid",
            (f"run:{run_id}",),
        )
    ]
    expired_at = events.index("interaction.expired")
    assert "lease.claimed" in events[expired_at:]
    assert events[:expired_at].count("lease.claimed") == 1  # only the first server's launch


# conformance: I4
def test_a_waiting_agent_request_never_expires_by_wall_clock(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = servers.start(env=DEADLINE_ENV)
    workflow = write_workflow(
        tmp_path,
        "waits",
        """
        from piwf.workflow import agent, define_workflow

        workflow = define_workflow(
            name="waits",
            start_at="ask",
            nodes={"ask": agent(prompt="Answer me.", expected_output="{}", timeout_ms=500)},
            edges=[],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start_run(client, workflow, "waits")
        wait_for(
            lambda: run_view(client, run_id)["run"]["status"] == "waiting",
            timeout_s=30,
            what="the run to wait",
        )
        untouched = {"timeoutMs": 500, "activeMs": 0, "remainingMs": 500, "counting": False}

        def still_pending() -> None:
            assert active_time(client, run_id) == untouched

        hold_for(2.0, still_pending)  # four budgets of waiting: none of it is active time
        status = client.request("server.status").receipt
    assert status is not None and status["agentDeadlines"] == 1
    assert answered_by(server, run_id) == [("pending", None)]
    assert intervals(server, run_id) == []
    listed = piwf(server, "requests", "--run", run_id)
    assert listed.returncode == 0, listed.stderr
    assert "500 ms active time left" in listed.stdout
    as_json = piwf(server, "requests", "--run", run_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    [request] = json.loads(as_json.stdout)["requests"]
    assert (request["kind"], request["activeTime"]) == ("agent", untouched)
    shown = piwf(server, "run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "0 ms of 500 ms used, 500 ms left (not counting)" in shown.stdout
