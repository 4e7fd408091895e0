"""``piwf run logs RUN [--node N] [--follow] [--json]``: what a run's nodes printed.

Each node attempt's stdout and stderr (interleaved as the server read them) under one header
line naming its node, visit and attempt; docs/CLI.md shows the output.
"""

from __future__ import annotations

import codecs
import contextlib
from typing import TYPE_CHECKING, Any, Final

import click

from piwf.cli import render
from piwf.cli.common import (
    command,
    interrupted,
    json_option,
    naming_given,
    open_client,
    run_id_argument,
    sigterm_stops_waiting,
)
from piwf.cli.runs import run_group
from piwf.cli.safe_text import given
from piwf.errors import CommandError, NodeNotInRunError

if TYPE_CHECKING:
    from piwf.client import Client
    from piwf.protocol.log_payloads import AttemptLogInfo

#: Attempt statuses that may still change; any other one says how the attempt ended.
UNFINISHED: Final = frozenset({"running", "pending", "waiting"})


@run_group.command("logs")
@run_id_argument
@click.option("--node", metavar="NODE", help="Only this node's attempts (its full path).")
@click.option(
    "--follow",
    is_flag=True,
    help="Keep printing new output until the run is terminal (Ctrl-C stops).",
)
@click.option(
    "--raw",
    is_flag=True,
    help="Print the output as the nodes wrote it, colours and terminal escapes included.",
)
@json_option
@command
def run_logs(run_id: str, node: str | None, follow: bool, raw: bool, as_json: bool) -> None:
    """Show what a run's nodes printed: each attempt's stdout and stderr under a header
    naming its node, visit and attempt, in the order the attempts started.

    Control characters other than line breaks and tabs (colours, terminal escapes) show
    escaped, so a node's output cannot drive the terminal; --raw prints them as written. With
    --follow, output is printed as it is written and the command exits 0 once the run is
    terminal, or paused or parked until someone acts (it says so on stderr). --json prints
    {"runId", "runStatus", "terminal", "attempts": [...]} with each attempt's "text"; with
    --follow, one {"attempt", "text"} document per piece read.

    \b
    Example:
      piwf run logs run-0b9c --node fetch
      piwf run logs run-0b9c --follow
    """
    # The server names the run's nodes, never the text it was sent: name the node given.
    unknown_node = (
        naming_given(f"node {given(node)}", CommandError, NodeNotInRunError.code)
        if node is not None
        else contextlib.nullcontext()
    )
    try:
        with sigterm_stops_waiting(), unknown_node, open_client() as client:
            if follow:
                _follow(client, run_id, node, raw=raw, as_json=as_json)
            else:
                _show(client, run_id, node, raw=raw, as_json=as_json)
    except KeyboardInterrupt as stop:
        interrupted(as_json=as_json, stop=stop)


def _no_attempts(run_id: str, node: str | None, run_status: str, *, terminal: bool) -> str:
    """The line for a run (or a node of it) without an attempt: one that ended never gets
    output later (a run cancelled while queued, a branch not taken), so only an unfinished
    run's says "yet"."""
    if not terminal:
        return f"run {run_id} has no node output yet" + (" for that node" if node else "")
    never = f"node {node} never ran" if node else "no node of it ran"
    return f"run {run_id} ended {run_status} and {never}: there is no output"


def _shown(data: bytes, text: str, *, raw: bool) -> bytes | str:
    """What to print of a piece of output: with ``raw`` its bytes exactly as the node wrote
    them (invalid UTF-8 too, which ``text`` has replaced), else ``text`` with its control
    characters escaped."""
    return data if raw else render.log_text(text)


def _echo_output(shown: bytes | str, *, newline: bool) -> None:
    """Print a piece of output; bytes go to the binary stdout unchanged."""
    # color=True: click would strip colour codes from --raw output to a pipe.
    click.echo(shown, nl=newline, color=True)


def _show(client: Client, run_id: str, node: str | None, *, raw: bool, as_json: bool) -> None:
    found = client.read_run_logs(run_id, node=node)
    logs = found.attempts
    if as_json:
        render.emit_json(
            {
                "runId": found.run_id,
                "runStatus": found.run_status,
                "terminal": found.terminal,
                "attempts": [{**_described(log.info), "text": log.text} for log in logs],
            }
        )
        return
    if not logs:
        click.echo(_no_attempts(run_id, node, found.run_status, terminal=found.terminal))
    for log in logs:
        click.echo(header(log.info))
        shown = _shown(log.data, log.text, raw=raw)
        if shown:
            _echo_output(shown, newline=not log.data.endswith(b"\n"))


