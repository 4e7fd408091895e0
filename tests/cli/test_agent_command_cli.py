"""``piwf run start --agent-command`` and ``Client.start_run(agent_command=...)``: what is sent,
and what is refused before anything is sent (against the scripted fake server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.client.runs import start_payload
from piwf.errors import AgentCommandError
from tests.cli.test_cli import answer, invoke, one_json_document
from tests.client.fake_server import FakeServer

pytestmark = pytest.mark.usefixtures("no_server_start")


@pytest.fixture
def fake(short_home: Path) -> Iterator[FakeServer]:
    with FakeServer(short_home, answer) as server:
        yield server


def test_the_agent_command_is_split_like_a_shell_and_sent_as_argv(fake: FakeServer) -> None:
    command = """claude -p --mcp-config "$PIWF_MCP_CONFIG" --append 'two words'"""
    result = invoke("run", "start", "hello", "--agent-command", command, "--json")
    assert result.exit_code == 0, result.output
    assert one_json_document(result.stdout)["run"]["runId"] == "run-new"
    (_, request), *_ = fake.requests
    assert request.payload["agentCommand"] == [
        "claude",
        "-p",
        "--mcp-config",
        "$PIWF_MCP_CONFIG",
        "--append",
        "two words",
    ]


@pytest.mark.parametrize("text", ["", "   ", "claude 'unbalanced"])
def test_an_empty_or_unparsable_agent_command_is_a_usage_error(fake: FakeServer, text: str) -> None:
    result = invoke("run", "start", "hello", "--agent-command", text)
    assert result.exit_code == 2, result.output
    assert "--agent-command" in result.stderr
    assert fake.requests == []
    as_json = invoke("run", "start", "hello", "--agent-command", text, "--json")
    assert as_json.exit_code == 2
    assert one_json_document(as_json.stdout)["error"]["code"] == "usage"


@pytest.mark.parametrize("command", [[], "claude -p", [""], ["ok", 3], ["a\x00b"]])
def test_the_client_refuses_a_bad_agent_command_before_sending(command: object) -> None:
    with pytest.raises(AgentCommandError) as refused:
        start_payload(
            "hello",
            input=None,
            project=None,
            title=None,
            agent_command=command,  # type: ignore[arg-type]
        )
    assert refused.value.code == "agentCommand"


def test_without_an_agent_command_the_payload_names_none(fake: FakeServer) -> None:
    assert invoke("run", "start", "hello").exit_code == 0
    (_, request), *_ = fake.requests
    assert "agentCommand" not in request.payload
