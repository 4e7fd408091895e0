"""``piwf relay --listen 127.0.0.1:PORT``: the client protocol over a loopback WebSocket.

The one module of the CLI that reaches :mod:`piwf.relay`, and only inside the command, so the
base install never imports ``websockets`` (the ``piwf[relay]`` extra). The listen address is
checked before anything else: a host that is not loopback-only is a usage error (exit 2).
"""

from __future__ import annotations

import os

import click

from piwf.cli import render
from piwf.cli.common import command, json_option
from piwf.client.loopback import TUNNEL_HINT, NotLoopbackError, parse_listen_address
from piwf.config import state_home
from piwf.errors import MissingExtraError

MISSING_WEBSOCKETS = "piwf relay needs the relay extra: pip install 'piwf[relay]'"


def _check_listen(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, int]:
    try:
        addresses, port = parse_listen_address(value)
    except NotLoopbackError as error:
        raise click.BadParameter(
            f"{error}: the relay listens on loopback only; {TUNNEL_HINT}"
        ) from None
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    return addresses[0], port


@click.command("relay")
@click.option(
    "--listen",
    required=True,
    metavar="HOST:PORT",
    callback=_check_listen,
    help="A loopback address and port (127.0.0.1:8765, [::1]:8765; port 0 picks a free one).",
)
@json_option
@command
def relay_command(listen: tuple[str, int], as_json: bool) -> None:
    """Relay the client protocol over a loopback WebSocket (extra: piwf[relay]).

    For `piwf view --remote` through an SSH tunnel: each WebSocket gets its own connection to
    this state home's server, one frame per binary message. Only this machine's own user may
    connect (checked on every connection); other hosts reach it only through the tunnel. It
    prints where it listens (with --json one document, once ready) and runs until Ctrl-C or
    SIGTERM. It never starts a server. See docs/REMOTE.md.

    \b
    Example:
      piwf relay --listen 127.0.0.1:8765
    """
    try:
        from piwf.relay.server import serve_relay
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "websockets":
            raise
        raise MissingExtraError(MISSING_WEBSOCKETS) from None
    home = state_home().absolute()
    address, port = listen

    def ready(urls: list[str]) -> None:
        if as_json:
            render.emit_json({"listening": urls, "home": str(home), "pid": os.getpid()})
        else:
            click.echo(f"piwf relay: listening on {' '.join(urls)} for {home} (Ctrl-C stops it)")

    serve_relay(home, address, port, ready=ready, notice=lambda line: click.echo(line, err=True))