def _follow(client: Client, run_id: str, node: str | None, *, raw: bool, as_json: bool) -> None:
    """Print each attempt's header when it is first seen (with its status then), its output as
    it comes, and a line when its status changes from unfinished (how it ended: the header as
    ``run logs`` shows it then). An attempt shown ended is never shown unfinished again (a
    killed runner's attempt reads ``interrupted`` until the next runner stores it so)."""
    decoders: dict[int, codecs.IncrementalDecoder] = {}
    shown: dict[int, str] = {}  # the status each attempt's last header line showed
    current: int | None = None  # the attempt whose output the last lines printed belong to
    at_line_start = True

    def line(info: AttemptLogInfo, *, final: bool) -> None:
        nonlocal at_line_start
        if not at_line_start:
            click.echo()
        click.echo(header(info, final=final))
        shown[info.log], at_line_start = info.status, True

    for info, data in client.follow_run_logs(run_id, node=node):
        decoder = decoders.setdefault(info.log, codecs.getincrementaldecoder("utf-8")("replace"))
        text = decoder.decode(data)
        if as_json:
            render.emit_json({"attempt": _described(info), "text": text})
            continue
        before = shown.get(info.log)
        if before is None:
            line(info, final=info.status not in UNFINISHED)
            current = info.log
        elif data and info.log != current:
            # Output read after its attempt's end line (or another's output): a header again,
            # with the status already shown when that was an end.
            again = info if before in UNFINISHED else info.model_copy(update={"status": before})
            line(again, final=False)
            current = info.log
        if data:
            _echo_output(_shown(data, text, raw=raw), newline=False)
            at_line_start = data.endswith(b"\n")
        if before in UNFINISHED and info.status != before:
            line(info, final=info.status not in UNFINISHED)
            # Output read after an attempt's end line goes under a header of its own.
            current = info.log if info.status in UNFINISHED else None
    if not at_line_start and not as_json:
        click.echo()
    if not as_json:
        _say_why_it_stopped(client, run_id)


def _say_why_it_stopped(client: Client, run_id: str) -> None:
    """After a follow that ended with the run not terminal (paused, or parked until someone
    acts), say so on stderr with the command that tells why: nothing more comes until then."""
    run = client.get_run(run_id).run
    if run.finished_at is None and run.needs_action:
        state = "is paused" if run.paused else f"is parked ({run.error_code or 'needs action'})"
        click.echo(
            f"run {run_id} {state}: nothing more is printed until it is resumed;"
            f" piwf run explain {run_id} says why and what to do",
            err=True,
        )


def header(info: AttemptLogInfo, *, final: bool = True) -> str:
    """The line above one attempt's output: node, visit, attempt, status and, once final,
    what each stream wrote and what was dropped past the cap; then whether its log file is
    missing."""
    line = f"== {info.node_path} (visit {info.visit}, attempt {info.attempt}) {info.status}"
    if final and info.status not in UNFINISHED:
        written = [
            f"{name} {count} B"
            for name, count in (("stdout", info.stdout_bytes), ("stderr", info.stderr_bytes))
            if count
        ]
        if written:
            line += ": " + ", ".join(written)
        elif info.size:  # the counts are stored when an attempt ends; a killed server never did
            line += f": {info.size} B, not counted by stream (the server stopped before it ended)"
        else:
            line += ": no output"
        if info.dropped_bytes:
            line += f"; {info.dropped_bytes} B dropped past the cap"
    if info.missing:
        from piwf.client.logs import MISSING_LOG_NOTE  # the client's module: loaded with it

        line += f"; {MISSING_LOG_NOTE}"
    return line + " =="


def _described(info: AttemptLogInfo) -> dict[str, Any]:
    """An attempt's description without the transfer fields (offset, size, base64 data)."""
    wire = info.to_wire()
    for field in ("data", "offset", "size"):
        wire.pop(field, None)
    return wire
