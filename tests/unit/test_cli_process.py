"""tests/cli_process.py: a command run from the zygote gives what the installed script gives.

Each case runs once through the zygote and once by starting the script (``TESTS_PIWF_CLI=exec``)
and compares exit code, stdout and stderr. No server is needed: every command here answers
from the command line alone or from a state home with nothing running.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli_process import _read_at_start, run_piwf

CASES = (
    ("--version",),
    ("run", "--help"),
    ("run", "show"),  # a usage error: exit 2, on stderr
    ("no-such-command",),
    ("run", "list", "--limit", "0", "--json"),  # refused before anything is sent
    ("state", "verify", "missing.sqlite", "--json"),  # relative to the working directory
)


def both(
    args: tuple[str, ...], env: dict[str, str], monkeypatch: pytest.MonkeyPatch, **options: object
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    forked = run_piwf(args, env=env, **options)  # type: ignore[arg-type]
    with monkeypatch.context() as patch:
        patch.setenv("TESTS_PIWF_CLI", "exec")
        started = run_piwf(args, env=env, **options)  # type: ignore[arg-type]
    return forked, started


@pytest.mark.parametrize("args", CASES, ids=" ".join)
def test_a_forked_command_answers_as_the_started_script(
    args: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "PIWF_HOME": str(tmp_path / "home")}
    forked, started = both(args, env, monkeypatch, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        started.returncode,
        started.stdout,
        started.stderr,
    )
    assert not (tmp_path / "home" / "server").exists(), "none of these starts a server"


def test_standard_input_reaches_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``answer REQ -`` reads its value from stdin: an empty one is refused by name."""
    env = {**os.environ, "PIWF_HOME": str(tmp_path / "home")}
    args = ("answer", "req-1", "-", "--json")
    forked, started = both(args, env, monkeypatch, input="\n")
    assert forked.returncode == started.returncode == 2
    assert forked.stdout == started.stdout
    assert "stdin, which was empty" in forked.stdout


@pytest.mark.parametrize(
    ("change", "started"),
    [
        ({"PIWF_FAULTS": "cmd.after_parse@99=raise"}, True),  # read when piwf is imported
        ({"PYTHONHASHSEED": "7"}, True),  # read by Python at start
        ({"LANG": "C"}, True),
        ({"PIWF_HOME": "/tmp/elsewhere", "TZ": "Asia/Kolkata", "COLUMNS": "40"}, False),
    ],
)
def test_an_environment_read_at_start_runs_the_script(
    change: dict[str, str], started: bool
) -> None:
    zygote_env = {"PATH": "/usr/bin", "LANG": "C.UTF-8"}
    assert _read_at_start({**zygote_env, **change}, zygote_env) is started
    without = {name: value for name, value in zygote_env.items() if name != "LANG"}
    assert _read_at_start(without, zygote_env), "a variable removed counts as changed"
