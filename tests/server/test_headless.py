"""Headless agent steps through real servers, real runners and real agent commands.

The agent commands are the scripts in ``fixtures/agents/``; each records what it saw or which
processes it started in a file the test reads, so nothing here depends on timing: every wait
polls a condition against a deadline. Every agent process a test starts is gone at its end
(cancelled runs, killed groups), and the harness reaps the servers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf import Client
from piwf.server.children.capture import ATTEMPT_LOG_CAP
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_content_refs import piwf_cli
from tests.server.test_execution import FAST, query, run_view, wait_run, write_workflow

AGENTS = Path(__file__).resolve().parents[2] / "fixtures" / "agents"
WORKFLOWS = Path(__file__).resolve().parents[2] / "fixtures" / "workflows"


def agent_command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(AGENTS / script), *args]


def headless_workflow(directory: Path, node_command: list[str] | None = None) -> str:
    """An agent step that routes on ``$result.outcome``: ``done`` or ``recover``."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_workflow(
        directory,
        "headless",
        f"""
        from piwf.workflow import agent, compute, define_workflow

        workflow = define_workflow(
            name="headless",
            start_at="ask",
            nodes={{
                "ask": agent(
                    prompt="Summarise the tides.",
                    expected_output='{{"summary": "text"}}',
                    command={node_command!r},
                ),
                "done": compute(lambda ctx: {{"got": ctx.outputs["ask"]}}),
                "recover": compute(lambda ctx: {{"error": ctx.results["ask"].error}}),
            }},
            edges=[{{"from": "ask", "switch": {{"on": "$result.outcome", "cases": {{
                "ok": "done", "failed": "recover", "timed_out": "recover"}}}}}}],
        )
        """,
    )


def start(
    client: RawClient,
    workflow: str,
    command: list[str] | None,
    key: str,
    input_value: dict[str, Any] | None = None,
) -> str:
    payload: dict[str, Any] = {"workflow": workflow, "input": input_value or {}}
    if command is not None:
        payload["agentCommand"] = command
    response = client.request("run.start", payload, key=key)
    assert response.outcome == "accepted", response
    assert response.receipt is not None
    return str(response.receipt["run"]["runId"])


def control(client: RawClient, operation: str, run_id: str, key: str) -> None:
    response = client.request(operation, run_id=run_id, key=key)
    assert response.outcome in ("accepted", "adopted"), response


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def processes(server: ServerProcess, run_id: str) -> list[tuple[Any, ...]]:
    """(start identity, pid, ended_by) of the run's registered agent processes, oldest first."""
    return query(
        server,
        "SELECT start_identity, pid, ended_by FROM agent_processes WHERE run_id = ?"
        " ORDER BY registered_at, rowid",
        (run_id,),
    )


def intervals(server: ServerProcess, run_id: str) -> list[tuple[Any, ...]]:
    """(started_at, observed_at, ended_at, elapsed_ms) of the run's active intervals."""
    return query(
        server,
        "SELECT i.started_at, i.observed_at, i.ended_at, i.elapsed_ms"
        " FROM attempt_active_intervals i JOIN node_attempts a ON a.attempt_id = i.attempt_id"
        " WHERE a.run_id = ? ORDER BY i.interval_number",
        (run_id,),
    )


def live_agent(server: ServerProcess, run_id: str, turns: int = 1) -> tuple[str, int]:
    """Wait until the run's ``turns``-th agent process is registered and live."""

    def registered() -> tuple[str, int] | None:
        rows = processes(server, run_id)
        if len(rows) >= turns and rows[-1][2] is None:
            return str(rows[-1][0]), int(rows[-1][1])
        return None

    found: tuple[str, int] = wait_for(registered, timeout_s=30, what="a live agent process")
    return found


def runner_pid(server: ServerProcess, run_id: str) -> int:
    rows = query(
        server,
        "SELECT pid FROM run_runners WHERE run_id = ? AND status IN ('ready', 'running')",
        (run_id,),
    )
    assert len(rows) == 1, rows
    return int(rows[0][0])


@pytest.fixture
def agent_server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env={**FAST, "PIWF_MARKER_OF_THE_SERVER": "secret"})
    assert started.ready["ok"] is True, started.ready
    return started


