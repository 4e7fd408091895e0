"""The pure parts of the runner's agent driver (``piwf.runner.agent_command``)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from piwf.errors import RunCommandError
from piwf.protocol.runner_v1 import AgentRequestState, Launch, TurnStarted
from piwf.runner import agent_command
from piwf.runner.agent_command import (
    agent_environment,
    choose_command,
    expand_arguments,
    turn_prompt,
    write_mcp_config,
)
from piwf.workflow.agent_driver import AgentTurn

TURN = AgentTurn("run-1", "request-1", "ask", 1, 1, None, "local prompt")


def launch(**fields: object) -> Launch:
    return Launch.model_validate(
        {
            "runId": "run-1",
            "generation": 1,
            "runnerEpoch": "runner-1",
            "serverEpoch": 1,
            "workflowSource": {},
            "definitionDigest": "0" * 64,
            **fields,
        }
    )


def test_the_run_beats_the_node_which_beats_the_server() -> None:
    everything = launch(runAgentCommand=["run"], serverAgentCommand=["server"])
    assert choose_command(everything, ("node",)) == ["run"]
    assert choose_command(launch(serverAgentCommand=["server"]), ("node",)) == ["node"]
    assert choose_command(launch(serverAgentCommand=["server"]), None) == ["server"]
    assert choose_command(launch(), None) is None
    interactive = launch(runAgentCommand=["run"], executionMode="interactive")
    assert choose_command(interactive, ("node",)) is None


def test_the_environment_drops_every_piwf_variable_and_adds_three() -> None:
    base = {"PATH": "/bin", "PIWF_FAULTS": "x", "PIWF_HOME": "/old", "PIWF_TOKEN": "t"}
    environment = agent_environment(base, request_id="r", home="/h", mcp_config="/c/mcp.json")
    assert environment == {
        "PATH": "/bin",
        "PIWF_REQUEST_ID": "r",
        "PIWF_HOME": "/h",
        "PIWF_MCP_CONFIG": "/c/mcp.json",
    }


def test_only_the_three_piwf_variables_are_substituted_in_arguments() -> None:
    environment = {"PIWF_REQUEST_ID": "r-1", "PIWF_MCP_CONFIG": "/c.json", "PIWF_HOME": "/h"}
    command = [
        "a",
        "$PIWF_MCP_CONFIG",
        "--id=${PIWF_REQUEST_ID}",
        "$PIWF_HOMEX",
        "$HOME",
        "$PIWF_HOME/x",
    ]
    assert expand_arguments(command, environment) == [
        "a",
        "/c.json",
        "--id=r-1",
        "$PIWF_HOMEX",
        "$HOME",
        "/h/x",
    ]


def test_the_mcp_config_is_private_and_names_its_request(tmp_path: Path) -> None:
    path = write_mcp_config(tmp_path, request_id="request-1", home="/h")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    server = json.loads(path.read_text(encoding="utf-8"))["mcpServers"]["piwf"]
    assert server["args"] == ["-m", "piwf", "mcp", "--request", "request-1"]
    assert server["env"] == {"PIWF_HOME": "/h"}


def started(unproductive: int, rejection: str | None = None) -> TurnStarted:
    state = AgentRequestState(status="pending", rejection=rejection)
    return TurnStarted(
        turn=unproductive + 1, unproductiveTurns=unproductive, prompt="P", request=state
    )


def test_reminders_carry_their_number_and_the_latest_rejection() -> None:
    assert turn_prompt(started(0), TURN) == "P"
    first = turn_prompt(started(1), TURN).splitlines()
    assert first[0] == "P" and first[2].startswith("Reminder 1 of 2: ")
    assert "No submission was received." in first[2] and "request-1" in first[2]
    second = turn_prompt(started(2, "summary must not be empty"), TURN)
    assert "Reminder 2 of 2: " in second
    assert "Your last submission was rejected: summary must not be empty" in second
    empty = TurnStarted(turn=1, unproductiveTurns=0, prompt="", request=started(0).request)
    assert turn_prompt(empty, TURN) == "local prompt"


def test_a_runner_being_stopped_starts_no_further_agent_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lifeline ends a stopped runner's agent first; the turn loop must not answer that by
    starting the command again (seen as a second agent process at an active-time deadline)."""
    marker = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    monkeypatch.setattr(agent_command, "_STOPPING_WAIT_S", 0.0)
    driver = agent_command.CommandDriver(
        None,  # type: ignore[arg-type]  # never reached: no turn starts
        launch(runAgentCommand=command),
        end_descendants=lambda: None,
        stopping=lambda: True,
    )
    with pytest.raises(RunCommandError, match="being stopped"):
        driver.drive(TURN)
    assert not marker.exists()
