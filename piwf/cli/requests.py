"""``piwf requests`` and ``piwf answer``: what waiting runs wait on, and answering it."""

from __future__ import annotations

import click

from piwf.cli import render
from piwf.cli.common import command, json_option, open_client, parse_json


@click.command("requests")
@click.option("--run", "run_id", default=None, metavar="RUN_ID", help="Only this run's requests.")
@json_option
@command
def requests_command(run_id: str | None, as_json: bool) -> None:
    """List pending checkpoints and decisions with their choices and deadlines.

    An agent step's request shows its remaining active time (its deadline counts only while
    its agent works).

    Answer one with `piwf answer REQUEST_ID RESPONSE_JSON`.

    \b
    Example:
      piwf requests --run run-0b9c
    """
    with open_client() as client:
        # The table shows no content, so the human form reads no referenced prompt.
        found = client.list_requests(run_id, content_limit=None if as_json else 0)
    if as_json:
        render.emit_json({"requests": [item.to_wire() for item in found]})
    else:
        click.echo(render.request_table(found))


@click.command("answer")
@click.argument("request_id")
@click.argument("response_json", metavar="RESPONSE_JSON")
@json_option
@command
def answer_command(request_id: str, response_json: str, as_json: bool) -> None:
    """Answer one exact pending request as a person (decision.answer).

    RESPONSE_JSON is the answer as JSON text; a decision takes {"choice": NAME, ...} with one
    of its declared choices. The first valid answer wins; a later different answer reports the
    recorded winner (already_resolved) and changes nothing.

    \b
    Example:
      piwf answer req-5d1e '{"choice": "ship"}'
    """
    response = parse_json(response_json, "RESPONSE_JSON")
    with open_client() as client:
        receipt = client.answer(request_id, response)
    if as_json:
        render.emit_json(receipt.to_wire())
    else:
        click.echo(render.answer_receipt(receipt))
