"""``piwf resource apply | get | list | delete | reconcile``: managed resources."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import click

from piwf import canonical
from piwf.cli import render
from piwf.cli.common import Integer, command, json_option, open_client, parse_json
from piwf.cli.safe_text import given
from piwf.config import ServerPaths, state_home
from piwf.protocol.resource_payloads import ResourceDetail, ResourceInfo


@click.group("resource")
def resource_group() -> None:
    """Apply, inspect, reconcile and delete managed resources.

    A resource manager (a Python file in .piwf/resource_managers/ or
    $PIWF_HOME/resource_managers/) keeps each of its resources converging to its spec; see
    docs/RESOURCE_MANAGERS.md.

    \b
    Example:
      piwf resource apply greeting ada --spec '{"dir": "/tmp/out", "name": "ada"}'
    """


def _manager_and_key(function: Any) -> Any:
    function = click.argument("key", metavar="KEY")(function)
    return click.argument("manager", metavar="MANAGER")(function)


@resource_group.command("apply")
@_manager_and_key
@click.option("--spec", "spec_text", metavar="JSON", help="The spec: a JSON object.")
@click.option(
    "--spec-file",
    type=click.File("rb"),
    metavar="FILE",
    help="Read the spec as JSON from FILE ('-' for stdin).",
)
@click.option(
    "--project",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help="Project directory for manager discovery (default: the current directory).",
)
@json_option
@command
def resource_apply(
    manager: str,
    key: str,
    spec_text: str | None,
    spec_file: IO[bytes] | None,
    project: Path | None,
    as_json: bool,
) -> None:
    """Create the resource MANAGER/KEY or change its spec.

    The manager's initial status is computed in a supervised child before the resource is
    committed; a changed spec starts a new generation, an equal one changes nothing. The
    resource is reconciled as soon as an execution slot is free.

    \b
    Example:
      piwf resource apply greeting ada --spec '{"dir": "/tmp/out", "name": "ada"}'
    """
    spec = _read_spec(spec_text, spec_file)
    with open_client() as client:
        receipt = client.apply_resource(manager, key, spec, project=project)
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(f"{receipt.outcome} {resource_line(receipt.resource)}")


@resource_group.command("get")
@_manager_and_key
@json_option
@command
def resource_get(manager: str, key: str, as_json: bool) -> None:
    """Show one resource: spec, status, conditions, effects, child runs and reconciles.

    \b
    Example:
      piwf resource get greeting ada --json
    """
    with open_client() as client:
        detail = client.get_resource(manager, key)
    failed_log = failed_reconcile_log(detail, ServerPaths(state_home()).runners_dir)
    if as_json:
        wire = detail.to_wire()
        if failed_log is not None:  # what the human form shows as ``traceback``
            wire["traceback"] = str(failed_log)
        render.emit_json(wire)
    else:
        click.echo(resource_detail(detail, failed_log))


@resource_group.command("list")
@click.option("--manager", metavar="NAME", help="Only the resources of this manager.")
@click.option(
    "--limit",
    type=Integer(1, 100),
    default=100,
    show_default=True,
    metavar="N",
    help="How many resources to show.",
)
@json_option
@command
def resource_list(manager: str | None, limit: int, as_json: bool) -> None:
    """List managed resources by manager and key.

    \b
    Example:
      piwf resource list --manager greeting
    """
    with open_client() as client:
        resources = client.list_resources(manager=manager, limit=limit)
    if as_json:
        render.emit_json({"resources": [info.to_wire() for info in resources]})
        return
    if not resources and manager is not None:
        click.echo(
            f"no managed resources of manager {given(manager)}"
            " (piwf resource list shows every manager's)"
        )
        return
    if not resources:
        click.echo("no managed resources")
        return
    rows = [
        [
            info.manager,
            info.key,
            info.state,
            info.ready or "-",
            f"{info.observed_generation}/{info.generation}",
            str(info.resource_version),
            render.timestamp(info.updated_at),
        ]
        for info in resources
    ]
    headers = ["MANAGER", "KEY", "STATE", "READY", "OBSERVED/GEN", "VERSION", "UPDATED"]
    click.echo(render.table(headers, rows))


@resource_group.command("delete")
@_manager_and_key
@json_option
@command
def resource_delete(manager: str, key: str, as_json: bool) -> None:
    """Delete a resource: at once when it has no finalizer and no reconcile running, otherwise
    mark it deleting so its manager cleans up and removes its finalizers first.

    \b
    Example:
      piwf resource delete greeting ada
    """
    with open_client() as client:
        receipt = client.delete_resource(manager, key)
    if as_json:
        render.emit_json(receipt.to_wire())
    elif receipt.deleted:
        click.echo(f"deleted {receipt.resource.manager}/{receipt.resource.key}")
    else:
        waiting = ", ".join(receipt.resource.finalizers) or "its manager"
        click.echo(f"deleting {resource_line(receipt.resource)}; waiting for {waiting}")


@resource_group.command("reconcile")
@_manager_and_key
@json_option
@command
def resource_reconcile(manager: str, key: str, as_json: bool) -> None:
    """Reconcile a resource now (also ends an error backoff).

    \b
    Example:
      piwf resource reconcile greeting ada
    """
    with open_client() as client:
        receipt = client.reconcile_resource(manager, key)
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(f"enqueued {resource_line(receipt.resource)}")


def resource_line(info: ResourceInfo) -> str:
    """One line: manager/key, state, generation and version."""
    return (
        f"{info.manager}/{info.key}  {info.state}  generation {info.generation}"
        f" (observed {info.observed_generation})  version {info.resource_version}  {info.uid}"
    )


def resource_detail(detail: ResourceDetail, failed_log: Path | None = None) -> str:
    """The human form of ``resource.get``; ``failed_log`` (from :func:`failed_reconcile_log`)
    is shown as ``traceback``."""
    info = detail.resource
    queue = info.queue
    lines = [
        f"{info.manager}/{info.key}  {info.state}",
        render.fields(
            [
                ("uid", info.uid),
                ("version", info.resource_version),
                ("generation", f"{info.generation} (observed {info.observed_generation})"),
                ("deleting since", _when(info.deletion_timestamp)),
                ("finalizers", ", ".join(info.finalizers) or None),
                (
                    "due",
                    None
                    if queue is None
                    else f"{render.timestamp(queue.available_at)} ({queue.reason})",
                ),
                (
                    "errors",
                    None
                    if queue is None or not queue.consecutive_errors
                    else queue.consecutive_errors,
                ),
                ("last error", _stored(None if queue is None else queue.last_error)),
                ("traceback", None if failed_log is None else render.one_line(str(failed_log))),
                ("manager", f"{render.one_line(detail.source_path)} ({detail.source_digest[:12]})"),
            ]
        ),
        "spec:",
        "  " + render.one_line(canonical.encode_text(detail.spec)),
        "status:",
        "  " + render.one_line(canonical.encode_text(detail.status)),
    ]
    if detail.conditions:
        rows = [
            [
                render.one_line(c.type),
                c.status,
                render.one_line(c.reason),
                str(c.observed_generation),
                render.one_line(c.message or ""),
            ]
            for c in detail.conditions
        ]
        lines += [
            "conditions:",
            _indent(render.table(["TYPE", "STATUS", "REASON", "GEN", "MESSAGE"], rows)),
        ]
    if detail.effects:
        rows = [
            [e.effect_id, render.one_line(e.effect_type), e.status, str(e.attempt_count)]
            for e in detail.effects
        ]
        heading = render.shown_heading("effects", len(rows), detail.effect_count)
        lines += [heading, _indent(render.table(["EFFECT", "KIND", "STATUS", "ATTEMPTS"], rows))]
    if detail.workflows:
        rows = [[render.one_line(w.request_key), w.run_id, w.state] for w in detail.workflows]
        heading = render.newest_heading("child runs", len(rows), detail.workflow_count)
        lines += [heading, _indent(render.table(["REQUEST KEY", "RUN ID", "STATE"], rows))]
    if detail.reconciles:
        rows = [
            [
                r.reconcile_id,
                r.status,
                r.result or "-",
                str(r.resource_generation),
                render.timestamp(r.started_at),
            ]
            for r in detail.reconciles
        ]
        lines += [
            render.newest_heading("recent reconciles", len(rows), detail.reconcile_count),
            _indent(render.table(["RECONCILE", "PROCESS", "RESULT", "GEN", "STARTED"], rows)),
        ]
    return "\n".join(lines)


def failed_reconcile_log(detail: ResourceDetail, log_directory: Path) -> Path | None:
    """For a resource whose last reconcile failed, the log of the newest failed reconcile in
    the server's ``log_directory`` (its runners' logs), when it holds something (a traceback);
    else None."""
    queue = detail.resource.queue
    if queue is None or queue.last_error is None:
        return None
    for reconcile in detail.reconciles:  # newest first
        if reconcile.result == "failed":
            path = log_directory / f"{reconcile.reconcile_id}.log"
            try:
                return path if path.stat().st_size > 0 else None
            except OSError:
                return None
    return None


def _stored(text: str | None) -> str | None:
    """Text a manager wrote (an exception's message) safe for one field line: a line break or
    a terminal escape in it shows as its Python escape instead of forging a line."""
    return None if text is None else render.one_line(text)


def _when(ms: int | None) -> str | None:
    return None if ms is None else render.timestamp(ms)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _read_spec(text: str | None, file: IO[bytes] | None) -> dict[str, Any]:
    """Parse --spec or --spec-file (usage errors, exit 2): a JSON object is required."""
    if (text is None) == (file is None):
        raise click.UsageError("give exactly one of --spec or --spec-file")
    option = "--spec" if text is not None else "--spec-file"
    data: str | bytes = text if text is not None else file.read()  # type: ignore[union-attr]
    spec = parse_json(data, option)
    if not isinstance(spec, dict):
        raise click.BadParameter("the spec must be a JSON object", param_hint=option)
    return spec
