"""One run, live: its display, the explanation, its steps, a log pane and its controls.

The screen follows the run with :meth:`piwf.Client.watch_run` in a worker thread (the
client blocks) and posts each new view to the UI thread; after the run's final state it keeps
showing it. Everything it shows of the run's state is the view's ``display``, as the server
derived it; a control key works only when ``display.controls`` offers that control.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, ClassVar, Final, cast

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Log, Static
from textual.worker import get_current_worker

from piwf.canonical import JsonValue
from piwf.client.logs import MISSING_LOG_NOTE
from piwf.errors import PiwfError, ServerNotRunningError
from piwf.protocol.view_payloads import (
    MAX_STEP_PAGE_ITEMS,
    Control,
    Display,
    RunView,
    Step,
    StepPage,
)
from piwf.viewer.answer import AnswerScreen
from piwf.viewer.graph import graph_lines

if TYPE_CHECKING:
    from piwf.client.logs import AttemptLog
    from piwf.viewer.app import ViewerApp

#: A watch that hears nothing for this long is renewed, so that a closed screen's worker
#: notices it was cancelled within this time (a blocked read cannot be interrupted).
WAKE_S: Final = 1.0
#: How long the follower waits before it tries again after the server could not be reached.
RETRY_S: Final = 1.0
#: The steps table shows at most this many steps, the newest (a view's own page holds the
#: oldest :data:`MAX_STEP_PAGE_ITEMS`; the rest are read page by page, once each).
MAX_SHOWN_STEPS: Final = 5000
#: While the run runs, the log pane showing every attempt's log is read again this often (a
#: node's output changes no revision, so no new view would bring it).
LOG_REFRESH_S: Final = 1.0
#: The log pane keeps at most this many of the latest lines.
LOG_LINES: Final = 2000
#: The most characters of a stored reason the header shows (a reason may hold 16 KiB).
REASON_CHARS: Final = 200
#: The controls an answer key stands for: each is settled with the request's own command.
ANSWERS: Final[frozenset[Control]] = frozenset({"answer", "humanAnswer", "submit", "update"})


def literal(text: str) -> Text:
    """``text`` as a table cell shows it, character for character.

    A ``str`` cell would be read as Rich markup: a stored value such as ``"[/bold]"`` would
    crash the viewer, and ``"[red]"`` would restyle it.
    """
    return Text(text, end="")


class ConfirmCancel(ModalScreen[bool]):
    """Ask before cancelling: y cancels the run, n or Esc keeps it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes, cancel it"),
        Binding("n", "answer(False)", "no"),
        Binding("escape", "answer(False)", "no", show=False),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def compose(self) -> ComposeResult:
        yield Static(f"Cancel run {self.run_id}? (y/n)", id="confirm", markup=False)
        yield Footer()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


#: The steps table's columns.
STEP_COLUMNS = ("#", "NODE", "VISIT", "OUTCOME", "STARTED", "TOOK", "RESULT")


