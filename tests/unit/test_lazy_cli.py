"""The CLI loads a command's module only when that command runs or shows its own help.

Each check runs the CLI's ``main`` in a fresh interpreter (``python -c``) and reads what that
interpreter imported, so an eager import added anywhere on the way (``piwf.cli``, the
package's ``__init__``, a module they import) fails here. What the commands do is tested in
tests/cli; this file is only about what gets imported and that the lazy listing is faithful,
and that the protocol models, whose validators are now built on first use, all build and
build correctly when many threads use one first at the same moment.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from piwf._version import __version__
from piwf.cli import COMMANDS, cli

#: The piwf modules ``piwf --version`` and ``piwf --help`` may import: the package (with its
#: error classes, one module per branch of the tree), the version and the group. Nothing of the
#: client, the protocol or a command.
ERROR_MODULES = ["base", "commands", "connection", "reads", "state", "workflow"]
LIGHT = [
    "piwf",
    "piwf._version",
    "piwf.cli",
    "piwf.cli.collector",
    "piwf.errors",
    *(f"piwf.errors.{name}" for name in ERROR_MODULES),
]
#: Third-party packages that only a command's own module may bring in.
HEAVY_PACKAGES = ("pydantic", "pydantic_core", "tenacity", "textual", "mcp")

#: Runs ``main`` with the arguments in argv[1] (JSON), then writes to the file argv[3] the exit
#: status and the piwf modules and heavy packages (argv[2]) the interpreter had imported by then.
PROBE = """
import json, sys
from piwf.cli import main
status = 0
try:
    main(json.loads(sys.argv[1]))
except SystemExit as exit:
    status = exit.code or 0
heavy = tuple(json.loads(sys.argv[2]))
found = {
    "status": status,
    "piwf": sorted(name for name in sys.modules if name == "piwf" or name.startswith("piwf.")),
    "heavy": sorted(name for name in sys.modules if name.split(".")[0] in heavy),
}
with open(sys.argv[3], "w") as report:
    report.write(json.dumps(found))
"""


def probe(arguments: list[str], home: Path, columns: int = 80) -> tuple[dict[str, Any], str]:
    """Run ``main(arguments)`` in a new interpreter; return what it imported and its stdout."""
    environment = {**os.environ, "PIWF_HOME": str(home / "home"), "COLUMNS": str(columns)}
    return run_probe(arguments, HEAVY_PACKAGES, home / "imported.json", environment)


def run_probe(
    arguments: list[str],
    heavy: Sequence[str],
    report: Path,
    environment: dict[str, str] | None = None,
) -> tuple[dict[str, Any], str]:
    """Run :data:`PROBE` with ``arguments`` and ``heavy`` in a new interpreter (``environment``,
    else this one's); return its report and its stdout."""
    report.unlink(missing_ok=True)
    finished = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(arguments), json.dumps(list(heavy)), str(report)],
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert report.exists(), f"the probe reported nothing: {finished.stderr[-2000:]}"
    return json.loads(report.read_text()), finished.stdout


def help_width(columns: int) -> int:
    """The width click formats help at when the terminal is ``columns`` wide (at most 80)."""
    return max(min(columns, 80) - 2, 50)


@pytest.mark.parametrize(
    "flag", ["--version", "--version --json", "--json --version", "--help", "-h"]
)
def test_version_and_help_import_no_command_module_client_or_protocol(
    flag: str, tmp_path: Path
) -> None:
    found, stdout = probe(flag.split(), tmp_path)
    assert found["status"] == 0
    assert found["piwf"] == LIGHT, "an eager import came back into piwf --version / --help"
    assert found["heavy"] == []
    if flag == "--version":
        assert stdout == f"piwf {__version__}\n"
    elif "--version" in flag:
        assert stdout == f'{{"version":"{__version__}"}}\n'
    else:
        listed = [line.split()[0] for line in stdout.split("Commands:\n")[1].splitlines()]
        assert listed == sorted(COMMANDS)


def test_a_command_imports_its_module_and_only_then(tmp_path: Path) -> None:
    # The other side of the check above: the probe does see a command's imports.
    found, stdout = probe(["run", "--help"], tmp_path)
    assert found["status"] == 0
    assert {"piwf.cli.runs", "piwf.cli.logs"} <= set(found["piwf"])
    assert "logs" in stdout.split("Commands:\n")[1]  # the module that adds it was loaded too
    assert "piwf.cli.resources" not in found["piwf"]  # another command's module was not
    # The run commands' help needs neither the client nor pydantic (run list's quick path
    # relies on that); a module that uses the payload models brings pydantic in.
    assert "piwf.client.client" not in found["piwf"]
    assert found["heavy"] == []
    workflows, _ = probe(["workflows", "--help"], tmp_path)
    assert workflows["status"] == 0
    assert "piwf.cli.workflows" in workflows["piwf"]
    assert "pydantic" in workflows["heavy"]


