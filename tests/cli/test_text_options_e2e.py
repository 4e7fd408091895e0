"""A text the client refuses is named as the option it was typed in, through the installed
script: ``effect resolve --note`` with 1001 characters said ``note: ...`` (the Python
argument's name), which no command line has."""

from __future__ import annotations

import pytest

from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("effect", "resolve", "effect-1", "--applied", "--note", "n" * 1001),
            "invalid value for '--note': String should have at most 1000 characters",
        ),
        (
            ("run", "start", "noop", "--title", "t" * 513),
            "invalid value for '--title': String should have at most 512 characters",
        ),
        (
            ("run", "start", "noop", "--title", ""),
            "invalid value for '--title': String should have at least 1 character",
        ),
        (
            ("run", "logs", "run-0123456789", "--node", "x" * 1025),
            "invalid value for '--node': String should have at most 1024 characters",
        ),
        (
            ("resource", "apply", "No", "k", "--spec", "{}"),
            "invalid value for 'MANAGER': a resource manager's name",
        ),
    ],
)
def test_a_refused_text_names_the_option_and_the_limit(
    piwf: Piwf,  # noqa: F811
    args: tuple[str, ...],
    said: str,
) -> None:
    result = piwf.run(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert said in result.stderr, result.stderr
    document = piwf.json(*args, exit_code=2)
    assert document["error"]["code"] == "usage"
    assert said in document["error"]["message"]
    assert piwf.json("server", "status") == {"state": "stopped"}
