"""``piwf view [RUN_ID]``: the live terminal viewer (extra: ``piwf[view]``, on Textual).

The one module of the CLI that reaches :mod:`piwf.viewer`, and only inside the command, so the
base install never imports Textual. It hands the viewer the CLI's own wording
(:func:`wording`), so the viewer and ``run show`` / ``run explain`` say the same thing. With
``--remote ws://127.0.0.1:PORT`` its client talks to a ``piwf relay`` (through an SSH tunnel)
instead of this state home's socket; everything above the client is the same.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import click

from piwf.cli import render, render_view, safe_text
from piwf.cli.common import command, id_check, json_option, open_client
from piwf.client.websocket import MISSING_WEBSOCKETS, check_remote_url
from piwf.errors import MissingExtraError
from piwf.protocol.view_payloads import RunView

if TYPE_CHECKING:
    from piwf.viewer import Wording

MISSING_TEXTUAL = (
    "piwf view needs the view extra: pip install 'piwf[view]'"
    " (with the base install, `piwf run show RUN --follow` is a plain live view)"
)

MISSING_BOTH = "piwf view --remote needs the view and relay extras: pip install 'piwf[view,relay]'"


def _check_remote(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_remote_url(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


@click.command("view")
@click.argument("run_id", metavar="[RUN_ID]", required=False, callback=id_check("run"))
@click.option(
    "--remote",
    metavar="ws://127.0.0.1:PORT",
    default=None,
    callback=_check_remote,
    help="Watch the server behind a `piwf relay` (the local end of an SSH tunnel).",
)
@json_option
@command
def view_command(run_id: str | None, remote: str | None, as_json: bool) -> None:
    """Watch runs live in the terminal (extra: piwf[view]).

    The run list (Enter opens a run), or with RUN_ID that run: its status and what it is
    doing, its steps, the selected step's log (l: every log) and its controls: p pause,
    r resume, c cancel (asks y/n), a answers the waiting checkpoint or decision in a form
    showing its choices or content (asks y/n before it sends; an
    agent step shows its `piwf submit` command). Esc goes back, q or Ctrl-C quits.
    Without the extra, `piwf run show RUN --follow` is a plain live view. --remote watches
    another machine's server through `piwf relay` and an SSH tunnel (docs/REMOTE.md).

    \b
    Example:
      piwf view run-0b9c
    """
    try:
        from piwf.viewer import ViewerApp
    except ImportError as error:
        if (error.name or "textual").partition(".")[0] != "textual":
            raise
        if remote is not None and importlib.util.find_spec("websockets") is None:
            raise MissingExtraError(MISSING_BOTH) from None  # one install line, not two in turn
        raise MissingExtraError(MISSING_TEXTUAL) from None
    if remote is not None and importlib.util.find_spec("websockets") is None:
        raise MissingExtraError(MISSING_WEBSOCKETS)  # before --json's refusal: it shapes this
    if as_json:
        raise click.UsageError("piwf view is interactive; for JSON use `piwf run show RUN --json`")
    if remote is None:
        # A server is started when none runs, once, as the screen opens (as the run commands
        # start one). The viewer's own client never starts one: a server stopped under it
        # (`piwf server stop`, before a `state restore`) stays stopped, and the screens say
        # they cannot reach it until one runs again.
        with open_client() as starter:
            starter.connect()
    with open_client(autostart=False, remote=remote) as client:
        if remote is not None:
            client.connect()  # an unreachable relay or server: exit 1 before the screen opens
        if run_id is not None:
            client.run_view(run_id, step_limit=1)  # an unknown run: NotFoundError, exit 1
        app = ViewerApp(client, wording(), run_id)
        app.run()
    if app.return_code:  # an unexpected error ended it: its traceback (no values) is above
        click.echo(
            "Error: piwf view stopped on an unexpected error (the traceback above); the runs"
            " go on as they were: `piwf run list` and `piwf run show RUN` show them",
            err=True,
        )
        raise SystemExit(1)


def wording() -> Wording:
    """The CLI's renderers as the viewer's :class:`~piwf.viewer.Wording`."""
    from piwf.viewer import Wording

    return Wording(
        explain=explanation_line,
        run_status=render.run_status,
        step_cells=render_view.step_cells,
        timestamp=render.timestamp,
        one_line=safe_text.one_line,
        log_text=safe_text.log_text,
        request=render.request_fields,
        answer_receipt=render.answer_receipt,
    )


#: The most characters of the explanation the viewer shows; a longer one (a failure message
#: of thousands of characters) is cut, so the steps and the log keep their place on the screen.
EXPLANATION_CHARS = 300


def explanation_line(view: RunView) -> str:
    """``run explain`` in one line: why the run is where it is, then the commands to run. An
    explanation above :data:`EXPLANATION_CHARS` is cut and says where the whole of it is."""
    explanation = render_view.explain(view)
    text = render.one_line(explanation.text)
    if len(text) > EXPLANATION_CHARS:
        run_id = view.detail.run.run_id
        text = text[:EXPLANATION_CHARS] + f"… (cut; all of it: piwf run explain {run_id})"
    commands = "; ".join(explanation.commands)
    return text + (f"  next: {commands}" if commands else "")
