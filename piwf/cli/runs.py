"""``piwf run start | list | show | wait | cancel``."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, get_args

import click

from piwf.cli import quick_list, render
from piwf.cli.common import (
    Integer,
    Seconds,
    check_session_id,
    command,
    id_check,
    interrupted,
    json_option,
    naming_given,
    open_client,
    parse_json,
    run_id_argument,
    sigterm_stops_waiting,
)
from piwf.cli.progress import RunProgress
from piwf.cli.safe_text import given
from piwf.config import SESSION_OR_AGENT_COMMAND, split_agent_command
from piwf.errors import RejectedError
from piwf.protocol.display_status import RunDisplayStatus

if TYPE_CHECKING:
    from piwf.client import Client
    from piwf.protocol.payloads import RunReceipt, RunWaitReceipt

#: The display statuses ``run list --status`` accepts (the closed set).
DISPLAY_STATUSES = get_args(RunDisplayStatus)
#: Default of --timeout for waits, in seconds.
DEFAULT_WAIT_TIMEOUT_S = 300.0
#: The one terminal status that counts as success for `--wait` and `run wait`.
_SUCCESS_STATUS = "completed"


@click.group("run")
def run_group() -> None:
    """Start, list, inspect, wait for and cancel workflow runs.

    \b
    Example:
      piwf run start ./flows/hello.py --input '{"who": "Ada"}'
    """


@run_group.command("start")
@click.argument("workflow")
@click.option("--input", "input_text", metavar="JSON", help="The run's input as JSON text.")
@click.option(
    "--input-file",
    type=click.File("rb"),
    metavar="FILE",
    help="Read the run's input as JSON from FILE ('-' for stdin).",
)
@click.option(
    "--project",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help="Project directory for workflow discovery (default: the current directory).",
)
@click.option("--title", metavar="TEXT", help="A title shown in run lists.")
@click.option(
    "--agent-command",
    "agent_command_text",
    metavar="'CMD ARGS'",
    help="The headless agent command for this run's agent steps, split like a shell would "
    "(no shell runs); it wins over agent(command=...) and PIWF_AGENT_COMMAND.",
)
@click.option(
    "--session",
    "session_id",
    metavar="SESSION_ID",
    callback=check_session_id,
    help="Bind the run interactive to this origin session: its steps go to the session's "
    "coordinator (docs/SESSIONS.md); one unfinished run per session. Not with --agent-command.",
)
@click.option("--wait", is_flag=True, help="Wait until the run is terminal.")
@click.option(
    "--timeout",
    "timeout_s",
    type=Seconds(),
    metavar="SECONDS",
    help=f"With --wait: give up after this long (default {DEFAULT_WAIT_TIMEOUT_S:g}).",
)
@json_option
@command
def run_start(
    workflow: str,
    input_text: str | None,
    input_file: IO[bytes] | None,
    project: Path | None,
    title: str | None,
    agent_command_text: str | None,
    session_id: str | None,
    wait: bool,
    timeout_s: float | None,
    as_json: bool,
) -> None:
    """Start a run of WORKFLOW: a file path (anything with '/' or ending in .py, or an
    existing file) or the name of a discovered workflow.

    The run is committed as queued before this returns; a server is started if none runs.
    With --wait, waits for the run to end and exits 0 only if it completed; a run that is
    still not terminal after --timeout seconds exits 1, and so does one that stops until
    someone acts (paused, or parked: the error names why and `piwf run explain`).

    \b
    Example:
      piwf run start ./flows/hello.py --input '{"who": "Ada"}' --title greeting
      piwf run start ./flows/review.py --agent-command 'claude -p --mcp-config "$PIWF_MCP_CONFIG"'
      piwf run start ./flows/chat.py --session chat-1
    """
    run_input = _read_input(input_text, input_file)
    if timeout_s is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait")
    if session_id is not None and agent_command_text is not None:
        raise click.UsageError(f"--session and --agent-command: {SESSION_OR_AGENT_COMMAND}")
    agent_command = None
    if agent_command_text is not None:
        try:
            agent_command = split_agent_command(agent_command_text)
        except ValueError as error:
            raise click.UsageError(f"--agent-command: {error}") from None
    with open_client() as client:
        run = client.start_run(
            workflow,
            input=run_input,
            project=project,
            title=title,
            agent_command=agent_command,
            session=session_id,
        )
        if not wait:
            if as_json:
                render.emit_json({"run": run.to_wire()})
            else:
                click.echo(f"started {render.run_line(run)}")
            return
        if not as_json:
            click.echo(f"started {render.run_line(run)}; waiting")
        _wait_and_report(client, run.run_id, timeout_s, as_json=as_json)


_RUN_LIST_DEFAULT = 50


@run_group.command("list")
@click.option(
    "--limit",
    type=Integer(1, render.RUN_LIST_MOST),
    default=_RUN_LIST_DEFAULT,
    show_default=True,
    metavar="N",
    help="How many runs to show, newest first.",
)
@click.option(
    "--status",
    type=click.Choice(DISPLAY_STATUSES),
    default=None,
    help="Only runs with this display status.",
)
@click.option(
    "--before",
    metavar="RUN_ID",
    default=None,
    callback=id_check("run"),
    help="Only runs created before this one: the next page after a list that ended with it.",
)
@json_option
@command
def run_list(limit: int, status: str | None, before: str | None, as_json: bool) -> None:
    """List runs, newest first. When more runs exist than shown, the table ends with the
    command for the next page (--before the last run shown).

    \b
    Example:
      piwf run list --limit 10 --status waiting
      piwf run list --limit 10 --before run-2d98d9ee1d200bc95a28
    """
    same = [] if limit == _RUN_LIST_DEFAULT else ["--limit", str(limit)]  # for the next page
    same += [] if status is None else ["--status", status]
    if not as_json and before is None:
        listed = quick_list.list_runs(limit, status)
        if listed is not None:
            click.echo(render.run_page(listed, same))
            return
    with open_client() as client:
        cursor = None
        if before is not None:
            from piwf.protocol.payloads import RunCursor

            created_at = client.get_run(before, content_limit=0).run.created_at
            cursor = RunCursor(created_at=created_at, run_id=before)
        page = client.list_runs(limit=limit, before=cursor, status=status)
    if as_json:
        render.emit_json(page.to_wire())
    else:
        click.echo(render.run_page(page, same))


@run_group.command("show")
@run_id_argument
@click.option(
    "--follow",
    is_flag=True,
    help="Then print what happens (steps, the running node, requests) until the run ends.",
)
@json_option
@command
def run_show(run_id: str, follow: bool, as_json: bool) -> None:
    """Show one run: what it is doing now and what to do next, its steps, sources, effects,
    requests, decisions, and output or error.

    Long values are cut to a preview, and values above 1 MiB are not read (their size is
    shown); --json prints the complete document with every value in full, plus the run view's
    "display" and first page of "steps". --follow keeps printing the run's progress until it
    ends (a plain live view; Ctrl-C stops following, exit 130).

    \b
    Example:
      piwf run show run-0b9c --json
      piwf run show run-0b9c --follow
    """
    if follow and as_json:
        raise click.UsageError("--follow prints text; for JSON use `piwf run wait --json`")
    if follow:
        try:
            with sigterm_stops_waiting():
                _show_and_follow(run_id)
        except KeyboardInterrupt as stop:
            interrupted(as_json=False, stop=stop)
        return
    from piwf.cli import render_view  # not at import: `run list` and the others show no view

    with open_client() as client:
        view = client.run_view(
            run_id,
            step_limit=render_view.SHOWN_STEPS,
            content_limit=None if as_json else render.HUMAN_CONTENT_LIMIT,
        )
    if as_json:
        document = view.detail.to_wire()
        document["display"] = view.display.to_wire()
        document["steps"] = view.steps.to_wire()
        render.emit_json(document)
    else:
        click.echo(render.run_detail(view.detail))
        click.echo(render_view.now_lines(view))
        click.echo(
            render_view.steps_text(view.steps.steps, view.steps.total, run_id, all_shown=False)
        )


@run_group.command("steps")
@run_id_argument
@json_option
@command
def run_steps(run_id: str, as_json: bool) -> None:
    """List every finished step of a run in order: node, visit (and attempt), outcome, start,
    duration, and its output or error.

    --json prints the complete steps with every value, failure record and published update.

    \b
    Example:
      piwf run steps run-0b9c
    """
    from piwf.cli import render_view

    with open_client() as client:
        steps = client.run_steps(
            run_id, content_limit=None if as_json else render.HUMAN_CONTENT_LIMIT
        )
    if as_json:
        render.emit_json({"runId": run_id, "steps": [step.to_wire() for step in steps]})
    else:
        click.echo(render_view.steps_text(steps, len(steps), run_id, all_shown=True))


@run_group.command("explain")
@run_id_argument
@json_option
@command
def run_explain(run_id: str, as_json: bool) -> None:
    """Say why a run is not progressing (or that it is) and the command that moves it on:
    paused, waiting on which request, parked for which reason, every slot busy and by whom, a
    changed source file, an effect to resolve.

    \b
    Example:
      piwf run explain run-0b9c
    """
    from piwf.cli import render_view

    with open_client() as client:
        view = client.run_view(run_id, step_limit=1, content_limit=render.HUMAN_CONTENT_LIMIT)
    explanation = render_view.explain(view)
    if as_json:
        render.emit_json(explanation.to_json(view))
        return
    # The text quotes the run's own failure message: escaped, it stays one line.
    click.echo(f"{run_id}  {view.display.status}: {render.one_line(explanation.text)}")
    for line in explanation.commands:
        click.echo(f"  {line}")


@run_group.command("wait")
@run_id_argument
@click.option(
    "--timeout",
    "timeout_s",
    type=Seconds(),
    default=DEFAULT_WAIT_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="Give up after this long.",
)
@json_option
@command
def run_wait(run_id: str, timeout_s: float, as_json: bool) -> None:
    """Wait until a run is terminal; exit 0 only if it completed.

    A run that ended otherwise (failed, timed out, cancelled), is still not terminal after
    --timeout seconds, or stops until someone acts (paused, or parked runnerNoProgress,
    sourceChanged, effectAmbiguous ...: the wait ends at once, naming the reason and `piwf run
    explain`) exits 1; with --json the document is {"run": ..., "timedOut": ...} in every one
    of these cases, with the complete "output" or "error" of a terminal run and the
    "parkedReason" of a parked one. A run waiting on a request or a timer is waited for.

    \b
    Example:
      piwf run wait run-0b9c --timeout 60
    """
    with sigterm_stops_waiting(), open_client() as client:
        _wait_and_report(client, run_id, timeout_s, as_json=as_json)


def _control_command(
    name: Literal["pause", "resume", "restart"], verb: str, unchanged: str, summary: str
) -> None:
    """Register ``piwf run NAME RUN_ID [--json]``: print ``VERB <run>`` when the command
    changed the run, ``UNCHANGED <run>`` when there was nothing to do."""

    @run_group.command(name, help=f"{summary}\n\n\b\nExample:\n  piwf run {name} run-0b9c")
    @run_id_argument
    @json_option
    @command
    def control(run_id: str, as_json: bool) -> None:
        with open_client() as client:
            receipt = client.run_control_receipt(name, run_id)
        _report_control(receipt, verb, unchanged, as_json=as_json)


def _report_control(receipt: RunReceipt, verb: str, unchanged: str, *, as_json: bool) -> None:
    if as_json:
        render.emit_json({"run": receipt.run.to_wire(), "outcome": receipt.outcome})
    elif receipt.outcome == "unchanged":
        click.echo(f"{unchanged} {render.run_line(receipt.run)}")
    else:
        click.echo(f"{verb} {render.run_line(receipt.run)}")


_control_command(
    "pause",
    "paused",
    "already paused, nothing changed:",
    "Pause a run: park it at its last boundary and stop its child.\n\n"
    "Work the pause stopped midway runs again after `piwf run resume`, except a manual"
    " effect that was applying: nothing can tell whether it took place, so the resume parks"
    " the run with that effect ambiguous until `piwf effect resolve` says what happened"
    " (an idempotent effect is simply applied again).",
)
_control_command(
    "resume",
    "resumed",
    "nothing to resume (the run is neither paused nor parked by an error):",
    "Resume a paused or parked run from its last committed boundary.",
)
_control_command(
    "restart",
    "restarted as",
    "already restarted as",
    "Start a fresh run of a finished run's workflow, from its first node.",
)


@run_group.command("fork")
@run_id_argument
@click.option(
    "--from",
    "from_node",
    required=True,
    metavar="NODE",
    help="The node the new run starts at: its full path, as 'piwf run steps' shows it.",
)
@json_option
@command
def run_fork(run_id: str, from_node: str, as_json: bool) -> None:
    """Start a new run of a run's recorded sources at NODE, with the outputs it had before.

    The steps the run finished before NODE's first visit are copied into the new run, so
    nothing before NODE runs again; NODE and what follows it run anew. Refused while the run
    executes or has an unsettled effect, and for a node the run never reached.

    \b
    Example:
      piwf run fork run-0b9c --from review
    """
    # The server's refusal never repeats the node it was sent; name what was given.
    with (
        naming_given(f"fork from node {given(from_node)} refused", RejectedError),
        open_client() as client,
    ):
        run = client.fork_run(run_id, from_node=from_node)
    if as_json:
        render.emit_json({"run": run.to_wire()})
    else:
        click.echo(f"forked as {render.run_line(run)}")


@run_group.command("cancel")
@run_id_argument
@json_option
@command
def run_cancel(run_id: str, as_json: bool) -> None:
    """Cancel a run that is not terminal yet.

    \b
    Example:
      piwf run cancel run-0b9c
    """
    with open_client() as client:
        receipt = client.run_control_receipt("cancel", run_id)
    _report_control(receipt, "cancelled", "already cancelled, nothing changed:", as_json=as_json)


def _show_and_follow(run_id: str) -> None:
    """``run show`` once, then the run's progress on stdout until it is terminal."""
    from piwf.cli import render_view

    with open_client() as client:
        view = client.run_view(
            run_id, step_limit=render_view.SHOWN_STEPS, content_limit=render.HUMAN_CONTENT_LIMIT
        )
        click.echo(render.run_detail(view.detail))
        click.echo(render_view.now_lines(view))
        click.echo(
            render_view.steps_text(view.steps.steps, view.steps.total, run_id, all_shown=False)
        )
        if view.detail.run.finished_at is not None:
            return
        click.echo("following (Ctrl-C stops):")
        progress = RunProgress(client, run_id, click.echo)
        progress.seen_steps_of(view)
        receipt = progress.wait(None, content_limit=render.HUMAN_CONTENT_LIMIT)
        click.echo(render.run_line(receipt.run))
        if receipt.output is not None or receipt.output_ref is not None:
            click.echo(f"output: {render.value_preview(receipt.output, receipt.output_ref)}")
        elif receipt.error is not None:
            click.echo(f"error: {render.printable(receipt.error)}")


