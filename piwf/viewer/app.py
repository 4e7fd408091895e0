"""The viewer application: the run list, and a run's screen above it when one is opened."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType

from piwf.client import Client
from piwf.protocol.payloads import AnswerReceipt, OpenRequestInfo, RunInfo
from piwf.protocol.view_payloads import RunView, Step
from piwf.viewer.run_list import RunListScreen
from piwf.viewer.run_screen import RunScreen


@dataclass(frozen=True)
class Wording:
    """How the viewer words what it shows: the CLI's renderers (``piwf/cli/render_view.py``),
    passed in so the viewer and ``piwf run show`` / ``run explain`` always agree.

    ``explain``: the one-line "why is the run where it is, and what to run next";
    ``run_status``: a run's STATUS cell as ``piwf run list`` shows it (marked ``(paused)``, or
    ``(needs action: …)`` while it waits for an operator or a person's answer);
    ``step_cells``: a step's NODE, VISIT, OUTCOME, STARTED, TOOK and RESULT cells;
    ``timestamp``: a time in milliseconds since the epoch as local time;
    ``one_line``: stored text (a reason, a branch's case, an error) safe to show in one line;
    ``log_text``: what a node printed, safe to show with its line breaks and tabs;
    ``request``: what a pending request asks, in lines (its choices, how to answer them, its
    content), as ``piwf run show`` shows it under "waiting on";
    ``answer_receipt``: what an answer did and the recorded winner, as ``piwf answer`` says it.

    The last two show each control character as its escape (``\x1b``, ``\u202e``): text a
    workflow or a node wrote must never reach the terminal as an escape sequence or a
    bidirectional control, which would drive the terminal or reorder what it shows.
    """

    explain: Callable[[RunView], str]
    run_status: Callable[[RunInfo], str]
    step_cells: Callable[[Step], Sequence[str]]
    timestamp: Callable[[int | None], str]
    one_line: Callable[[str], str]
    log_text: Callable[[str], str]
    request: Callable[[OpenRequestInfo], str]
    answer_receipt: Callable[[AnswerReceipt], str]


class ViewerApp(App[None]):
    """``piwf view [RUN_ID]``: the run list; with ``run_id``, that run's screen on top of it
    (Esc goes back to the list, q quits from anywhere).

    ``client`` is used from worker threads (it is thread-safe) and is not closed here: the
    caller owns it.
    """

    TITLE = "piwf view"
    # Ctrl-C quits as in any terminal program (Textual's own Ctrl-C only says to press Ctrl-Q).
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
    ]

    def __init__(self, client: Client, wording: Wording, run_id: str | None = None) -> None:
        super().__init__()
        self.client = client
        self.wording = wording
        self._initial_run = run_id

    def on_mount(self) -> None:
        self.push_screen(RunListScreen())
        if self._initial_run is not None:
            self.open_run(self._initial_run)

    def _fatal_error(self) -> None:
        """Textual's exit on an unhandled exception, with the traceback kept and its local
        variables left out: they hold what the viewer showed (run inputs, outputs, answers),
        which must not reach the terminal or a bug report by accident. ``piwf view`` then
        exits 1 (``return_code``)."""
        from rich.segment import Segments  # rich comes with textual
        from rich.traceback import Traceback

        self.bell()
        traceback = Traceback(show_locals=False, width=None)
        self._exit_renderables.append(
            Segments(self.console.render(traceback, self.console.options))
        )
        self._close_messages_no_wait()

    def open_run(self, run_id: str) -> None:
        """Show one run's screen, live, above the current one."""
        self.push_screen(RunScreen(run_id))