def test_a_command_that_never_submits_gets_two_reminders_then_the_attempt_fails(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    log = tmp_path / "turns.log"
    workflow = headless_workflow(tmp_path)
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, agent_command("never_submits.py", str(log)), "never")
        run = wait_run(client, run_id)
        output = run_view(client, run_id)["output"]
    assert run["status"] == "completed"  # through the failed route
    seen = lines(log)
    assert len(seen) == 3
    assert seen[0] == "none"
    assert seen[1].startswith("Reminder 1 of 2: ") and "No submission was received" in seen[1]
    assert seen[2].startswith("Reminder 2 of 2: ")
    [(request_id,)] = query(
        agent_server, "SELECT request_id FROM interactive_requests WHERE run_id = ?", (run_id,)
    )
    error = output["error"]
    assert error.startswith("missingSubmission: ") and request_id in error
    # Nothing was submitted: the error says where the command's own output can be read.
    assert f"what the command printed: piwf run logs {run_id}." in error, error
    assert "Its last turn's command exited with status 0." in error, error
    assert [row[2] for row in processes(agent_server, run_id)] == ["unregistered"] * 3
    assert query(
        agent_server,
        "SELECT turns_started, unproductive_turns FROM agent_turns WHERE request_id = ?",
        (request_id,),
    ) == [(3, 3)]
    assert all(ended is not None for _, _, ended, _ in intervals(agent_server, run_id))


@pytest.mark.parametrize(
    ("how", "said"),
    [
        (["--exit", "3"], "Its last turn's command exited with status 3."),
        (["--signal", "KILL"], "Its last turn's command was ended by a signal (SIGKILL, 9)."),
    ],
    ids=["exit-3", "sigkill"],
)
def test_the_missing_submission_error_says_how_the_last_turn_ended(
    agent_server: ServerProcess, tmp_path: Path, how: list[str], said: str
) -> None:
    workflow = headless_workflow(tmp_path)
    command = agent_command("never_submits.py", str(tmp_path / "turns.log"), *how)
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, command, "ended")
        assert wait_run(client, run_id)["status"] == "completed"  # the failed route
        error = run_view(client, run_id)["output"]["error"]
    assert error.startswith("missingSubmission: ") and said in error, error
    assert len(lines(tmp_path / "turns.log")) == 3  # reminded twice, as after an exit 0


def test_the_command_gets_its_request_its_home_and_a_private_mcp_config_only(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    seen_file = tmp_path / "seen.json"
    workflow = headless_workflow(tmp_path)
    command = agent_command("never_submits.py", str(tmp_path / "log"), "--env", str(seen_file))
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, command, "env")
        wait_run(client, run_id)
    seen = json.loads(seen_file.read_text(encoding="utf-8"))
    [(request_id,)] = query(
        agent_server, "SELECT request_id FROM interactive_requests WHERE run_id = ?", (run_id,)
    )
    assert seen["piwf"]["PIWF_REQUEST_ID"] == request_id
    assert seen["piwf"]["PIWF_HOME"] == str(agent_server.home)
    # Nothing else of the runner or the server: no tunables, no markers, no faults.
    assert set(seen["piwf"]) == {"PIWF_REQUEST_ID", "PIWF_HOME", "PIWF_MCP_CONFIG"}
    assert "PIWF_MARKER_OF_THE_SERVER" not in seen["environ"]
    assert seen["environ"].get("PATH") == os.environ.get("PATH")
    assert (seen["mcpConfigMode"], seen["mcpDirectoryMode"]) == (0o600, 0o700)
    server = seen["mcpConfig"]["mcpServers"]["piwf"]
    assert server["args"][-2:] == ["--request", request_id]
    assert server["env"] == {"PIWF_HOME": str(agent_server.home)}
    assert not Path(seen["piwf"]["PIWF_MCP_CONFIG"]).exists()  # removed after the turn
    assert seen["prompt"].startswith("Summarise the tides.")


def test_cancelling_a_run_kills_the_agents_whole_group_grandchildren_included(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    pids_file = tmp_path / "pids"
    workflow = headless_workflow(tmp_path)
    command = agent_command("spawns_grandchildren.py", str(pids_file))
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, command, "cancel")
        record = json.loads(wait_for(lambda: lines(pids_file), timeout_s=30, what="pids")[0])
        pids = [record["command"], *record["children"], record["grandchild"]]
        assert not any(gone(pid) for pid in pids)
        assert intervals(agent_server, run_id)[-1][2] is None  # active while it runs
        shown = run_view(client, run_id)["agentProcess"]  # what `piwf run show` names
        assert (shown["pid"], shown["turn"]) == (record["command"], 1)
        control(client, "run.cancel", run_id, "cancel-1")
        wait_for(lambda: all(gone(pid) for pid in pids), timeout_s=10, what="the agent group")
        assert wait_run(client, run_id)["status"] == "cancelled"
        wait_for(lambda: "agentProcess" not in run_view(client, run_id), what="no live agent")
    wait_for(
        lambda: processes(agent_server, run_id)[-1][2] is not None, timeout_s=10, what="reaped"
    )
    assert intervals(agent_server, run_id)[-1][2] is not None


