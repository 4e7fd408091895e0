"""``piwf state status | verify | backup | restore | prune``: the state database, always through
the server, except the two offline commands: verifying a backup file and restoring one (which
needs the server stopped)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click

from piwf.cli import render, render_state
from piwf.cli.common import command, json_option, open_client
from piwf.config import state_home
from piwf.errors import BackupFailedError, StateFullCommandError, StateIoCommandError
from piwf.protocol.state_payloads import MAX_TIMESTAMP_MS, VerifyReceipt, ViolationInfo

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_DIGITS = re.compile(r"[0-9]+")


@click.group("state")
def state_group() -> None:
    """Inspect, verify, back up and restore the state database of $PIWF_HOME.

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
        click.echo(render_state.state_status(status))


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
        click.echo(render_state.verify(receipt))
    if not receipt.valid:
        raise click.exceptions.Exit(1)


def _verify_offline(path: Path) -> VerifyReceipt:
    # The one client-side SQLite read (DESIGN.md: offline verification of an inactive backup),
    # imported only when asked for, so that no other command loads the state package.
    from piwf.client import offline

    violations = offline.verify_file(path.absolute())
    return VerifyReceipt(
        valid=not violations,
        violations=[ViolationInfo(code=v.code, detail=v.detail) for v in violations],
    )


def _new_file_path(_ctx: click.Context, _param: click.Parameter, value: str) -> Path:
    # Checked before it becomes a Path: Path("") is ".", the current directory.
    if not value:
        raise click.BadParameter("the path is empty; give the path of a new file for the backup")
    _refuse_existing(value)
    _refuse_directory_name(value)
    return Path(value)


def _refuse_directory_name(destination: str, option: str = "") -> None:
    """Raise a usage error for a path that names a directory by its spelling (``dir/``,
    ``dir/.``): as a Path it loses that ending, and the backup would become a file ``dir``."""
    if destination.endswith(os.sep) or destination.rsplit(os.sep, 1)[-1] == os.curdir:
        named = f"{option} " if option else ""
        raise click.UsageError(
            f"{named}{render.one_line(destination)} names a directory; give the path of a new"
            " file in it (for example DIR/piwf-backup.sqlite, once DIR exists)"
        )


def _refuse_existing(destination: str | Path, option: str = "") -> None:
    """Raise a usage error when ``destination`` (a backup's path, named ``option`` in the
    message) exists already, before anything is sent. ``lexists`` never raises: a path the OS
    refuses (a name too long) is left to the server, which answers it with the reason."""
    named = f"{option} " if option else ""
    if os.path.isdir(destination):  # noqa: PTH112 (never raises; a too-long name is the server's)
        raise click.UsageError(
            f"{named}{render.one_line(str(destination))} is a directory; give the path of a new"
            " file in it (for example DIR/piwf-backup.sqlite)"
        )
    if os.path.lexists(destination):
        raise click.UsageError(
            f"{named}{render.one_line(str(destination))} already exists; choose a new file"
        )


@contextlib.contextmanager
def _naming(destination: Path) -> Iterator[None]:
    """Name ``destination`` in a backup's failure, keeping its class and code. The server's
    message leaves it out (a request's path stays out of its log); here it is the user's own
    argument, shown escaped on one line (control characters and undecodable bytes as escapes)."""
    try:
        yield
    except (BackupFailedError, StateFullCommandError, StateIoCommandError) as error:
        absolute = os.fsencode(destination.absolute()).decode("utf-8", "backslashreplace")
        named = f"backup to {render.one_line(absolute)} failed: {error}"
        raise type(error)(named, error_code=error.error_code) from None


@state_group.command("backup")
@click.argument("destination", metavar="DEST", type=click.Path(), callback=_new_file_path)
@json_option
@command
def state_backup(destination: Path, as_json: bool) -> None:
    """Write a verified backup of the database to DEST, a file that must not exist yet.

    The server writes it through the SQLite backup API and verifies it before answering;
    DEST is resolved against the current directory. The backup holds the database, not the
    logs directory (what nodes printed): copy $PIWF_HOME/logs yourself to keep it.

    \b
    Example:
      piwf state backup ~/piwf-backup.sqlite
    """
    with open_client() as client, _naming(destination):
        receipt = client.backup(destination)
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(render_state.backup(receipt))


