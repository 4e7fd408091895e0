"""``piwf session list``, ``piwf session show`` and ``piwf session capture``: the origin
sessions interactive runs are bound to, what each session's conversation must show, and what a
session recorded of a run's turns (docs/SESSIONS.md)."""

from __future__ import annotations

import click

from piwf import canonical
from piwf.cli import render
from piwf.cli.common import (
    Integer,
    check_session_id,
    command,
    json_option,
    open_client,
    run_id_argument,
)
from piwf.cli.safe_text import one_line, printable
from piwf.client.session_capture import CapturedTurn
from piwf.protocol.session_payloads import SessionInfo, SessionView, WorkflowMessageInfo

#: Characters of an entry's content ``session capture`` shows on one line (``--full``: all).
PREVIEW_CHARS = 120


@click.group("session")
def session_group() -> None:
    """Origin sessions: attach as one, list them, show their messages and capture.

    Interactive runs are bound to them (docs/SESSIONS.md).

    \b
    Example:
      piwf session list
    """


@session_group.command("list")
@click.option(
    "--limit",
    type=Integer(1, 500),
    default=50,
    show_default=True,
    metavar="N",
    help="How many sessions to show, most recently used first.",
)
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
@click.argument("session_id", callback=check_session_id)
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


@session_group.command("capture")
@run_id_argument
@click.option(
    "--attempt", "attempt_id", metavar="ATTEMPT_ID", help="Only this node attempt's turns."
)
@click.option("--full", is_flag=True, help="Print every entry's content whole.")
@json_option
@command
def session_capture(run_id: str, attempt_id: str | None, full: bool, as_json: bool) -> None:
    """Show what the session recorded of an interactive run's turns: each accepted turn (the
    step it worked on, how it ended, what its bounds dropped), then its entries and events in
    the order the session reported them.

    \b
    Example:
      piwf session capture run-1a2b3c
    """
    with open_client() as client:
        captured = client.read_capture(run_id, attempt_id=attempt_id)
        headless = (
            not captured and not as_json and client.get_run(run_id, content_limit=0).session is None
        )
    if as_json:
        render.emit_json(
            {
                "runId": run_id,
                "turns": [
                    {
                        "segment": turn.segment.to_wire(),
                        "entries": [entry.to_wire() for entry in turn.entries],
                        "events": [event.to_wire() for event in turn.events],
                    }
                    for turn in captured
                ],
            }
        )
        return
    if not captured and attempt_id is not None:
        click.echo(
            f"run {run_id} has no captured turns of attempt {attempt_id}:"
            f" piwf session capture {run_id} shows every captured turn of the run"
        )
        return
    if headless:
        click.echo(
            f"run {run_id} has no captured turns: it is headless (no session); only a run"
            " started with --session SESSION_ID is interactive (docs/SESSIONS.md)"
        )
        return
    if not captured:
        click.echo(
            f"run {run_id} has no captured turns: a session records them with"
            " SessionCoordinator.record while a turn is active (docs/SESSIONS.md)"
        )
        return
    click.echo("\n\n".join(_turn_text(turn, full) for turn in captured))


def _turn_text(turn: CapturedTurn, full: bool) -> str:
    segment = turn.segment
    about = segment.node_path or "the run's conversation"
    state = segment.status if segment.failure is None else f"{segment.status}: {segment.failure}"
    lines = [
        f"turn {segment.turn_id} on {about} ({state})",
        f"  session {segment.session_id}, {segment.entry_count} entries,"
        f" {segment.event_count} events, {segment.stored_bytes} bytes",
    ]
    if segment.dropped_entries or segment.dropped_events:
        lines.append(
            f"  dropped beyond the bounds: {segment.dropped_entries} entries,"
            f" {segment.dropped_events} events"
        )
    roles = {entry_id: role for role, entry_id in segment.roles.items() if role in _SHOWN_ROLES}
    for entry in turn.entries:
        role = f" ({roles[entry.entry_id]})" if entry.entry_id in roles else ""
        lines.append(f"  {entry.entry_seq:>4}  {entry.kind}{role}  {entry.entry_id}")
        lines.append(f"        {_preview(entry.content, full)}")
    if turn.events:
        lines.append("  events:")
        for event in turn.events:
            call = f" [{event.tool_call_id}]" if event.tool_call_id else ""
            lines.append(
                f"  {event.event_seq:>4}  {event.event_type}{call}  {_preview(event.payload, full)}"
            )
    return "\n".join(lines)


_SHOWN_ROLES = ("prompt", "response")


def _preview(value: object, full: bool) -> str:
    """A captured value for reading: a session or a person wrote it, so its control
    characters show as escapes (``--full`` keeps its line breaks; the preview is one line)."""
    text = value if isinstance(value, str) else canonical.encode_text(value)
    if full:
        return printable(text)
    if len(text) <= PREVIEW_CHARS:
        return one_line(text)
    return f"{one_line(text[: PREVIEW_CHARS - 1])}… ({len(text)} characters; --full shows all)"


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
    if view.runs == 0:
        # Nothing ever used it: most often a mistyped id (a session needs no creating).
        lines.append(
            f"  (none: no run has used session {view.session_id} in this state home; "
            "piwf session list shows those that have)"
        )
        return "\n".join(lines)
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
        return one_line(text if len(text) <= 60 else text[:59] + "…")
    return ""
