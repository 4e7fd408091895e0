"""``piwf run settings RUN [--patch JSON | --patch-file FILE] [--mount PATH] [--expect N]``:
show a run's live settings, or change them with an RFC 6902 JSON Patch."""

from __future__ import annotations

import contextlib
import json
from typing import IO, TYPE_CHECKING, Any

import click

from piwf.canonical import MAX_SAFE_INTEGER
from piwf.cli import render
from piwf.cli.common import (
    Integer,
    command,
    json_option,
    naming_given,
    open_client,
    parse_json,
    run_id_argument,
)
from piwf.cli.logs import run_logs
from piwf.cli.runs import run_group
from piwf.cli.safe_text import given
from piwf.errors import CommandError, SettingsChangeError, SettingsConflictError

if TYPE_CHECKING:
    from piwf.protocol.settings_payloads import SettingsScopeInfo

#: ``piwf run logs`` is registered on the same group (its module is imported for it).
_REGISTERED = (run_logs,)


@run_group.command("settings")
@run_id_argument
@click.option("--patch", "patch_text", metavar="JSON", help="An RFC 6902 JSON Patch (a list).")
@click.option(
    "--patch-file",
    type=click.File("rb"),
    metavar="FILE",
    help="Read the JSON Patch from FILE ('-' for stdin).",
)
@click.option(
    "--mount",
    "mount_path",
    default="",
    metavar="PATH",
    help="The mounted workflow whose settings are meant (default: the run's own).",
)
@click.option(
    "--expect",
    "expected_change",
    type=Integer(0, MAX_SAFE_INTEGER),
    metavar="N",
    help="Refuse the patch unless the settings are still at change N.",
)
@json_option
@command
def run_settings(
    run_id: str,
    patch_text: str | None,
    patch_file: IO[bytes] | None,
    mount_path: str,
    expected_change: int | None,
    as_json: bool,
) -> None:
    """Show a run's live settings, or change them with --patch.

    A change is an RFC 6902 JSON Patch that the workflow's allow_path grants let a person
    make, checked by the workflow's parse; it is audited, and only attempts that start after
    it see it (an attempt keeps the copy it started with).

    \b
    Example:
      piwf run settings run-0b9c
      piwf run settings run-0b9c --patch '[{"op": "replace", "path": "/route",
                                            "value": "careful"}]'
    """
    if patch_text is not None and patch_file is not None:
        raise click.UsageError("give --patch or --patch-file, not both")
    if expected_change is not None and patch_text is None and patch_file is None:
        raise click.UsageError("--expect goes with --patch or --patch-file")
    raw = patch_text if patch_text is not None else (patch_file.read() if patch_file else None)
    # The server names the run's mounts, never the path it was sent: name the mount given.
    unknown_mount = (
        naming_given(
            f"settings of mount {given(mount_path)}",
            CommandError,
            SettingsChangeError.code,
            SettingsConflictError.code,
        )
        if mount_path
        else contextlib.nullcontext()
    )
    with unknown_mount, open_client() as client:
        if raw is None:
            shown = client.run_settings(run_id, mount_path=mount_path)
            if as_json:
                render.emit_json(shown.to_wire())
            else:
                _show(run_id, shown.scopes, shown.scope_count)
            return
        patch = parse_json(raw, "--patch" if patch_text is not None else "--patch-file")
        if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
            raise click.BadParameter(
                "a JSON Patch is a list of operation objects", param_hint="--patch"
            )
        operations: list[dict[str, Any]] = [dict(op) for op in patch if isinstance(op, dict)]
        scope = client.change_settings(
            run_id, operations, mount_path=mount_path, expected_change=expected_change
        )
    if as_json:
        render.emit_json({"runId": run_id, "scope": scope.to_wire()})
    else:
        click.echo(f"settings of {run_id}{_where(scope)} are at change {scope.change_number}")
        click.echo(_value_text(scope.value))


def _show(run_id: str, scopes: list[SettingsScopeInfo], total: int | None) -> None:
    if not scopes:
        click.echo(
            f"{run_id} has no settings yet: they appear when the workflow's first node starts"
        )
        return
    if total is not None and total > len(scopes):
        click.echo(
            render.newest_heading(f"entries of mount {scopes[-1].mount_path!r}", len(scopes), total)
        )
    for scope in scopes:
        click.echo(f"settings of {run_id}{_where(scope)}: change {scope.change_number}")
        if scope.description:
            click.echo(f"  {scope.description}")
        click.echo(_value_text(scope.value))
        for grant in scope.paths:
            who = ", ".join(grant.get("replace") or []) or "nobody"
            readers = ", ".join(grant.get("read") or []) or "nobody"
            click.echo(f"  {grant.get('path') or '(all)'}: changed by {who}; read by {readers}")
        for change in scope.changes:
            click.echo(
                f"  change {change.change_number} by a {change.actor} at "
                f"{render.timestamp(change.accepted_at)}: {len(change.patch)} operation(s)"
            )


def _value_text(value: object) -> str:
    """The settings value, indented (what read grants let a person see; ``null``: none)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return "\n".join(f"  {line}" for line in text.splitlines())


def _where(scope: SettingsScopeInfo) -> str:
    if not scope.mount_path:
        return ""
    return f" (mount {scope.mount_path!r}, entry {scope.invocation})"
