"""``piwf session list`` and ``piwf session show``: the origin sessions interactive runs are
bound to, and what each session's conversation must show (docs/SESSIONS.md)."""

from __future__ import annotations

import click

from piwf.cli import render
from piwf.cli.common import command, json_option, open_client
from piwf.protocol.session_payloads import SessionInfo, SessionView, WorkflowMessageInfo


@click.group("session")
def session_group() -> None:
    """Origin sessions: attach as one, list them, show one's workflow messages.

    Interactive runs are bound to them (docs/SESSIONS.md).

    \b
    Example:
      piwf session list
    """


@session_group.command("list")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@json_option
@command
def session_list(limit: int, as_json: bool) -> None:
    """List the sessions runs were bound to (`piwf run start --session ID`), most recently
    used first: how many runs, the run that holds the session now, the messages it has not
    shown yet and whether a coordinator is attached.

    \b
    Example:
      piwf session list
    """
    with open_client() as client:
        sessions = client.list_sessions(limit=limit)
    if as_json:
        render.emit_json({"sessions": [item.to_wire() for item in sessions]})
        return
    if not sessions:
        click.echo("no sessions yet: piwf run start WORKFLOW --session SESSION_ID")
        return
    headers = ["SESSION", "RUNS", "ACTIVE RUN", "PENDING", "COORDINATOR", "LAST RUN"]
    click.echo(render.table(headers, [_row(item) for item in sessions]))


@session_group.command("show")
@click.argument("session_id")
@json_option
@command
def session_show(session_id: str, as_json: bool) -> None:
    """Show one session's workflow messages in session order: every message of its unfinished
    run and every message it has not shown yet (kind, state, the entry that holds it).

    \b
    Example:
      piwf session show chat-1
    """
    with open_client() as client:
        view = client.session(session_id).view()
    if as_json:
        render.emit_json(view.to_wire())
        return
    click.echo(_view_text(view))


def _row(item: SessionInfo) -> list[str]:
    return [
        item.session_id,
        str(item.runs),
        item.active_run_id or "-",
        str(item.pending_messages),
        "attached" if item.coordinated else "-",
        render.timestamp(item.last_run_at),
    ]


def _view_text(view: SessionView) -> str:
    coordinator = "attached" if view.coordinated else "none attached"
    lines = [
        f"session {view.session_id}",
        f"  active run   {view.active_run_id or '-'}",
        f"  coordinator  {coordinator}",
        f"messages ({len(view.messages)} of {view.total}):",
    ]
    if not view.messages:
        lines.append("  (none to show)")
        return "\n".join(lines)
    rows = [_message_row(message) for message in view.messages]
    shown = render.table(["#", "MESSAGE", "KIND", "STATE", "RUN", "ABOUT"], rows)
    lines.extend(f"  {line}" for line in shown.splitlines())
    return "\n".join(lines)


def _message_row(message: WorkflowMessageInfo) -> list[str]:
    kind = message.kind if message.reason is None else f"{message.kind} ({message.reason})"
    state = message.state if message.entry_id is None else f"sent as {message.entry_id}"
    return [str(message.order), message.message_id, kind, state, message.run_id, _about(message)]


def _about(message: WorkflowMessageInfo) -> str:
    content = message.content if isinstance(message.content, dict) else {}
    if message.kind in ("step", "decision"):
        return f"request {content.get('requestId', '?')}"
    if message.kind == "terminal":
        return f"run {content.get('status', '?')}"
    if message.kind == "notification":
        text = str(content.get("message", ""))
        return text if len(text) <= 60 else text[:59] + "…"
    return ""
