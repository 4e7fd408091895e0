"""The examples ``--help`` gives, pasted by a new user, against a real server.

A new user has the README's ``hello`` workflow (``fixtures/workflows/hello.py``, which reads
``input["who"]``); each help example that starts ``./flows/hello.py`` must complete with it, and
each example that names a request must name it as piwf prints request ids.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from piwf.cli import cli
from tests.cli.test_cli_e2e import COMMAND_TIMEOUT_S, REPO, Piwf, piwf  # noqa: F401
from tests.cli_process import run_piwf


def help_texts(
    command: click.Command, path: str = "piwf", parent: click.Context | None = None
) -> Iterator[tuple[str, str]]:
    """Every command's path and its --help text, the group's own included. Each context is
    made as click makes it (the command's settings, its parent's): click keeps the help option
    it first builds on the command, so a context without ``-h`` would change later listings."""
    context = click.Context(command, info_name=path, parent=parent, **command.context_settings)
    yield path, command.get_help(context)
    if isinstance(command, click.Group):
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None
            yield from help_texts(sub, f"{path} {name}", context)


def examples() -> list[tuple[str, str]]:
    """(command path, example line) for every line of every help's Example section."""
    found = []
    for path, text in help_texts(cli):
        section = text.split("Example:", 1)[1].split("Options:", 1)[0]
        found += [(path, line.strip()) for line in section.splitlines() if line.strip()]
    return found


HELLO_EXAMPLES = sorted(
    {line for _, line in examples() if line.startswith("piwf run start ./flows/hello.py")}
)


def test_the_help_has_hello_examples() -> None:
    assert len(HELLO_EXAMPLES) >= 2, HELLO_EXAMPLES


@pytest.mark.parametrize("example", HELLO_EXAMPLES)
def test_a_hello_example_completes_with_the_readme_hello(
    piwf: Piwf,  # noqa: F811 (the fixture)
    tmp_path: Path,
    example: str,
) -> None:
    (tmp_path / "flows").mkdir()
    shutil.copy(REPO / "fixtures" / "workflows" / "hello.py", tmp_path / "flows" / "hello.py")
    argv = shlex.split(example)[1:]
    if "--wait" not in argv:
        argv.append("--wait")
    result = run_piwf([*argv, "--json"], env=piwf.env, cwd=tmp_path, timeout=COMMAND_TIMEOUT_S)
    assert result.returncode == 0, (example, result.stdout, result.stderr)
    assert json.loads(result.stdout)["output"] == {"shouted": "HELLO ADA"}


def test_request_ids_in_help_examples_are_written_as_piwf_prints_them() -> None:
    """``piwf requests`` prints ``request-…`` ids; an example with another form, pasted, is an
    unknown request whose error cannot say what kind of id it was given."""
    named = [
        (path, line)
        for path, line in examples()
        if re.search(r"piwf (answer|submit|update|mcp --request) ", line)
    ]
    assert named
    wrong = [
        (path, line)
        for path, line in named
        if not re.search(r"piwf (answer|submit|update|mcp --request) request-", line)
    ]
    assert wrong == []
