"""Numbers on the command line are read as the ``PIWF_*`` variables read them, through the
installed script: plain ASCII digits, no digit separators. Python's ``int`` and ``float`` also
take ``1_0`` and ``\u0661\u0660``; ``server start --max-workers 1_0`` started a server with
10 slots while ``PIWF_MAX_WORKERS=1_0`` was refused."""

from __future__ import annotations

import click
import pytest

from piwf.cli.common import Integer, Seconds
from tests.cli.test_cli import COMMANDS
from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 (the fixture)

#: What ``int`` or ``float`` would read as a number and no other tool would.
NOT_PLAIN = ["1_0", "\u0661\u0660", "1\u0660"]


@pytest.mark.parametrize(
    "args",
    [
        ("server", "start", "--max-workers"),
        ("server", "start", "--idle-exit"),
        ("server", "run", "--max-workers"),
        ("run", "list", "--limit"),
        ("run", "wait", "run-0123456789", "--timeout"),
    ],
)
def test_a_number_python_alone_would_read_is_a_usage_error(
    piwf: Piwf,  # noqa: F811
    args: tuple[str, ...],
) -> None:
    for number in NOT_PLAIN:
        result = piwf.run(*args, number)
        assert result.returncode == 2, (args, number, result.stdout, result.stderr)
        assert f"Invalid value for '{args[-1]}'" in result.stderr, result.stderr
        assert "ASCII digits" in result.stderr, result.stderr
    assert piwf.json("server", "status") == {"state": "stopped"}


def test_an_integer_out_of_range_says_what_the_option_takes(
    piwf: Piwf,  # noqa: F811
) -> None:
    result = piwf.run("server", "start", "--max-workers", "0")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert (
        "'--max-workers': '0' is not an integer from 1 to 9007199254740991 written in ASCII"
        " digits without separators" in result.stderr
    ), result.stderr
    result = piwf.run("run", "settings", "run-0123456789", "--patch", "[]", "--expect", "9" * 20)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "'--expect'" in result.stderr and "to 9007199254740991" in result.stderr
    assert piwf.json("server", "status") == {"state": "stopped"}


def test_a_plain_number_still_starts_the_server(piwf: Piwf) -> None:  # noqa: F811
    assert piwf.json("server", "start", "--max-workers", "2", "--idle-exit", "30")["started"]
    assert piwf.json("server", "status")["maxWorkers"] == 2


def test_every_numeric_option_of_the_cli_reads_plain_numbers_only() -> None:
    """Every option that takes an integer or seconds, found by walking the command tree, has a
    type that refuses what only Python would read."""
    found = []
    for path, command in COMMANDS.items():
        for param in command.params:
            if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
                found.append(f"{path} {param.name}")
                assert isinstance(param.type, (Integer, Seconds)), f"{path} {param.name}"
                for number in NOT_PLAIN:
                    with pytest.raises(click.BadParameter):
                        param.type.convert(number, param, None)
    assert len(found) >= 9, found


def test_a_server_refuses_more_spare_runners_than_it_may_start(
    piwf: Piwf,  # noqa: F811
) -> None:
    """``PIWF_SPARE_RUNNERS=100000`` (with as many slots) forked a hundred thousand idle
    runners at start."""
    piwf.env.update(PIWF_SPARE_RUNNERS="100000", PIWF_MAX_WORKERS="100000")
    result = piwf.run("server", "start")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "PIWF_SPARE_RUNNERS must be an integer of at least 0 and at most 32" in result.stderr
    assert piwf.json("server", "status") == {"state": "stopped"}
