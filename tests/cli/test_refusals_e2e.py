"""A refused value is named back safely, through the installed script: quoted, its control
characters escaped (a terminal escape typed into an argument never reaches the terminal raw)
and, when long, cut to 80 characters (a pasted payload is not repeated whole), with the
exit-code protocol kept (2 for a usage error, 1 for a server's refusal) and one JSON document
with ``--json``. A path of a usual length is named whole (tests/cli/test_state_files.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 - a fixture used by name

#: An OSC sequence (sets the terminal's title), a colour and a line break.
ESCAPES = "\x1b]0;pwned\x07\x1b[31mred\nline"
ESCAPES_SHOWN = "'\\x1b]0;pwned\\x07\\x1b[31mred\\nline'"
LONG = "a" * 10_000
LONG_SHOWN = "'" + "a" * 77 + "...'"


def refused(cli: Piwf, *args: str, exit_code: int) -> tuple[str, dict[str, Any]]:
    """Run a command that must be refused: its human error (stderr) and its JSON error."""
    human = cli.run(*args)
    assert human.returncode == exit_code, (human.stdout, human.stderr)
    assert human.stdout == "", human.stdout
    assert "\x1b" not in human.stderr and "\x07" not in human.stderr, repr(human.stderr)
    document = cli.json(*args, exit_code=exit_code)
    return human.stderr, document["error"]


#: A usage error that names the value it refused: its arguments before the value, and what
#: the error says before the value is shown.
USAGE_REFUSALS = {
    "run show RUN_ID": (["run", "show"], "Invalid value for 'RUN_ID': "),
    "run start --session": (
        ["run", "start", "hello", "--session"],
        "Invalid value for '--session': ",
    ),
    "session show SESSION_ID": (["session", "show"], "Invalid value for 'SESSION_ID': "),
    "session capture RUN_ID": (["session", "capture"], "Invalid value for 'RUN_ID': "),
    "answer REQUEST_ID": (["answer"], "Invalid value for 'REQUEST_ID': "),
    "mcp --request": (["mcp", "--request"], "Invalid value for '--request': "),
    "run list --status": (["run", "list", "--status"], "Invalid value for '--status': "),
    "run list --limit": (["run", "list", "--limit"], "Invalid value for '--limit': "),
    "run wait --timeout": (["run", "wait", "run-0a", "--timeout"], "'--timeout': "),
    "run start --input-file": (
        ["run", "start", "hello", "--input-file"],
        "Invalid value for '--input-file': ",
    ),
    "run settings --patch-file": (
        ["run", "settings", "run-0a", "--patch-file"],
        "Invalid value for '--patch-file': ",
    ),
    "resource apply --spec-file": (
        ["resource", "apply", "greeting", "k", "--spec-file"],
        "Invalid value for '--spec-file': ",
    ),
    "workflows list --project": (
        ["workflows", "list", "--project"],
        "Invalid value for '--project': Directory ",
    ),
    "state verify BACKUP": (["state", "verify"], "Invalid value for '[BACKUP]': File "),
}


@pytest.mark.parametrize(("args", "lead"), list(USAGE_REFUSALS.values()), ids=list(USAGE_REFUSALS))
def test_a_usage_error_names_the_value_given_escaped_and_cut(
    piwf: Piwf,  # noqa: F811
    args: list[str],
    lead: str,
) -> None:
    for value, shown in ((ESCAPES, ESCAPES_SHOWN), (LONG, LONG_SHOWN)):
        # The ids and the session after them: the value given at the end, or before the
        # arguments a command needs after it.
        tail = ["{}"] if args == ["answer"] else []
        human, error = refused(piwf, *args, value, *tail, exit_code=2)
        assert error["code"] == "usage", error
        assert f"{lead}{shown}" in error["message"], error
        assert f"{lead}{shown}" in human, human
        assert len(human) < 1000, human
    assert piwf.json("server", "status") == {"state": "stopped"}, "a usage error reached a server"


HELLO = "fixtures/workflows/hello.py"

#: A server's refusal of a value it does not repeat: the arguments after the run id, what the
#: error is led by (the value named, escaped) and what the server says after it.
NAMED_REFUSALS = {
    "run logs --node": (
        ["logs", "{run}", "--node", "gr\x1b[2Jeet"],
        "node 'gr\\x1b[2Jeet': ",
        "run {run} has no node of that name; its nodes: greet, shout",
    ),
    "run logs --node --follow": (
        ["logs", "{run}", "--node", "nowhere", "--follow"],
        "node 'nowhere': ",
        "run {run} has no node of that name; its nodes: greet, shout",
    ),
    "run settings --mount": (
        ["settings", "{run}", "--mount", "sub\x1b[2J"],
        "settings of mount 'sub\\x1b[2J': ",
        "the run's workflow mounts no workflow at that path (it mounts none)",
    ),
}


@pytest.mark.parametrize(
    ("args", "lead", "says"), list(NAMED_REFUSALS.values()), ids=list(NAMED_REFUSALS)
)
def test_a_refusal_of_the_server_names_the_value_given(
    piwf: Piwf,  # noqa: F811
    args: list[str],
    lead: str,
    says: str,
) -> None:
    started = piwf.json("run", "start", HELLO, "--input", '{"who": "x"}', "--wait")
    run_id = started["run"]["runId"]
    command = ["run", *(part.format(run=run_id) for part in args)]
    human, error = refused(piwf, *command, exit_code=1)
    assert error["message"].startswith(lead + says.format(run=run_id)), error
    assert human.startswith(f"Error: {lead}{says.format(run=run_id)}"), human