def test_pause_stops_the_agent_group_and_resume_runs_the_command_again(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    pids_file = tmp_path / "pids"
    workflow = headless_workflow(tmp_path)
    command = agent_command("spawns_grandchildren.py", str(pids_file))
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, command, "pause")
        first = json.loads(wait_for(lambda: lines(pids_file), timeout_s=30, what="pids")[0])
        pids = [first["command"], *first["children"], first["grandchild"]]
        control(client, "run.pause", run_id, "pause-1")
        wait_for(lambda: all(gone(pid) for pid in pids), timeout_s=10, what="the agent group")
        wait_for(lambda: intervals(agent_server, run_id)[-1][2] is not None, what="closed")
        assert run_view(client, run_id)["run"]["paused"] is True
        control(client, "run.resume", run_id, "resume-1")
        second = json.loads(
            wait_for(lambda: lines(pids_file)[1:], timeout_s=30, what="a resumed turn")[0]
        )
        assert second["command"] not in pids
        live_agent(agent_server, run_id, turns=2)
        control(client, "run.cancel", run_id, "cancel-2")
        again = [second["command"], *second["children"], second["grandchild"]]
        wait_for(lambda: all(gone(pid) for pid in again), timeout_s=10, what="the group")
    # The group may be gone before its interval's end is committed: wait for the end.
    wait_for(lambda: intervals(agent_server, run_id)[-1][2] is not None, what="closed")
    assert len(intervals(agent_server, run_id)) == 2


def test_a_killed_runner_leaves_no_agent_the_server_reaps_its_group(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    workflow = headless_workflow(tmp_path)
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, agent_command("hangs.py", str(pid_file)), "kill")
        identity, agent_pid = live_agent(agent_server, run_id)
        os.kill(runner_pid(agent_server, run_id), signal.SIGKILL)
        wait_for(lambda: gone(agent_pid), timeout_s=10, what="the agent to be reaped")
        reaped = wait_for(
            lambda: next(row for row in processes(agent_server, run_id) if row[0] == identity)[2],
            what="the registry row to close",
        )
        assert reaped == "reaped"
        # The run made progress, so the next runner runs the command again (a resumed turn).
        _, second = live_agent(agent_server, run_id, turns=2)
        control(client, "run.cancel", run_id, "cancel")
        wait_for(lambda: gone(second), timeout_s=10, what="the second agent")


def test_a_killed_server_leaves_no_agent_and_no_downtime_is_charged(
    servers: ServerFactory, tmp_path: Path
) -> None:
    first = servers.start(env=FAST)
    pid_file = tmp_path / "pid"
    workflow = headless_workflow(tmp_path)
    with raw_client(first) as client:
        run_id = start(client, workflow, agent_command("hangs.py", str(pid_file)), "server")
    identity, agent_pid = live_agent(first, run_id)
    # Wait for a claim renewal to observe the running interval, then kill the server.
    wait_for(lambda: intervals(first, run_id)[-1][1] > intervals(first, run_id)[-1][0])
    first.kill()
    wait_for(lambda: gone(agent_pid), timeout_s=10, what="the agent to die with its runner")
    [(started, observed, ended, _)] = intervals(first, run_id)
    assert ended is None  # nothing closed it yet: its server died
    killed_at = int(time.time() * 1000)
    second = servers.start(env=FAST)
    assert second.ready["ok"] is True, second.ready
    rows = {row[0]: row[2] for row in processes(second, run_id)}
    assert rows[identity] == "reaped"
    started_again, observed_again, ended_again, elapsed = intervals(second, run_id)[0]
    assert (started_again, observed_again) == (started, observed)
    assert ended_again == observed <= killed_at and elapsed == observed - started
    with raw_client(second, "after-restart") as client:
        _, resumed = live_agent(second, run_id, turns=2)
        control(client, "run.cancel", run_id, "cancel")
        wait_for(lambda: gone(resumed), timeout_s=10, what="the resumed agent")


