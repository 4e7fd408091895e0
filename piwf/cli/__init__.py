"""The ``piwf`` command line: parse, call the library, render; nothing else lives here.

Exit codes are a protocol: 0 success, 1 runtime error, 2 usage error. Every command accepts
``--json`` and then prints exactly one JSON document on standard output, errors included::

    piwf run show nope --json      -> {"error":{"code":"notFound","message":"..."}}   exit 1
    piwf run show --json           -> {"error":{"code":"usage","message":"..."}}      exit 2

Commands live in :mod:`.server`, :mod:`.runs`, :mod:`.state`, :mod:`.effects`,
:mod:`.requests`, :mod:`.resources`, :mod:`.mcp` and :mod:`.view`; output in :mod:`.render`;
the shared flag, error handling and client in :mod:`.common`. docs/CLI.md documents each one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from piwf._version import __version__
from piwf.cli import render

_JSON_REQUESTED = "piwf.json"


class PiwfGroup(click.Group):
    """The top-level group: with ``--json`` anywhere in the arguments, a usage error is also
    reported as one JSON document on stdout (exit status 2 either way)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        wants_json = "--json" in args
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.UsageError as error:
            if wants_json:
                _usage_error_as_json(error)
            raise
        ctx.meta[_JSON_REQUESTED] = wants_json
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as error:
            if ctx.meta.get(_JSON_REQUESTED):
                _usage_error_as_json(error)
            raise


def _usage_error_as_json(error: click.UsageError) -> None:
    render.emit_json({"error": {"code": "usage", "message": error.format_message()}})
    raise click.exceptions.Exit(error.exit_code)


@click.group(cls=PiwfGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="piwf", message="%(prog)s %(version)s")
def cli() -> None:
    """piwf: a local, crash-safe workflow server for Python.

    State lives in $PIWF_HOME (default ~/.piwf). Every command accepts --json. Exit codes:
    0 success, 1 runtime error, 2 usage error.

    \b
    Example:
      piwf run start ./flows/hello.py --wait
    """


def _register() -> None:
    # Imported here: the command modules import this package's siblings while it initialises.
    from piwf.cli import (
        attach,  # noqa: F401 - registers `piwf session attach`
        logs,  # noqa: F401 - registers `piwf run logs` on the run group
    )
    from piwf.cli.effects import effect_group
    from piwf.cli.mcp import mcp_command
    from piwf.cli.requests import answer_command, requests_command, submit_command, update_command
    from piwf.cli.resources import resource_group
    from piwf.cli.runs import run_group
    from piwf.cli.server import server_group
    from piwf.cli.sessions import session_group
    from piwf.cli.state import state_group
    from piwf.cli.view import view_command

    for group in (
        server_group,
        run_group,
        state_group,
        effect_group,
        resource_group,
        session_group,
    ):
        cli.add_command(group)
    cli.add_command(requests_command)
    cli.add_command(answer_command)
    cli.add_command(mcp_command)
    cli.add_command(submit_command)
    cli.add_command(update_command)
    cli.add_command(view_command)


_register()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``piwf`` console script."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="piwf")
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)
