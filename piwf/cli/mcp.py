"""``piwf mcp``: serve the model-facing workflow tool over MCP on stdin/stdout."""

from __future__ import annotations

import sys

import click

from piwf.cli.common import command, id_check, json_option
from piwf.cli.safe_text import given
from piwf.config import REQUEST_ID_PREFIX
from piwf.errors import MissingExtraError

MISSING_SDK = "piwf mcp needs the MCP SDK: pip install 'piwf[mcp]'"
#: What a person who starts ``piwf mcp`` in a terminal reads (on stderr) instead of silence.
TERMINAL_NOTE = (
    "piwf mcp serves the workflow tool to an MCP client over stdin/stdout (JSON-RPC); it is "
    "started by the client, not typed at. Configure your MCP client to run `piwf mcp` "
    "(docs/MCP.md). Press Ctrl-C to stop."
)


def _request_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--request``: a request id by the protocol's rule and by its form (``request-...``). A
    run id given instead would be found out only at the model's first submit, long after the
    person who configured the agent command has gone."""
    value = id_check("request")(ctx, param, value)
    if value is not None and not value.startswith(REQUEST_ID_PREFIX):
        raise click.BadParameter(
            f"{given(value)} is not a request id: request ids start with {REQUEST_ID_PREFIX}"
            " (piwf requests lists the pending ones; a headless run's agent command gets its"
            " own as $PIWF_REQUEST_ID)"
        )
    return value


@click.command("mcp")
@click.option(
    "--request",
    "request_id",
    default=None,
    metavar="REQUEST_ID",
    callback=_request_id,
    help="Offer only update and submit, bound to this one agent request.",
)
@json_option
@command
def mcp_command(request_id: str | None, as_json: bool) -> None:
    """Serve the workflow tool to an MCP client over stdio (extra: piwf[mcp]).

    Tools: list, status, start, pause, resume, cancel, answer (checkpoints only), update and
    submit (agent requests). A protected human decision is never answerable through it. With
    --request, only update and submit are offered, for that request (what a headless agent
    command is given through PIWF_MCP_CONFIG). stdout carries the protocol; see docs/MCP.md.

    \b
    Example:
      piwf mcp --request request-5d1e...
    """
    try:
        from piwf.mcp.server import serve
    except ModuleNotFoundError as error:
        # anyio comes with the SDK (piwf.mcp.server imports it, alphabetically first).
        if (error.name or "").partition(".")[0] not in ("mcp", "anyio"):
            raise
        raise MissingExtraError(MISSING_SDK) from None
    if sys.stdin.isatty():
        click.echo(TERMINAL_NOTE, err=True)
    serve(request_id=request_id)