@state_group.command("restore")
@click.argument(
    "backup", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="BACKUP"
)
@json_option
@command
def state_restore(backup: Path, as_json: bool) -> None:
    """Replace the database of $PIWF_HOME with a verified copy of BACKUP; the server must be
    stopped.

    BACKUP is verified first (as `piwf state verify BACKUP` does) and refused if it has any
    violation or a -wal of its own. The current state.sqlite and its -wal, -shm and -journal
    are moved aside together as state.sqlite.replaced-<UTC time>[-wal|-shm|-journal]; nothing
    is overwritten or deleted. Stop the server first (`piwf server stop`); start it again
    afterwards (`piwf server start`). Exit 0 restored, 1 refused (nothing changed).

    \b
    Example:
      piwf state restore ~/piwf-backup.sqlite
    """
    # Offline, like `state verify BACKUP`: imported only when asked for (DESIGN.md §1).
    from piwf.client import restore

    report = restore.restore_backup(backup, state_home())
    moved = [{"from": str(m.source), "to": str(m.destination)} for m in report.moved]
    if as_json:
        render.emit_json(
            {
                "backup": str(report.backup),
                "database": str(report.database),
                "bytes": report.byte_length,
                "movedAside": moved,
            }
        )
        return
    restored = f"{render.one_line(str(report.backup))} as {render.one_line(str(report.database))}"
    click.echo(f"restored {restored} ({report.byte_length} bytes, verified)")
    for item in report.moved:
        source, destination = item.source.name, item.destination.name
        click.echo(f"moved aside: {render.one_line(source)} -> {render.one_line(destination)}")
    click.echo("start the server with: piwf server start")


def parse_timestamp(text: str) -> int:
    """Return epoch milliseconds for ``text``: digits only are epoch milliseconds, anything else
    must be ISO-8601 (``2024-05-01``, ``2024-05-01T12:00:00+02:00``, a trailing ``Z``); an ISO
    time without an offset is UTC. Raises :class:`click.BadParameter`."""
    text = text.strip()
    if _DIGITS.fullmatch(text):
        # Past 16 digits it is beyond the year 9999 anyway; int() of a long text is slow.
        value = int(text) if len(text) <= 16 else MAX_TIMESTAMP_MS + 1
    else:
        iso = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
        try:
            moment = datetime.fromisoformat(iso)
        except ValueError:
            raise click.BadParameter(
                f"{text[:64]!r} is neither ISO-8601 nor epoch milliseconds; give a date"
                " (2024-05-01), a time (2024-05-01T12:00:00Z, 2024-05-01T14:00:00+02:00)"
                " or digits only (1714521600000)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        value = (moment - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= value <= MAX_TIMESTAMP_MS:
        raise click.BadParameter(
            "the timestamp must lie between 1970 and the year 9999"
            f" (as epoch milliseconds, 0 to {MAX_TIMESTAMP_MS})"
        )
    return value


def _cutoff_option(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    """``--before``: a time in the past. A cutoff in the future would take every tree that
    ended, the one ending in a second too: most likely a typo (a wrong year, a digit too many),
    and a prune is only undone by restoring its backup."""
    cutoff = parse_timestamp(value)
    if cutoff > time.time_ns() // 1_000_000:
        raise click.BadParameter(
            f"{value.strip()[:64]!r} lies in the future, so every run tree that has ended"
            " would go; give a time in the past (to prune every tree that ended until now,"
            ' give the current time: --before "$(date -u +%Y-%m-%dT%H:%M:%SZ)")'
        )
    return cutoff


@state_group.command("prune")
@click.option(
    "--before",
    "before",
    required=True,
    metavar="TS",
    callback=_cutoff_option,
    help="Cutoff, in the past: ISO-8601 (2024-05-01, 2024-05-01T12:00:00Z; no offset means UTC) "
    "or epoch milliseconds (digits only). Trees whose every run finished before it may go.",
)
@click.option("--dry-run", "dry_run", is_flag=True, help="Only list what would be deleted.")
@click.option("--apply", "apply", is_flag=True, help="Delete (needs --backup).")
@click.option(
    "--backup",
    "backup_text",
    metavar="DEST",
    type=click.Path(),
    help="With --apply: a verified backup is written here first (absolute, new file).",
)
@json_option
@command
def state_prune(
    before: int, dry_run: bool, apply: bool, backup_text: str | None, as_json: bool
) -> None:
    """Delete terminal run trees that finished before TS and hold no protected state.

    The server's automatic sweep does the same for trees older than 30 days. --dry-run lists
    the trees (ids and counts) it would delete and the expired ones protected state keeps;
    --apply first writes a backup to DEST and verifies it read-only, then deletes those trees.
    With --json the document is the prune report either way.

    \b
    Example:
      piwf state prune --before 2024-05-01 --dry-run
      piwf state prune --before 2024-05-01 --backup /var/backups/piwf-1.sqlite --apply
    """
    if dry_run == apply:
        raise click.UsageError("choose exactly one of --dry-run and --apply")
    if dry_run and backup_text is not None:
        raise click.UsageError("--backup only applies with --apply")
    backup = None if backup_text is None else Path(backup_text)
    if apply:
        if backup_text is None or backup is None:
            raise click.UsageError("--apply needs --backup DEST, a new file for the backup")
        if not backup.is_absolute():
            raise click.UsageError("--backup must be an absolute path")
        _refuse_existing(backup, "--backup")
        _refuse_directory_name(backup_text, "--backup")
    with open_client() as client:
        if apply:
            assert backup is not None
            with _naming(backup):
                report = client.prune(before, backup)
        else:
            report = client.prune_preview(before)
    if as_json:
        render.emit_json(report.to_wire())
    else:
        click.echo(render_state.prune(report))
