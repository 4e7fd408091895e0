"""The run list: the newest runs, live (``Client.watch_runs``); Enter opens one."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual.worker import get_current_worker

from piwf import faults
from piwf.errors import PiwfError
from piwf.protocol.payloads import RunInfo
from piwf.viewer.run_screen import RETRY_S, WAKE_S, literal, unreachable_text

if TYPE_CHECKING:
    from piwf.viewer.app import ViewerApp

#: The newest runs the list shows.
LISTED_RUNS = 200


class RunListScreen(Screen[None]):
    """The runs (id, display status, workflow, created), live; Enter opens the highlighted."""

    # A priority binding: the table's own Enter (hidden) would take the key first and keep
    # "open run" out of the footer, so nothing on the screen said how to open a run.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "open run", show=True, priority=True)
    ]

    # The table takes the rows the title, the message and the footer leave, and scrolls inside
    # them: a list longer than the terminal must not push the message (the server is gone)
    # below the screen.
    DEFAULT_CSS = """
    RunListScreen #runs { height: 1fr; }
    RunListScreen #message { height: auto; padding: 0 1; color: $warning; }
    """

    def compose(self) -> ComposeResult:
        yield Static("runs (newest first)", id="list-title", markup=False)
        table: DataTable[str] = DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield table
        yield Static("", id="message", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#runs", DataTable)
        for label in ("RUN", "STATUS", "WORKFLOW", "CREATED"):
            table.add_column(label, key=label.lower())
        self.follow_runs()

    @property
    def viewer(self) -> ViewerApp:
        return cast("ViewerApp", self.app)

    @work(thread=True, exclusive=True, group="run-list")
    def follow_runs(self) -> None:
        """Show the list as the server pushes it after every change (in a worker thread: the
        client blocks); the watch is renewed every WAKE_S so a cancelled worker ends."""
        worker = get_current_worker()

        def cancelled() -> bool:
            return worker.is_cancelled

        while not cancelled():
            pushes = self.viewer.client.watch_runs(limit=LISTED_RUNS, idle_timeout_s=WAKE_S)
            try:
                for runs in pushes:
                    if cancelled():
                        return
                    self.app.call_from_thread(self._show, runs)
            except TimeoutError:
                continue  # nothing changed: renew the watch
            except PiwfError as error:
                if cancelled():
                    return
                problem = unreachable_text(error, remote=self.viewer.client.remote is not None)
                self.app.call_from_thread(self._say, f"cannot list the runs: {problem}")
                threading.Event().wait(RETRY_S)
            finally:
                pushes.close()  # ends the subscription on the server now

    def _show(self, runs: list[RunInfo]) -> None:
        faults.point("viewer.show_runs")
        table = self.query_one("#runs", DataTable)
        timestamp = self.viewer.wording.timestamp
        rows = [
            (run.run_id, self._status(run), run.workflow_name, timestamp(run.created_at))
            for run in runs
        ]
        # Every push clears the message: "cannot list the runs" no longer holds once one came.
        self._say("" if rows else "no runs yet: piwf run start WORKFLOW")
        shown = [str(key.value) for key in table.rows]  # the run ids, in order
        if shown == [row[0] for row in rows]:
            for row in rows:  # the same runs in the same order: only statuses change
                # A longer status ("running" to "completed") widens the column, never clipped.
                table.update_cell(row[0], "status", row[1], update_width=True)
            return
        # The cursor stays on the run it was on, unless that was the newest: then it stays on
        # the top row, so a run started meanwhile comes in sight instead of above it.
        on_top = table.cursor_row <= 0
        highlighted = shown[table.cursor_row] if shown and table.cursor_row < len(shown) else None
        table.clear()
        for run_id, status, *rest in rows:
            table.add_row(literal(run_id), status, *map(literal, rest), key=run_id)
        if not on_top and highlighted is not None and highlighted in table.rows:
            table.move_cursor(row=table.get_row_index(highlighted))

    def _status(self, run: RunInfo) -> Text:
        """The STATUS cell: ``piwf run list``'s status, in bold while the run cannot go on
        until someone acts (an operator, or a person answering its checkpoint or decision)."""
        text = literal(self.viewer.wording.run_status(run))
        if run.needs_action or run.waiting_for_person:
            text.stylize("bold")
        return text

    def action_open(self) -> None:
        table = self.query_one("#runs", DataTable)
        if table.row_count == 0:
            self._say("no run to open")
            return
        key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        if key.value is not None:
            self.viewer.open_run(key.value)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.viewer.open_run(event.row_key.value)

    def _say(self, text: str) -> None:
        self.query_one("#message", Static).update(text)