class RunScreen(Screen[None]):
    """The live screen of one run (module docstring); Esc goes back to the run list."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "pause", "pause"),
        Binding("r", "resume", "resume"),
        Binding("c", "cancel", "cancel"),
        Binding("a", "answer", "answer"),
        Binding("l", "toggle_logs", "step log / all logs"),
        Binding("escape", "back", "back"),
    ]

    DEFAULT_CSS = """
    RunScreen #run-status { height: auto; max-height: 6; padding: 0 1; background: $boost; }
    RunScreen #explain { height: auto; max-height: 8; padding: 0 1; color: $text-muted; }
    RunScreen #graph { height: auto; max-height: 12; padding: 0 1; }
    RunScreen #steps { height: 1fr; }
    RunScreen #log-title { padding: 0 1; background: $boost; }
    RunScreen #log { height: 1fr; }
    RunScreen #message { height: auto; padding: 0 1; color: $warning; }
    """

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.view: RunView | None = None
        self._steps: list[Step] = []
        #: Every finished step read so far, in order (a finished step never changes).
        self._read_steps: list[Step] = []
        self._all_logs = False
        #: The lines the log pane shows now.
        self._log_lines: list[str] = []

    @property
    def viewer(self) -> ViewerApp:
        return cast("ViewerApp", self.app)

    def compose(self) -> ComposeResult:
        yield Static(f"{self.run_id}  loading…", id="run-status", markup=False)
        yield Static("", id="explain", markup=False)
        yield Static("", id="graph", markup=False)
        table: DataTable[str] = DataTable(id="steps", cursor_type="row", zebra_stripes=True)
        yield table
        yield Static("log", id="log-title", markup=False)
        yield Log(id="log", max_lines=LOG_LINES)
        yield Static("", id="message", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.follow()
        self.set_interval(LOG_REFRESH_S, self._refresh_live_log)

    # -- following the run -------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="follow")
    def follow(self) -> None:
        """Show every new view of the run until its final one (in a worker thread)."""
        worker = get_current_worker()

        def cancelled() -> bool:
            return worker.is_cancelled

        shown: int | None = None
        unreachable = False  # "cannot follow the run" is shown until a view comes again
        while not cancelled():
            views = self.viewer.client.watch_run(
                self.run_id, step_limit=MAX_STEP_PAGE_ITEMS, idle_timeout_s=WAKE_S
            )
            try:
                for view in views:
                    if cancelled():
                        return
                    if unreachable:
                        unreachable = False
                        self.app.call_from_thread(self.say, "")
                    if view.revision != shown:
                        shown = view.revision
                        whole = self._with_every_step(view)
                        self.app.call_from_thread(self.show_view, whole)
                    if view.detail.run.finished_at is not None:
                        return
            except TimeoutError:
                continue  # nothing changed: renew the watch (WAKE_S)
            except PiwfError as error:
                if cancelled():
                    return
                problem = unreachable_text(error, remote=self.viewer.client.remote is not None)
                self.app.call_from_thread(self.say, f"cannot follow the run: {problem}")
                unreachable = True
                threading.Event().wait(RETRY_S)
            finally:
                if isinstance(views, Generator):
                    views.close()  # ends the subscription on the server now

    def _with_every_step(self, view: RunView) -> RunView:
        """``view`` with every finished step of the run, up to the newest
        :data:`MAX_SHOWN_STEPS` (in the worker thread). A view carries the first page only;
        the steps after it are read once each (``run_steps`` after the last one read), so a
        long run's table and graph show where the run is now, not where it was at step 200."""
        page = view.steps
        if page.next_cursor is None:
            self._read_steps = list(page.steps)
            return view
        if len(self._read_steps) < len(page.steps):
            self._read_steps = list(page.steps)
        self._read_steps += self.viewer.client.run_steps(
            self.run_id, after=self._read_steps[-1].index, page_limit=MAX_STEP_PAGE_ITEMS
        )
        self._read_steps = self._read_steps[-MAX_SHOWN_STEPS:]
        steps = StepPage(steps=list(self._read_steps), total=page.total)
        return view.model_copy(update={"steps": steps})

    def show_view(self, view: RunView) -> None:
        """Show one view: header, explanation, steps; then read the log pane again."""
        self.view = view
        wording = self.viewer.wording
        self.query_one("#run-status", Static).update(header_text(view, wording.one_line))
        self.query_one("#explain", Static).update(wording.one_line(wording.explain(view)))
        graph = "\n".join(map(wording.one_line, graph_lines(view)))
        self.query_one("#graph", Static).update(graph)
        table = self.query_one("#steps", DataTable)
        cursor = table.cursor_row
        self._steps = list(view.steps.steps)
        # Columns are added again with the rows: a cleared table keeps the widths its columns
        # had, which would cut every cell to its header's width.
        table.clear(columns=True)
        for label in STEP_COLUMNS:
            table.add_column(label, key=label)
        for step in self._steps:
            cells = self.viewer.wording.step_cells(step)
            table.add_row(literal(str(step.index + 1)), *map(literal, cells), key=str(step.index))
        if self._steps:
            table.move_cursor(row=min(max(cursor, 0), len(self._steps) - 1))
        self.load_logs()

    # -- the log pane ------------------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if not self._all_logs:
            self.load_logs()

    def action_toggle_logs(self) -> None:
        self._all_logs = not self._all_logs
        self.load_logs()

    def _selected_step(self) -> Step | None:
        table = self.query_one("#steps", DataTable)
        if self._all_logs or not self._steps or not 0 <= table.cursor_row < len(self._steps):
            return None
        return self._steps[table.cursor_row]

    def load_logs(self) -> None:
        step = self._selected_step()
        title = (
            f"log of {step.path} (visit {step.visit}, attempt {step.attempt}); l: all logs"
            if step is not None
            else "log of every attempt; l: the selected step's"
        )
        self.query_one("#log-title", Static).update(title)
        self._read_logs(step)

    @work(thread=True, exclusive=True, group="logs")
    def _read_logs(self, step: Step | None) -> None:
        try:
            logs = self.viewer.client.read_run_logs(
                self.run_id, node=step.path if step is not None else None
            )
        except PiwfError as error:
            self.app.call_from_thread(self._show_log, [f"(no log: {error})"])
            return
        wanted = None if step is None else (step.visit, step.attempt)
        attempts = [
            attempt
            for attempt in logs.attempts
            if wanted is None or (attempt.info.visit, attempt.info.attempt) == wanted
        ]
        if not get_current_worker().is_cancelled:
            lines = log_lines(attempts, whole=step is None, safe=self.viewer.wording.log_text)
            self.app.call_from_thread(self._show_log, lines)

    def _refresh_live_log(self) -> None:
        """Read the log pane again while it shows every attempt (or no step is chosen) and
        the run has not finished: the running node's output comes live."""
        if self.view is None or self.view.detail.run.finished_at is not None:
            return
        if self._all_logs or not self._steps:
            self._read_logs(None)

    def _show_log(self, lines: list[str]) -> None:
        shown = lines or ["(nothing written)"]
        if shown == self._log_lines:
            return  # unchanged: keep where the reader has scrolled to
        self._log_lines = shown
        log = self.query_one("#log", Log)
        log.clear()
        log.write_lines(shown)

    # -- controls ----------------------------------------------------------------------------

    def _allowed(self, control: Control) -> bool:
        """True when the display offers ``control``; else say why the key does nothing."""
        if self.view is None:
            self.say(f"{control}: the run is not loaded yet")
            return False
        display = self.view.display
        if control in display.controls:
            return True
        offered = ", ".join(display.controls)
        self.say(
            f"{control} is not possible now: the run is {display.status}"
            + (f" (possible: {offered})" if offered else " (nothing can be done to it now)")
        )
        return False

    def action_pause(self) -> None:
        if self._allowed("pause"):
            self._control("pause")

    def action_resume(self) -> None:
        if self._allowed("resume"):
            self._control("resume")

    def action_cancel(self) -> None:
        if self._allowed("cancel"):

            def confirmed(yes: bool | None) -> None:
                if yes:
                    self._control("cancel")
                else:
                    self.say("not cancelled")

            self.app.push_screen(ConfirmCancel(self.run_id), confirmed)

    def action_answer(self) -> None:
        display = self.view.display if self.view is not None else None
        if display is None or display.waiting_on is None:
            status = display.status if display is not None else "not loaded yet"
            self.say(f"answer is not possible now: the run is {status} (no request waits)")
            return
        if not ANSWERS & set(display.controls):  # a request waits, but the run takes no answer
            offered = ", ".join(display.controls) or "nothing"
            self.say(
                f"answer is not possible now: the run is {display.status} (possible: {offered})"
                + ("; resume it first (r)" if "resume" in display.controls else "")
            )
            return
        waiting = display.waiting_on
        if waiting.action not in ("answer", "humanAnswer"):
            self.say(f"an agent's output is submitted from a shell: {waiting.command}")
            return
        wording = self.viewer.wording
        request = self.view.detail.waiting_on if self.view is not None else None
        about = wording.request(request) if request is not None else ""
        about = "\n".join(map(wording.one_line, about.split("\n")))

        def send(value: JsonValue) -> str:  # in the form's worker thread
            # Worded as `piwf answer` says it, not the receipt's outcome code ("won").
            return wording.answer_receipt(self.viewer.client.answer(waiting.request_id, value))

        def answered(said: str | None) -> None:
            self.say("not answered" if said is None else said)

        form = AnswerScreen(waiting, about, one_line=wording.one_line, send=send)
        self.app.push_screen(form, answered)

    def action_back(self) -> None:
        self.app.pop_screen()

    @work(thread=True, group="controls")
    def _control(self, control: Control) -> None:
        client = self.viewer.client
        calls = {
            "pause": client.pause_run,
            "resume": client.resume_run,
            "cancel": client.cancel_run,
        }
        try:
            calls[control](self.run_id)
        except PiwfError as error:
            self.app.call_from_thread(self.say, f"{control} failed: {error}")
            return
        self.app.call_from_thread(self.say, f"{control}: done")

    def say(self, text: str) -> None:
        """Show one line above the key bindings (why a key did nothing, what a control did)."""
        self.query_one("#message", Static).update(self.viewer.wording.one_line(text))