@pytest.mark.parametrize("columns", [50, 64, 80, 200])
def test_the_listing_is_the_same_before_and_after_every_command_loads(
    columns: int, tmp_path: Path
) -> None:
    lazy, lazy_help = probe(["--help"], tmp_path, columns)
    assert lazy["piwf"] == LIGHT
    # The same listing, with each command's real help: load every command first.
    context = click.Context(cli)
    for name in COMMANDS:
        assert cli.get_command(context, name) is not None
    loaded = CliRunner().invoke(
        cli, ["--help"], prog_name="piwf", terminal_width=help_width(columns)
    )
    assert loaded.exit_code == 0
    assert lazy_help == loaded.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_summary_is_the_first_paragraph_of_the_commands_help(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None and command.name == name
    assert command.help is not None
    assert COMMANDS[name].summary == command.help.partition("\n\n")[0]
    # The listing shortens a stand-in's help; a short_help, hidden or deprecated flag on the
    # real command would list differently.
    assert command.short_help is None and not command.hidden and not command.deprecated


@pytest.mark.parametrize(
    "arguments",
    [["run", "show", "--json"], ["run", "list", "--limit", "0", "--json"], ["nosuch", "--json"]],
    ids=["missing-argument", "bad-option-value", "unknown-command"],
)
def test_a_usage_error_of_a_lazily_loaded_command_is_one_json_document(
    arguments: list[str], tmp_path: Path
) -> None:
    found, stdout = probe(arguments, tmp_path)
    assert found["status"] == 2
    assert stdout.count("\n") == 1
    document = json.loads(stdout)
    assert document["error"]["code"] == "usage"
    assert document["error"]["message"]


# The protocol models build their validators on first use (defer_build) -------------------

#: The modules of wire models that the client and the server share.
WIRE_MODULES = (
    "piwf.protocol.client_v1",
    "piwf.protocol.payloads",
    "piwf.protocol.log_payloads",
    "piwf.protocol.resource_payloads",
    "piwf.protocol.state_payloads",
    "piwf.protocol.view_payloads",
)


def wire_models() -> list[type[Any]]:
    """Every wire model class of :data:`WIRE_MODULES` (all of them derive from two bases)."""
    for name in WIRE_MODULES:
        importlib.import_module(name)
    from piwf.protocol import client_v1, payloads

    def below(base: type[Any]) -> list[type[Any]]:
        return [found for sub in base.__subclasses__() for found in (sub, *below(sub))]

    return [*below(payloads.WireModel), *below(client_v1._WireModel)]


def test_every_deferred_wire_model_builds() -> None:
    # A broken field would otherwise surface only when a process first used the model.
    models = wire_models()
    assert len(models) > 80
    for model in models:
        model.model_rebuild(raise_errors=True)
        assert model.__pydantic_complete__, model.__name__


#: In a fresh interpreter (nothing built yet), 16 threads validate the same models at once, a
#: valid value and one with an unknown field each; prints each thread's findings.
CONCURRENT_FIRST_USE = """
import json, threading
from piwf.protocol.client_v1 import parse_server_message
from piwf.protocol.payloads import RunCursor, RunPage
start = threading.Barrier(16)
found = []
def use():
    start.wait()
    page = RunPage.model_validate({"runs": [], "nextCursor": {"createdAt": 1, "runId": "r-1"}})
    try:
        RunCursor.model_validate({"createdAt": 1, "runId": "r-1", "extra": 1})
        refused = False
    except ValueError:
        refused = True
    frame = b'{"outcome":"accepted","requestId":"q-1","schema":"piwf.client.v1","type":"response"}'
    found.append([page.next_cursor.run_id, refused, parse_server_message(frame).outcome])
threads = [threading.Thread(target=use) for _ in range(16)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(60)
print(json.dumps(found))
"""


def test_first_use_from_many_threads_at_once_validates_with_each_models_own_fields() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", CONCURRENT_FIRST_USE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(finished.stdout) == [["r-1", True, "accepted"]] * 16
