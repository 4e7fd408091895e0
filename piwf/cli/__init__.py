"""The ``piwf`` command line: parse, call the library, render; nothing else lives here.

Exit codes are a protocol: 0 success, 1 runtime error, 2 usage error. Every command accepts
``--json`` and then prints exactly one JSON document on standard output, errors included::

    piwf run show nope --json      -> {"error":{"code":"notFound","message":"..."}}   exit 1
    piwf run show --json           -> {"error":{"code":"usage","message":"..."}}      exit 2

Commands live in :mod:`.server`, :mod:`.runs`, :mod:`.state`, :mod:`.effects`, :mod:`.channels`,
:mod:`.requests`, :mod:`.resources`, :mod:`.sessions` (and :mod:`.attach`), :mod:`.workflows`,
:mod:`.mcp`, :mod:`.relay` and :mod:`.view`; output in :mod:`.render`;
the shared flag, error handling and client in :mod:`.common`. docs/CLI.md documents each one.

A command's module is imported only when that command runs or shows its own help
(:data:`COMMANDS`): ``piwf --version`` and ``piwf --help`` import click and the version, not
the client or the protocol models, so they answer in about the time Python and click take to
start.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click

from piwf._version import __version__
from piwf.cli.collector import collector_paused

_JSON_REQUESTED = "piwf.json"
_ARGUMENTS = "piwf.arguments"
#: A refused argument up to this long is named whole in an error (escaped); a longer one (a
#: pasted payload) is cut.
_NAMED_WHOLE_CHARS = 512


@dataclass(frozen=True)
class LazyCommand:
    """Where a top-level command is defined, and what ``piwf --help`` lists for it.

    ``summary`` is the first paragraph of the command's help, word for word: the group's help
    shortens it exactly as click shortens the real command's help, so the listing is the same
    whether or not the module has been imported (tests/unit/test_lazy_cli.py checks both).
    """

    module: str
    attribute: str
    summary: str

    def load(self) -> click.Command:
        """Import the module (without the garbage collector's passes) and return the command
        it defines."""
        with collector_paused():
            found = getattr(importlib.import_module(self.module), self.attribute)
        if not isinstance(found, click.Command):
            raise TypeError(f"{self.module}.{self.attribute} is not a click command")
        return found


#: Every top-level command, one line each: name -> module, attribute, summary. Only
#: ``piwf.cli`` modules (tests/unit/test_import_rules.py checks the imports of each).
COMMANDS: dict[str, LazyCommand] = {
    "answer": LazyCommand(
        "piwf.cli.requests",
        "answer_command",
        "Answer one exact pending request as a person (decision.answer).",
    ),
    "channel": LazyCommand(
        "piwf.cli.channels",
        "channel_group",
        "Deliver protected decisions through channel adapters (Telegram).",
    ),
    "effect": LazyCommand(
        "piwf.cli.effects",
        "effect_group",
        "Resolve managed effects that piwf could not prove applied or not.",
    ),
    "mcp": LazyCommand(
        "piwf.cli.mcp",
        "mcp_command",
        "Serve the workflow tool to an MCP client over stdio (extra: piwf[mcp]).",
    ),
    "relay": LazyCommand(
        "piwf.cli.relay",
        "relay_command",
        "Relay the client protocol over a loopback WebSocket (extra: piwf[relay]).",
    ),
    "requests": LazyCommand(
        "piwf.cli.requests",
        "requests_command",
        "List pending checkpoints, decisions and agent requests, oldest first.",
    ),
    "resource": LazyCommand(
        "piwf.cli.resources",
        "resource_group",
        "Apply, inspect, reconcile and delete managed resources.",
    ),
    # piwf.cli.settings adds `piwf run settings` to the run group of piwf.cli.logs, which adds
    # `piwf run logs` to the one it imports from piwf.cli.runs.
    "run": LazyCommand(
        "piwf.cli.settings", "run_group", "Start, list, inspect, wait for and cancel workflow runs."
    ),
    "server": LazyCommand(
        "piwf.cli.server", "server_group", "Start, stop and inspect the piwf server of $PIWF_HOME."
    ),
    # piwf.cli.attach adds `piwf session attach` to the group it imports from piwf.cli.sessions.
    "session": LazyCommand(
        "piwf.cli.attach",
        "session_group",
        "Origin sessions: attach as one, list them, show their messages and capture.",
    ),
    "state": LazyCommand(
        "piwf.cli.state",
        "state_group",
        "Inspect, verify, back up and restore the state database of $PIWF_HOME.",
    ),
    "submit": LazyCommand(
        "piwf.cli.requests",
        "submit_command",
        "Submit an agent step's output for one exact request and wait for its validation.",
    ),
    "update": LazyCommand(
        "piwf.cli.requests",
        "update_command",
        "Record a progress update on an agent request without completing it.",
    ),
    "view": LazyCommand(
        "piwf.cli.view", "view_command", "Watch runs live in the terminal (extra: piwf[view])."
    ),
    "workflows": LazyCommand(
        "piwf.cli.workflows",
        "workflows_group",
        "List the workflows run start finds by name, and show one's nodes and input.",
    ),
}


class PiwfGroup(click.Group):
    """The top-level group: its commands load on first use (:data:`COMMANDS`), and with
    ``--json`` anywhere in the arguments, a usage error is also reported as one JSON document
    on stdout (exit status 2 either way)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.add_command(COMMANDS[cmd_name].load(), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands as click does, from each summary: nothing is imported."""
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            loaded = self.commands.get(name)
            if loaded is None:
                loaded = click.Command(name, help=COMMANDS[name].summary)
            if not loaded.hidden:
                rows.append((name, loaded))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        wants_json = "--json" in args
        if parent is None and sorted(args) == ["--json", "--version"]:
            _version_as_json()
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.UsageError as refused:
            error = _naming_arguments_safely(refused, args)
            if wants_json:
                _usage_error_as_json(error)
            raise error from None
        ctx.meta[_JSON_REQUESTED] = wants_json
        ctx.meta[_ARGUMENTS] = list(args)
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as refused:
            error = _naming_arguments_safely(refused, ctx.meta.get(_ARGUMENTS, []))
            if ctx.meta.get(_JSON_REQUESTED):
                _usage_error_as_json(error)
            raise error from None


def _naming_arguments_safely(error: click.UsageError, args: Sequence[str]) -> click.UsageError:
    """``error`` with a message safe to print: each argument of ``args`` that it repeats (click
    quotes the value an option refused, and repeats raw the name of a file it could not open)
    shown with its control characters escaped (and, past ``_NAMED_WHOLE_CHARS``, cut as
    :func:`piwf.cli.safe_text.given` cuts a value), and any other control character escaped;
    so a path is named whole, a pasted payload is not repeated whole, and a terminal escape
    typed into an argument cannot drive the terminal."""
    from piwf.cli.safe_text import given, one_line, printable

    message = error.format_message()
    values = {*args, *(arg.partition("=")[2] for arg in args if arg.startswith("--"))}
    for value in sorted(values, key=len, reverse=True):
        # A path (or any value of a usual length) is named whole, escaped; a longer one is cut.
        shown = given(value)[1:-1] if len(value) > _NAMED_WHOLE_CHARS else one_line(value)
        if value and shown != value:
            for form in (repr(value)[1:-1], value):
                message = message.replace(form, shown)
    return click.UsageError(printable(message), ctx=error.ctx)


def _version_as_json() -> None:
    """``piwf --version --json``: print ``{"version": "X.Y.Z"}`` and exit 0."""
    import json  # canonical for this one string key; piwf.canonical is not needed here

    click.echo(json.dumps({"version": __version__}, separators=(",", ":")))
    raise click.exceptions.Exit(0)


def _usage_error_as_json(error: click.UsageError) -> None:
    from piwf.canonical import encode_text  # not render: it imports the protocol models

    click.echo(encode_text({"error": {"code": "usage", "message": error.format_message()}}))
    raise click.exceptions.Exit(error.exit_code)


@click.group(cls=PiwfGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="piwf", message="%(prog)s %(version)s")
def cli() -> None:
    """piwf: a local, crash-safe workflow server for Python.

    State lives in $PIWF_HOME (default ~/.piwf). Every command accepts --json. Exit codes:
    0 success, 1 runtime error, 2 usage error.

    \b
    Example:
      piwf run start ./flows/hello.py --input '{"who": "Ada"}' --wait
    """


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``piwf`` console script."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="piwf")
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)