def unreachable_text(error: PiwfError, *, remote: bool = False) -> str:
    """Why a screen cannot reach the server, in a viewer user's words: a server that is not
    running is started with ``piwf server start`` (the viewer never starts one after it
    opened: a stopped server stays stopped), and the screen picks up again by itself. Behind a
    relay (``remote``) that server is on the relay's machine, and the relay's refusal says so:
    ``piwf server start`` here would start an unrelated server on this machine."""
    if isinstance(error, ServerNotRunningError):
        where = (
            str(error)
            if remote
            else "no piwf server is running; start one with `piwf server start`"
        )
        return f"{where} (this screen goes on by itself once one runs)"
    return str(error)


def header_text(view: RunView, one_line: Callable[[str], str]) -> str:
    """The run's id and workflow, then its display: status, activity and the current node or
    the request it waits on, exactly as the server derived them; ``one_line`` makes the
    display's line safe to show (its stored reason is free text)."""
    run = view.detail.run
    return f"{run.run_id}  {run.workflow_name}  (revision {view.revision})\n" + one_line(
        display_text(view.display)
    )


def display_text(display: Display) -> str:
    """``status · activity`` and where: the node that runs or the request waited on."""
    text = f"{display.status} · {display.activity}"
    node = display.current_node
    if node is not None:
        text += f"  node {node.path} (visit {node.visit}, attempt {node.attempt})"
    waiting = display.waiting_on
    if waiting is not None:
        text += f"  waiting on {waiting.request_id} ({waiting.kind}) at node {waiting.path}"
    if display.reason:
        reason = display.reason
        if len(reason) > REASON_CHARS:  # the explanation line says where the whole of it is
            reason = reason[:REASON_CHARS] + "… (cut)"
        text += f"  reason: {reason}"
    return text


def log_lines(attempts: list[AttemptLog], *, whole: bool, safe: Callable[[str], str]) -> list[str]:
    """The lines of the given attempt logs, each made safe to show by ``safe``; ``whole``:
    each attempt under a line naming it."""
    lines: list[str] = []
    for attempt in attempts:
        if whole:
            info = attempt.info
            where = f"visit {info.visit}, attempt {info.attempt}, {info.status}"
            lines.append(f"── {info.node_path} ({where}) ──")
        if attempt.info.missing:
            lines.append(f"({MISSING_LOG_NOTE})")
        # Lines end at line feeds only: a carriage return or a form feed is shown escaped,
        # as `piwf run logs` shows it, never taken as a line break that could hide text.
        text = attempt.text.removesuffix("\n")
        lines.extend(safe(line) for line in text.split("\n") if text)
    return lines[-LOG_LINES:]
