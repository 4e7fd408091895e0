"""``piwf workflows list | show``: what ``run start NAME`` finds, and what a workflow is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from piwf import canonical
from piwf.cli import render
from piwf.cli.common import command, json_option, open_client
from piwf.protocol.workflow_payloads import WorkflowDescription, WorkflowList

_PROJECT = click.option(
    "--project",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help="Project directory whose .piwf/workflows/ is searched first (default: the current"
    " directory).",
)


@click.group("workflows")
def workflows_group() -> None:
    """List the workflows run start finds by name, and show one's nodes and input.

    A name is looked up in the project's .piwf/workflows/, then $PIWF_HOME/workflows/, then
    the workflows shipped with piwf; the first file NAME.py found wins (docs/WORKFLOWS.md).

    \b
    Example:
      piwf workflows list
      piwf workflows show noop
    """


@workflows_group.command("list")
@_PROJECT
@json_option
@command
def workflows_list(project: Path | None, as_json: bool) -> None:
    """List every workflow run start NAME would find, in discovery order.

    Each name appears once, from the first directory that has it; the directories searched
    are listed after the workflows. No workflow code is loaded.

    \b
    Example:
      piwf workflows list --project ~/src/shop
    """
    with open_client() as client:
        listing = client.list_workflows(project=project)
    if as_json:
        render.emit_json(listing.to_wire())
        return
    click.echo(workflow_table(listing))


@workflows_group.command("show")
@click.argument("workflow", metavar="NAME|FILE")
@_PROJECT
@json_option
@command
def workflows_show(workflow: str, project: Path | None, as_json: bool) -> None:
    """Show one workflow's nodes, edges, exits, mounts and input contract.

    The workflow is loaded in a resolver child exactly as run start loads it (a file that does
    not load is reported with the loader's message); nothing is recorded.

    \b
    Example:
      piwf workflows show noop
      piwf workflows show ./flows/review.py --json
    """
    with open_client() as client:
        description = client.show_workflow(workflow, project=project)
    if as_json:
        render.emit_json(description.to_wire())
        return
    click.echo(describe(description))


def workflow_table(listing: WorkflowList) -> str:
    """The workflows as a table, then the directories searched."""
    lines: list[str] = []
    if listing.workflows:
        width = max(len("NAME"), *(len(w.name) for w in listing.workflows))
        lines.append(f"{'NAME':<{width}}  {'ORIGIN':<7}  PATH")
        lines += [f"{w.name:<{width}}  {w.origin:<7}  {w.path}" for w in listing.workflows]
    else:
        lines.append("no workflows found")
    lines.append("")
    lines.append("searched, in order:")
    for place in listing.directories:
        missing = "" if place.exists else "  (missing)"
        lines.append(f"  {place.origin:<7}  {place.directory}{missing}")
    return "\n".join(lines)


def describe(workflow: WorkflowDescription) -> str:
    """A workflow's structure, one fact per line."""
    title = f" — {workflow.title}" if workflow.title else ""
    lines = [
        f"{workflow.name}{title}",
        f"source:  {workflow.source}",
        f"digest:  {workflow.definition_digest}",
        f"input:   {_input_line(workflow)}",
        f"start:   {workflow.start_at} (at most {workflow.max_steps} node visits per run)",
        "nodes:",
    ]
    width = max((len(node.node_id) for node in workflow.nodes), default=0)
    kinds = max((len(node.kind) for node in workflow.nodes), default=0)
    for node in workflow.nodes:
        facts = _facts(node.structure)
        lines.append(f"  {node.node_id:<{width}}  {node.kind:<{kinds}}  {facts}".rstrip())
    lines.append("edges:" if workflow.edges else "edges:   none (the start node is the end)")
    lines += [f"  {_edge_line(edge)}" for edge in workflow.edges]
    if workflow.exits:
        lines.append("exits:")
        for name, spec in workflow.exits.items():
            validated = " (validated)" if isinstance(spec, dict) and spec.get("validates") else ""
            source = spec.get("from") if isinstance(spec, dict) else spec
            lines.append(f"  {name} from {source}{validated}")
    if workflow.includes:
        lines.append("includes:")
        for name, mount in workflow.includes.items():
            inner = mount.get("workflow") if isinstance(mount, dict) else None
            inner_name = inner.get("name") if isinstance(inner, dict) else "?"
            lines.append(f"  {name}: workflow {inner_name}")
    lines.append("sources (as run start records them):")
    lines.append(render.source_table(workflow.sources))
    return "\n".join(lines)


def _input_line(workflow: WorkflowDescription) -> str:
    contract = workflow.input
    if contract.kind == "model":
        schema = " (its JSON schema: --json)" if contract.json_schema is not None else ""
        return f"parsed by the pydantic model {contract.model}{schema}"
    if contract.kind == "parser":
        return f"parsed by {contract.parser}"
    return "any JSON value"


def _edge_line(edge: dict[str, Any]) -> str:
    source = edge.get("from")
    switch = edge.get("switch")
    if isinstance(switch, dict):
        cases = switch.get("cases")
        routes = ", ".join(f"{case} -> {target}" for case, target in (cases or {}).items())
        return f"{source} on {switch.get('on')}: {routes}"
    return f"{source} -> {edge.get('to')}"


def _facts(structure: dict[str, Any]) -> str:
    shown = {key: value for key, value in structure.items() if value is not None}
    return " ".join(f"{key}={canonical.encode_text(value)}" for key, value in shown.items())