def test_the_runs_command_beats_the_nodes_which_beats_the_servers(
    servers: ServerFactory, tmp_path: Path
) -> None:
    names = tmp_path / "names"
    server_command = " ".join(agent_command("never_submits.py", str(names), "--name", "server"))
    started = servers.start(env={**FAST, "PIWF_AGENT_COMMAND": server_command})
    assert started.ready["ok"] is True, started.ready
    with_node = headless_workflow(
        tmp_path / "a", agent_command("never_submits.py", str(names), "--name", "node")
    )
    without_node = headless_workflow(tmp_path / "b")
    run_command = agent_command("never_submits.py", str(names), "--name", "run")
    with raw_client(started) as client:
        for key, workflow, command, expected in (
            ("run", with_node, run_command, "run"),
            ("node", with_node, None, "node"),
            ("server", without_node, None, "server"),
        ):
            before = len(lines(names))
            run_id = start(client, workflow, command, key)
            assert wait_run(client, run_id)["status"] == "completed"
            assert {line.split(":")[0] for line in lines(names)[before:]} == {expected}


def test_a_server_agent_command_that_cannot_be_split_stops_the_start(
    servers: ServerFactory,
) -> None:
    refused = servers.start(env={**FAST, "PIWF_AGENT_COMMAND": "claude 'unbalanced"})
    assert refused.ready["ok"] is False
    assert "PIWF_AGENT_COMMAND" in refused.ready["error"]["message"]
    assert refused.process.wait(timeout=15) != 0


def test_a_command_that_cannot_be_started_fails_the_attempt_without_reminders(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    workflow = headless_workflow(tmp_path)
    missing = [str(tmp_path / "no-such-agent"), "--flag"]
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, missing, "missing")
        assert wait_run(client, run_id)["status"] == "completed"  # the failed route
        error = run_view(client, run_id)["output"]["error"]
    assert error.startswith("agentCommand: ") and repr(missing[0]) in error  # the path as given
    assert processes(agent_server, run_id) == []


def test_a_script_whose_interpreter_is_missing_is_not_called_missing_itself(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    workflow = headless_workflow(tmp_path)
    script = tmp_path / "agent.sh"
    script.write_text(f"#!{tmp_path / 'no-such-interpreter'}\nexit 0\n", encoding="utf-8")
    script.chmod(0o755)
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, [str(script)], "interpreter")
        assert wait_run(client, run_id)["status"] == "completed"  # the failed route
        error = run_view(client, run_id)["output"]["error"]
    assert error.startswith("agentCommand: ") and repr(str(script)) in error, error
    assert "the file exists, so its #! interpreter was not found" in error, error
    assert processes(agent_server, run_id) == []


def test_a_script_that_is_not_executable_is_said_so_with_the_fix(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    workflow = headless_workflow(tmp_path)
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    script.chmod(0o644)
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, [str(script)], "not-executable")
        assert wait_run(client, run_id)["status"] == "completed"  # the failed route
        error = run_view(client, run_id)["output"]["error"]
    assert error.startswith("agentCommand: ") and repr(str(script)) in error, error
    assert "Permission denied: the file is not executable (chmod +x it" in error, error
    assert processes(agent_server, run_id) == []


def test_a_command_that_lingers_after_its_request_was_settled_is_stopped(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    workflow = headless_workflow(tmp_path)
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, agent_command("hangs.py", str(pid_file)), "linger")
        _, agent_pid = live_agent(agent_server, run_id)
        [(request_id,)] = query(
            agent_server, "SELECT request_id FROM interactive_requests WHERE run_id = ?", (run_id,)
        )
        accept(agent_server, request_id, {"summary": "accepted meanwhile"})
        run = wait_run(client, run_id)
        assert gone(agent_pid)
        assert run["status"] == "completed"
        assert run_view(client, run_id)["output"] == {"got": {"summary": "accepted meanwhile"}}
    assert [row[2] for row in processes(agent_server, run_id)] == ["unregistered"]


