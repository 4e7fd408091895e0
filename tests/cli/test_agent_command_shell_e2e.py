"""``--agent-command`` and ``PIWF_AGENT_COMMAND`` run no shell: what a shell would have done
(a pipe, a redirect, ``NAME=value``, ``~``, ``$HOME``) is refused before anything starts,
with the fix, instead of reaching the program as literal text (docs/AGENTS.md).

Before, ``--agent-command 'python3 $HOME/agent.py'`` started a run whose agent failed three
turns with ``can't open file '.../$HOME/agent.py'`` (``missingSubmission``), ``'FOO=1 agent'``
failed ``agentCommand`` ('FOO=1' not found) and ``'agent | tee log'`` passed ``|`` and ``tee``
to the agent as arguments.
"""

from __future__ import annotations

import pytest

from tests.cli.test_cli_e2e import HELLO, Piwf, piwf  # noqa: F401 - a fixture used by name

REFUSED = [
    ("python3 $HOME/agent.py", "so $HOME would reach the program as it is written"),
    ("python3 ${HOME}/agent.py", "so $HOME would reach the program as it is written"),
    ('my-agent --prompt "$(cat)"', "so $(...) would reach the program as it is written"),
    ("FOO=1 my-agent", "(FOO=...): set it with env, as in 'env FOO=VALUE PROGRAM ARGS'"),
    ("~/bin/my-agent", "so '~' is not expanded: write the program's full path"),
    ("my-agent | tee log", "so '|' would reach the program as an argument"),
    ("my-agent 2>/dev/null", "so '2>/dev/null' would reach the program as an argument"),
    ("my-agent && echo done", "so '&&' would reach the program as an argument"),
]


@pytest.mark.parametrize(("command", "said"), REFUSED)
def test_shell_syntax_in_agent_command_is_a_usage_error(
    piwf: Piwf,  # noqa: F811
    command: str,
    said: str,
) -> None:
    text = piwf.run("run", "start", HELLO, "--agent-command", command)
    assert text.returncode == 2, text.stderr
    assert "no shell runs the agent command" in text.stderr
    assert said in text.stderr
    refused = piwf.json("run", "start", HELLO, "--agent-command", command, exit_code=2)
    assert refused["error"]["code"] == "usage"
    assert refused["error"]["message"].startswith("--agent-command: no shell runs")
    assert piwf.json("server", "status") == {"state": "stopped"}, "nothing was sent"


@pytest.mark.parametrize(
    "command",
    [
        "sh -c 'my-agent --prompt \"$(cat)\"'",  # docs/AGENTS.md: a shell, run explicitly
        "bash -lc 'my-agent $HOME'",
        'claude -p --mcp-config "$PIWF_MCP_CONFIG"',  # piwf replaces its own variables
        "my-agent ${PIWF_REQUEST_ID} '$5' 'x$' a=b",
        "env FOO=1 my-agent",
    ],
)
def test_what_a_shell_would_not_change_is_taken(piwf: Piwf, command: str) -> None:  # noqa: F811
    started = piwf.json(
        "run", "start", HELLO, "--input", '{"who": "x"}', "--agent-command", command
    )
    assert started["run"]["status"] == "queued"


def test_the_server_refuses_to_start_with_shell_syntax_in_its_agent_command(
    piwf: Piwf,  # noqa: F811
) -> None:
    piwf.env["PIWF_AGENT_COMMAND"] = "python3 $HOME/agent.py"
    refused = piwf.json("server", "start", exit_code=1)
    assert refused["error"]["code"] == "serverStart", refused
    assert "PIWF_AGENT_COMMAND: no shell runs the agent command" in refused["error"]["message"]
    del piwf.env["PIWF_AGENT_COMMAND"]
    assert piwf.json("server", "status") == {"state": "stopped"}
