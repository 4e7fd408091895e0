"""``piwf requests``, ``piwf answer``, ``piwf submit`` and ``piwf update``: what waiting runs
wait on, and answering it (a checkpoint or decision) or submitting to it (an agent step)."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

import click

from piwf.cli import render, render_agents
from piwf.cli.common import (
    command,
    id_check,
    interrupted,
    json_option,
    open_client,
    parse_json,
    request_id_argument,
    sigterm_stops_waiting,
)
from piwf.protocol.payloads import OpenRequestInfo

#: What a stopped ``piwf submit`` leaves as it was, said to the person who stopped it.
_SUBMISSION_GOES_ON = (
    "only this command stopped: an output it had sent is validated all the same and keeps its"
    " outcome (piwf submit {0} with the same output again reports it, or submits it if it"
    " never arrived)"
)


@click.command("requests")
@click.option(
    "--run",
    "run_id",
    default=None,
    metavar="RUN_ID",
    callback=id_check("run"),
    help="Only this run's requests.",
)
@json_option
@command
def requests_command(run_id: str | None, as_json: bool) -> None:
    """List pending checkpoints, decisions and agent requests, oldest first.

    Answer a checkpoint or decision with `piwf answer REQUEST_ID RESPONSE_JSON`; submit an
    agent step's output with `piwf submit REQUEST_ID OUTPUT_JSON`. Below the table, each
    checkpoint and decision shows what it asks (its content) and its choices; agent requests
    show the first lines of their prompt, the expected output, their active-time deadline, how many
    outputs were submitted and the latest rejection. The remaining
    active time counts only while the step's agent works.

    \b
    Example:
      piwf requests --run run-0b9c
    """
    with open_client() as client:
        limit = None if as_json else render.HUMAN_CONTENT_LIMIT
        found = client.list_requests(run_id, content_limit=limit)
    if as_json:
        render.emit_json({"requests": [item.to_wire() for item in found]})
        return
    click.echo(render.request_table(found))
    for details in (answerable_requests_text(found), render_agents.agent_requests_text(found)):
        if details is not None:
            click.echo(details)


def answerable_requests_text(requests: Sequence[OpenRequestInfo]) -> str | None:
    """The pending checkpoints and decisions, one block each with what they ask (the content a
    person answers on: a plan to approve, say) and their choices; None when there are none."""
    answerable = [item for item in requests if item.kind != "agent"]
    if not answerable:
        return None
    return "checkpoints and decisions:\n" + "\n".join(
        render.request_fields(item) for item in answerable
    )


#: A word as a choice name is spelt: what a person types after reading "choose ship".
_BARE_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


def stdin_if_dash(value: str, param_hint: str) -> str | bytes:
    """``value``, or for ``-`` what stdin holds. On a terminal a line on stderr says that it
    reads and how to end (a silent wait looks like a hang); stdin with no JSON in it (nothing
    piped in) is a usage error that says so, before anything is sent."""
    if value != "-":
        return value
    if sys.stdin.isatty():
        click.echo(f"reading {param_hint} from stdin: type it, then Ctrl-D", err=True)
    data = sys.stdin.buffer.read()
    if not data.strip():
        raise click.BadParameter(
            "'-' reads it from stdin, which was empty: "
            "pipe the JSON in, or give it as the argument",
            param_hint=param_hint,
        )
    return data


@click.command("answer")
@request_id_argument
@click.argument("response_json", metavar="RESPONSE_JSON")
@json_option
@command
def answer_command(request_id: str, response_json: str, as_json: bool) -> None:
    """Answer one exact pending request as a person (decision.answer).

    RESPONSE_JSON is the answer as JSON text ('-' reads it from stdin); a decision takes
    {"choice": NAME, ...} with one
    of its declared choices, plus the text input that choice carries, if any (piwf requests
    shows it). An agent step's request is not answered but submitted to (`piwf submit`). The
    first valid answer wins; a later different answer reports the recorded winner
    (already_resolved) and changes nothing.

    \b
    Example:
      piwf answer request-5d1e '{"choice": "ship"}'
      piwf answer request-5d1e '{"choice": "replan", "instructions": "split step 2"}'
      echo '{"choice": "ship"}' | piwf answer request-5d1e -
    """
    text = stdin_if_dash(response_json, "RESPONSE_JSON")
    bare = (text if isinstance(text, str) else text.decode("utf-8", "replace")).strip()
    if _BARE_WORD.match(bare) and bare not in ("true", "false", "null"):
        raise click.BadParameter(
            f"the answer is JSON, not a bare word: a decision takes "
            f"""'{{"choice": "{bare}"}}', a checkpoint any JSON value ('"{bare}"' for a string)""",
            param_hint="RESPONSE_JSON",
        )
    response = parse_json(text, "RESPONSE_JSON")
    with open_client() as client:
        receipt = client.answer(request_id, response)
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(render.answer_receipt(receipt))


@click.command("submit")
@request_id_argument
@click.argument("output_json", metavar="OUTPUT_JSON")
@json_option
@command
def submit_command(request_id: str, output_json: str, as_json: bool) -> None:
    """Submit an agent step's output for one exact request and wait for its validation.

    OUTPUT_JSON is the output as JSON text ('-' reads it from stdin). The step's validate runs
    in a supervised child; this waits until the outcome is durable. Accepted: the step
    completes with the output (as validate normalised it), exit 0. Rejected: exit 1 with the
    error validate gave; the request stays pending, so fix the output and submit again.

    \b
    Example:
      piwf submit request-2b1c '{"summary": "The moon pulls the sea."}'
      echo '{"summary": "..."}' | piwf submit request-2b1c -
    """
    text = stdin_if_dash(output_json, "OUTPUT_JSON")
    output = parse_json(text, "OUTPUT_JSON")
    try:
        with sigterm_stops_waiting(), open_client() as client:
            receipt = client.submit(request_id, output)
    except KeyboardInterrupt as stop:
        # It may have stopped while the output was validated: that goes on and keeps its
        # outcome, which the same output submitted again reports.
        interrupted(as_json=as_json, stop=stop, goes_on=_SUBMISSION_GOES_ON.format(request_id))
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(render_agents.submission_receipt(receipt))


@click.command("update")
@request_id_argument
@click.argument("data_json", metavar="JSON")
@json_option
@command
def update_command(request_id: str, data_json: str, as_json: bool) -> None:
    """Record a progress update on an agent request without completing it.

    JSON is any JSON value ('-' reads it from stdin), kept as the latest update of the
    request's attempt; the request stays pending.

    \b
    Example:
      piwf update request-2b1c '{"status": "reading the files", "completed": 2, "total": 5}'
    """
    text = stdin_if_dash(data_json, "JSON")
    data = parse_json(text, "JSON")
    with open_client() as client:
        receipt = client.update(request_id, data)
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(f"{receipt.request_id}: update recorded")
