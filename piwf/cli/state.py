"""``piwf state status | verify | backup``: the state database, always through the server."""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from piwf.cli import render
from piwf.cli.common import command, json_option, open_client
from piwf.protocol.payloads import VerifyReceipt, ViolationInfo


@click.group("state")
def state_group() -> None:
    """Inspect, verify and back up the state database of $PIWF_HOME.

    \b
    Example:
      piwf state verify
    """


@state_group.command("status")
@json_option
@command
def state_status(as_json: bool) -> None:
    """Show privacy-safe counts of the state database.

    \b
    Example:
      piwf state status --json
    """
    with open_client() as client:
        status = client.state_status()
    if as_json:
        render.emit_json(status.to_wire())
    else:
        click.echo(render.state_status(status))


@state_group.command("verify")
@click.argument(
    "backup", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@json_option
@command
def state_verify(backup: Path | None, as_json: bool) -> None:
    """Check the database invariants; exit 1 when any is violated.

    Without BACKUP the running server checks its live database. With BACKUP an inactive state
    file (a backup) is checked offline, read-only, without a server; nothing is repaired.
    With --json the document is {"valid": ..., "violations": [...]} either way.

    \b
    Example:
      piwf state verify --json
    """
    if backup is not None:
        receipt = _verify_offline(backup)
    else:
        with open_client() as client:
            receipt = client.state_verify()
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(render.verify(receipt))
    if not receipt.valid:
        raise click.exceptions.Exit(1)


def _verify_offline(path: Path) -> VerifyReceipt:
    # The one client-side SQLite read (DESIGN.md: offline verification of an inactive backup),
    # imported only when asked for so that the CLI stays a client everywhere else.
    offline = importlib.import_module("piwf.offline")
    violations = offline.verify_file(path.absolute())
    return VerifyReceipt(
        valid=not violations,
        violations=[ViolationInfo(code=v.code, detail=v.detail) for v in violations],
    )


@state_group.command("backup")
@click.argument("destination", metavar="DEST", type=click.Path(dir_okay=False, path_type=Path))
@json_option
@command
def state_backup(destination: Path, as_json: bool) -> None:
    """Write a verified backup of the database to DEST, a file that must not exist yet.

    The server writes it through the SQLite backup API and verifies it before answering;
    DEST is resolved against the current directory.

    \b
    Example:
      piwf state backup ~/piwf-backup.sqlite
    """
    with open_client() as client:
        receipt = client.backup(destination)
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(render.backup(receipt))
