"""The CLI's contract (docs/CLI.md) where outside testers found it broken: with ``--json`` one
JSON document, exit 0 ok, 1 runtime error, 2 usage error, and errors that say what to do next.

The installed script runs against a private ``PIWF_HOME`` (the fixture of
tests/cli/test_cli_e2e.py, which reaps every process of that home).
"""

from __future__ import annotations

from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 - a fixture used by name


def test_effect_resolve_takes_exactly_one_of_applied_and_retry(piwf: Piwf) -> None:  # noqa: F811
    for flags in (["--applied", "--retry"], ["--retry", "--applied"], []):
        refused = piwf.json("effect", "resolve", "effect-3f2a", *flags, exit_code=2)
        assert refused["error"]["code"] == "usage"
        assert "exactly one of --applied" in refused["error"]["message"]
    assert piwf.json("server", "status") == {"state": "stopped"}, "a usage error starts nothing"