def test_a_command_that_submits_wrong_then_right_completes_the_step(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    log = tmp_path / "turns.log"
    command = agent_command("submit_twice.py", str(log))
    with raw_client(agent_server) as client:
        topic = {"topic": "the tides"}
        run_id = start(client, str(WORKFLOWS / "agent_validate.py"), command, "twice", topic)
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert run["status"] == "completed", view.get("error")
    first, second = lines(log)
    assert first == "invalid" and second.startswith("valid after: ") and "summary" in second
    [agent_request] = view["agentRequests"]
    outcomes = [item["outcome"] for item in agent_request["submissions"]]
    assert outcomes == ["rejected", "accepted"]
    assert "non-empty" in agent_request["submissions"][0]["error"]
    assert view["output"] == {"summary": "The tides follow the moon."}


def test_a_command_that_prints_more_than_the_output_cap_is_not_killed_and_completes(
    agent_server: ServerProcess, tmp_path: Path
) -> None:
    printed = 3_000_000  # past the runner's 1 MiB cap as well as the attempt's
    workflow = headless_workflow(tmp_path)
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, agent_command("chatty.py", str(printed)), "chatty")
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert run["status"] == "completed", view.get("error")
    assert view["output"] == {"got": {"summary": "The tides follow the moon."}}
    # One runner, one turn: nothing was killed for the output. The runner's exit is recorded
    # once the server sees it end, which may be just after the run's completion.
    runners = "SELECT status FROM run_runners WHERE run_id = ?"
    wait_for(lambda: query(agent_server, runners, (run_id,)) != [("running",)], what="exit")
    assert query(agent_server, runners, (run_id,)) == [("exited",)]
    assert [row[2] for row in processes(agent_server, run_id)] == ["unregistered"]
    [(stdout, stderr, kept, dropped)] = query(
        agent_server,
        "SELECT l.stdout_bytes, l.stderr_bytes, l.kept_bytes, l.dropped_bytes"
        " FROM attempt_logs l JOIN node_attempts a USING (attempt_id)"
        " WHERE a.run_id = ? AND a.node_path = 'ask'",
        (run_id,),
    )
    assert stdout >= printed and stderr == len(b"about to submit\n")
    assert (kept, dropped) == (ATTEMPT_LOG_CAP, stdout + stderr - ATTEMPT_LOG_CAP)


def accept(server: ServerProcess, request_id: str, value: Any) -> None:
    """Submit ``value`` for ``request_id`` from outside the agent (as a person or another tool
    would) and wait for its acceptance."""
    with Client(server.home, autostart=False) as client:
        receipt = client.submit(request_id, value)
    assert receipt.outcome == "accepted"


@pytest.mark.parametrize("interruption", ["pause", "killed runner"])
def test_a_resumed_turn_prints_to_its_attempts_log_like_the_first_turn(
    agent_server: ServerProcess, tmp_path: Path, interruption: str
) -> None:
    pid_file = tmp_path / "pids"
    workflow = headless_workflow(tmp_path)
    with raw_client(agent_server) as client:
        run_id = start(client, workflow, agent_command("says_each_turn.py", str(pid_file)), "r")
        wait_for(lambda: lines(pid_file), timeout_s=30, what="the first turn")
        if interruption == "pause":
            control(client, "run.pause", run_id, "pause")
            wait_for(lambda: intervals(agent_server, run_id)[-1][2] is not None, what="paused")
            control(client, "run.resume", run_id, "resume")
        else:
            os.kill(runner_pid(agent_server, run_id), signal.SIGKILL)
        wait_for(lambda: lines(pid_file)[1:], timeout_s=30, what="a resumed turn")
        first, second = lines(pid_file)
        expected = [f"turn by pid {first}", f"turn by pid {second}"]

        def shown() -> list[str]:
            logs = piwf_cli(agent_server, "run", "logs", run_id, "--node", "ask", "--json")
            assert logs.returncode == 0, logs.stderr
            (attempt,) = json.loads(logs.stdout)["attempts"]
            return [line for line in attempt["text"].splitlines() if line.startswith("turn")]

        # The resumed turn's output is the same attempt's, not only in the runner's own log.
        wait_for(lambda: shown() == expected, timeout_s=10, what=f"{expected} in the log")
        control(client, "run.cancel", run_id, "cancel")
        wait_for(lambda: gone(int(second)), timeout_s=10, what="the second turn's command")
    header = piwf_cli(agent_server, "run", "logs", run_id).stdout.splitlines()[0]
    printed = sum(len(f"turn by pid {pid}\n") for pid in (first, second))
    on_stderr = sum(len(f"pid {pid} on stderr\n") for pid in (first, second))
    assert header == (
        f"== ask (visit 1, attempt 1) cancelled: stdout {printed} B, stderr {on_stderr} B =="
    )