def _stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # closed or replaced
        return False


def _read_input(text: str | None, file: IO[bytes] | None) -> Any:
    """Parse --input or --input-file (usage errors, exit 2); None when neither is given."""
    if text is not None and file is not None:
        raise click.UsageError("give --input or --input-file, not both")
    data: str | bytes
    if text is not None:
        option, data = "--input", text
    elif file is not None:
        option, data = "--input-file", file.read()
    else:
        return None
    return parse_json(data, option)


def _wait_and_report(
    client: Client, run_id: str, timeout_s: float | None, *, as_json: bool
) -> None:
    """Wait for the run, print it, and exit 1 unless it completed."""
    limit = DEFAULT_WAIT_TIMEOUT_S if timeout_s is None else timeout_s
    # The human form previews the output, so it reads none of a very large one.
    content_limit = None if as_json else render.HUMAN_CONTENT_LIMIT
    with sigterm_stops_waiting():
        if not as_json and _stderr_is_a_terminal():
            echo = lambda line: click.echo(line, err=True)  # noqa: E731
            receipt = RunProgress(client, run_id, echo).wait(limit, content_limit=content_limit)
        else:
            receipt = client.wait_run(run_id, timeout_s=limit, content_limit=content_limit)
    run = receipt.run
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(render.run_line(run))
        if run.status == _SUCCESS_STATUS and (
            receipt.output is not None or receipt.output_ref is not None
        ):
            click.echo(f"output: {render.value_preview(receipt.output, receipt.output_ref)}")
    if receipt.timed_out:
        if not as_json:
            click.echo(
                f"Error: run {run.run_id} is still {render.run_status(run)} after {limit:g} s; "
                f"it keeps going. Wait again: piwf run wait {run.run_id} (what it waits on: "
                f"piwf run explain {run.run_id})",
                err=True,
            )
        raise click.exceptions.Exit(1)
    if run.needs_action:  # not timed out, not terminal: it waits for an operator
        if not as_json:
            click.echo(f"Error: {_needs_action_text(receipt)}", err=True)
        raise click.exceptions.Exit(1)
    if run.status != _SUCCESS_STATUS:
        if not as_json:
            detail = f" ({run.error_code})" if run.error_code else ""
            error = f": {render.printable(receipt.error)}" if receipt.error else ""
            click.echo(f"Error: run {run.run_id} ended {run.status}{detail}{error}", err=True)
            if receipt.failure is not None:
                click.echo(f"The failed node's record: piwf run show {run.run_id}", err=True)
            if run.error_code == "inputRejected":
                click.echo(
                    "The workflow refused the run's input, and a restart would give it the same"
                    " input: start a new run with a corrected input: piwf run start"
                    f" {shlex.quote(run.workflow_ref)} --input JSON",
                    err=True,
                )
        raise click.exceptions.Exit(1)


def _needs_action_text(receipt: RunWaitReceipt) -> str:
    """Why a waited-for run stopped short of its end, and the command that says what to do."""
    run = receipt.run
    why = "is paused" if run.paused else f"is parked {run.error_code or ''}".rstrip()
    reason = f": {receipt.parked_reason}" if receipt.parked_reason else ""
    return (
        f"run {run.run_id} {why}{reason}; it will not go on until someone acts "
        f"(what to do: piwf run explain {run.run_id})"
    )
