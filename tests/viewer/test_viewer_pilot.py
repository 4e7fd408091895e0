"""``piwf view`` driven by Textual's test pilot against a real server and a real client.

Each test starts a gated run (``first``, then ``hold`` blocked on a gate file, then ``last``),
opens it in the viewer and presses keys as a user would; every wait is a bounded loop on the
text the widgets show (``until``), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import hold_until_gate, start, wait_run, write_workflow
from tests.server.test_run_view import CHECKPOINT, gated_workflow
from tests.viewer.conftest import require_textual

require_textual()

from rich.text import Text  # noqa: E402
from textual.pilot import Pilot  # noqa: E402
from textual.widgets import DataTable, Input, Log, Static  # noqa: E402
from textual.widgets._footer import FooterKey  # noqa: E402
from textual.widgets.data_table import ColumnKey  # noqa: E402

from piwf import Client  # noqa: E402
from piwf.cli.view import wording  # noqa: E402
from piwf.viewer import ViewerApp  # noqa: E402
from piwf.viewer.run_screen import RunScreen  # noqa: E402

DEADLINE_S = 30.0


def row_text(table: DataTable[object], index: int) -> list[str]:
    """The plain text of each cell of row ``index``, as the table shows it."""
    return [str(cell) for cell in table.get_row_at(index)]


def shown(app: ViewerApp, selector: str) -> str:
    """The plain text a Static of the current screen shows."""
    return str(app.screen.query_one(selector, Static).render())


async def until(pilot: Pilot[None], condition: Callable[[], bool], what: str) -> None:
    """Let the app run until ``condition`` holds; fail after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def gated_run(server: ServerProcess, tmp_path: Path, name: str) -> tuple[str, Path]:
    """Start a gated run and wait until its ``hold`` node runs; return its id and gate."""
    entered, gate = tmp_path / f"{name}-entered", tmp_path / f"{name}-gate"
    workflow = gated_workflow(tmp_path, name, entered, gate)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, name)
    wait_for(entered.exists, timeout_s=DEADLINE_S, what="the hold node")
    return run_id, gate


def drive(
    server: ServerProcess,
    run_id: str | None,
    script: Callable[[ViewerApp, Pilot[None]], Awaitable[None]],
) -> None:
    """Run the viewer (on ``run_id``, or on the list) under the pilot and play ``script``."""

    async def main(client: Client) -> None:
        app = ViewerApp(client, wording(), run_id)
        async with app.run_test(size=(140, 40)) as pilot:
            await script(app, pilot)

    # The client outlives the event loop: asyncio.run joins the app's worker threads first.
    with Client(server.home, autostart=False) as client:
        asyncio.run(main(client))


def test_it_opens_a_running_run_and_follows_it_to_completion(
    server: ServerProcess, tmp_path: Path
) -> None:
    run_id, gate = gated_run(server, tmp_path, "followed")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "node hold" in shown(app, "#run-status"), "the current node")
        status = shown(app, "#run-status")
        assert run_id in status and "running · executing" in status, status
        assert '"hold"' in shown(app, "#explain")
        assert shown(app, "#graph").splitlines() == [
            "✓ first (compute)  → hold",
            "▶ hold (compute)  → last",
            "· last (compute)",
        ]
        steps = app.screen.query_one("#steps", DataTable)
        assert [row_text(steps, i)[1] for i in range(steps.row_count)] == ["first"]
        gate.touch()
        await until(
            pilot,
            lambda: "completed · idle" in shown(app, "#run-status"),
            "the final status",
        )
        assert [row_text(steps, i)[1:4] for i in range(steps.row_count)] == [
            ["first", "1", "completed"],
            ["hold", "1", "completed"],
            ["last", "1", "completed"],
        ]
        assert "nothing is left to do" in shown(app, "#explain")
        assert [line[0] for line in shown(app, "#graph").splitlines()] == ["✓", "✓", "✓"]
        await pilot.press("p")  # a finished run offers no control: the key says why
        assert "pause is not possible now: the run is completed" in shown(app, "#message")

    drive(server, run_id, script)


def test_p_pauses_the_run_and_r_resumes_it_to_completion(
    server: ServerProcess, tmp_path: Path
) -> None:
    run_id, gate = gated_run(server, tmp_path, "controlled")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "node hold" in shown(app, "#run-status"), "the current node")
        await pilot.press("r")  # a running run offers no resume
        assert "resume is not possible now: the run is running" in shown(app, "#message")
        await pilot.press("p")
        await until(pilot, lambda: "paused ·" in shown(app, "#run-status"), "paused")
        with Client(server.home, autostart=False) as client:
            assert client.run_view(run_id).display.status == "paused"
        # The pause stopped "hold": it waits for the resume, it is not shown running.
        assert shown(app, "#graph").splitlines()[1] == "… hold (compute)  → last"
        gate.touch()  # the node finishes while paused; the run goes no further
        await pilot.press("r")
        await until(pilot, lambda: "completed ·" in shown(app, "#run-status"), "completed")

    drive(server, run_id, script)


def test_c_asks_before_it_cancels(server: ServerProcess, tmp_path: Path) -> None:
    run_id, _gate = gated_run(server, tmp_path, "cancelled")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "node hold" in shown(app, "#run-status"), "the current node")
        await pilot.press("c")
        await until(pilot, lambda: "Cancel run" in shown(app, "#confirm"), "the question")
        await pilot.press("n")
        await until(pilot, lambda: "not cancelled" in shown(app, "#message"), "kept")
        with Client(server.home, autostart=False) as client:
            assert client.run_view(run_id).display.status == "running"
        await pilot.press("c")
        await until(pilot, lambda: "Cancel run" in shown(app, "#confirm"), "the question")
        await pilot.press("y")
        await until(pilot, lambda: "cancelled ·" in shown(app, "#run-status"), "cancelled")

    drive(server, run_id, script)


def test_the_run_list_shows_a_started_run_and_enter_opens_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    run_id, gate = gated_run(server, tmp_path, "listed")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        def listed() -> list[str]:
            table = app.screen.query_one("#runs", DataTable)
            return [str(row_text(table, i)[0]) for i in range(table.row_count)]

        await until(pilot, lambda: listed() == [run_id], "the run in the list")
        table = app.screen.query_one("#runs", DataTable)
        assert row_text(table, 0)[1:3] == ["running", "listed"]
        await pilot.press("enter")
        await until(pilot, lambda: "node hold" in shown(app, "#run-status"), "the run screen")
        assert run_id in shown(app, "#run-status")
        gate.touch()
        await until(pilot, lambda: "completed ·" in shown(app, "#run-status"), "completed")
        await pilot.press("escape")
        await until(
            pilot,
            lambda: (
                app.screen.query("#runs")
                and row_text(app.screen.query_one("#runs", DataTable), 0)[1] == "completed"
            ),
            "the list again, live",
        )

    drive(server, None, script)


def test_the_run_list_widens_the_status_column_for_a_longer_status(
    server: ServerProcess, tmp_path: Path
) -> None:
    _, gate = gated_run(server, tmp_path, "widened")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        table = app.screen.query_one("#runs", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the run in the list")
        assert row_text(table, 0)[1] == "running"
        gate.touch()
        await until(pilot, lambda: row_text(table, 0)[1] == "completed", "completed")
        await pilot.pause()
        assert table.columns[ColumnKey("status")].content_width >= len("completed")

    drive(server, None, script)


def test_a_stored_value_that_looks_like_markup_is_shown_as_written(
    server: ServerProcess, tmp_path: Path
) -> None:
    markup = "[/bold] [red]RED[/red] [link=http://x]L[/link]"
    workflow = write_workflow(
        tmp_path,
        "markup",
        """
        from piwf.workflow import compute, define_workflow

        workflow = define_workflow(
            name="markup",
            start_at="echo",
            nodes={"echo": compute(lambda ctx: {"text": ctx.input["text"]})},
            edges=[],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {"text": markup}, "markup")
        assert wait_run(client, run_id)["status"] == "completed"

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        steps = app.screen.query_one("#steps", DataTable)
        await until(pilot, lambda: steps.row_count == 1, "the step")
        await pilot.pause()
        assert row_text(steps, 0)[-1] == json.dumps({"text": markup}, separators=(",", ":"))

    drive(server, run_id, script)


def test_the_run_list_says_the_server_is_gone_and_clears_it_once_it_is_back(
    servers: ServerFactory, server: ServerProcess, tmp_path: Path
) -> None:
    with raw_client(server) as client:
        run_id = start(client, CHECKPOINT, {"steps": [1]}, "listed")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        table = app.screen.query_one("#runs", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the run in the list")
        server.terminate()
        await until(pilot, lambda: "cannot list the runs" in shown(app, "#message"), "the error")
        restarted = servers.start(env={"PIWF_IDLE_EXIT_S": "0"})
        assert restarted.ready.get("ok") is True, restarted.ready
        await until(pilot, lambda: shown(app, "#message") == "", "the error cleared")
        assert row_text(table, 0)[0] == run_id

    drive(server, None, script)


def test_a_answers_the_request_a_run_waits_on_from_a_form(
    server: ServerProcess, tmp_path: Path
) -> None:
    with raw_client(server) as client:
        run_id = start(client, CHECKPOINT, {"steps": ["ship"]}, "answered")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "waiting ·" in shown(app, "#run-status"), "waiting")
        assert "… review (checkpoint)" in shown(app, "#graph")
        with Client(server.home, autostart=False) as client:
            waiting = client.run_view(run_id).display.waiting_on
        assert waiting is not None and waiting.request_id in shown(app, "#run-status")
        await pilot.press("a")
        await until(pilot, lambda: bool(app.screen.query("#answer-input")), "the answer form")
        form = app.screen.query_one("#answer-input", Input)
        form.value = "not json"
        await pilot.press("enter")
        assert shown(app, "#answer-error").startswith("not sent: "), "refused before sending"
        with Client(server.home, autostart=False) as client:
            assert client.run_view(run_id).display.status == "waiting"
        # The form shows what the checkpoint asks (its content) before anything is typed.
        assert '"plan"' in shown(app, "#answer-about"), shown(app, "#answer-about")
        form.value = '{"ok": true}'
        await pilot.press("enter")
        # Nothing is sent before the person says yes to the value as it will be sent.
        await until(pilot, lambda: bool(app.screen.query("#confirm")), "the question")
        assert '{"ok":true}' in shown(app, "#confirm"), shown(app, "#confirm")
        with Client(server.home, autostart=False) as client:
            assert client.run_view(run_id).display.status == "waiting"
        await pilot.press("y")
        said = f"{waiting.request_id}: answered; accepted by human (human) at "
        await until(pilot, lambda: shown(app, "#message").startswith(said), "the outcome")
        assert shown(app, "#message").endswith(': {"ok":true}'), shown(app, "#message")
        await until(
            pilot, lambda: "completed · idle" in shown(app, "#run-status"), "the answered run"
        )
        with Client(server.home, autostart=False) as client:
            assert client.get_run(run_id).output == {"applied": ["ship"], "note": {"ok": True}}

    drive(server, run_id, script)


REPLAN = str(Path(CHECKPOINT).parent / "replan_decision.py")


def test_the_answer_form_of_a_decision_shows_its_choices_and_n_sends_nothing(
    server: ServerProcess,
) -> None:
    with raw_client(server) as client:
        run_id = start(client, REPLAN, {}, "decided")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "waiting ·" in shown(app, "#run-status"), "waiting")
        await pilot.press("a")
        await until(pilot, lambda: bool(app.screen.query("#answer-input")), "the answer form")
        about = shown(app, "#answer-about")
        assert "continue (Continue as planned)" in about and '"instructions"' in about, about
        app.screen.query_one("#answer-input", Input).value = '{"choice": "continue"}'
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.screen.query("#confirm")), "the question")
        await pilot.press("n")
        await until(pilot, lambda: shown(app, "#message") == "not answered", "the message")
        with Client(server.home, autostart=False) as client:
            assert client.run_view(run_id).display.status == "waiting"

    drive(server, run_id, script)


def test_a_on_a_paused_run_says_to_resume_it_first(server: ServerProcess) -> None:
    with raw_client(server) as client:
        run_id = start(client, REPLAN, {}, "paused")
    with Client(server.home, autostart=False) as client:
        wait_for(
            lambda: client.run_view(run_id).display.status == "waiting",
            timeout_s=DEADLINE_S,
            what="the decision",
        )
        client.pause_run(run_id)

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "paused ·" in shown(app, "#run-status"), "paused")
        await pilot.press("a")
        await until(pilot, lambda: "resume" in shown(app, "#message"), "why not")
        message = shown(app, "#message")
        assert "no request waits" not in message, message  # one does: the run is paused
        assert not app.screen.query("#answer-input")

    drive(server, run_id, script)


def test_esc_leaves_the_answer_form_without_answering(server: ServerProcess) -> None:
    with raw_client(server) as client:
        run_id = start(client, CHECKPOINT, {"steps": []}, "left")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "waiting ·" in shown(app, "#run-status"), "waiting")
        await pilot.press("a")
        await until(pilot, lambda: bool(app.screen.query("#answer-input")), "the answer form")
        await pilot.press("escape")
        await until(pilot, lambda: shown(app, "#message") == "not answered", "the message")
        with Client(server.home, autostart=False) as client:
            assert client.run_view(run_id).display.status == "waiting"

    drive(server, run_id, script)


LONG_LOOP = """
from piwf.workflow import compute, define_workflow

def step(ctx):
    n = ctx.outputs.get("step", {}).get("n", 0) + 1
    return {"n": n, "route": "again" if n < 230 else "done"}

workflow = define_workflow(
    name="long_loop",
    start_at="step",
    max_steps=500,
    nodes={"step": compute(step), "end": compute(lambda ctx: {"ended": True})},
    edges=[
        {
            "from": "step",
            "switch": {"on": "$output.route", "cases": {"again": "step", "done": "end"}},
        }
    ],
)
"""


def test_a_run_of_more_steps_than_a_view_page_shows_every_step_and_where_it_ended(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A view carries its first 200 steps; the screen reads the rest, so a run of 231 steps
    shows all of them, its last step is the last row, and the graph marks ``end`` as run."""
    workflow = write_workflow(tmp_path, "long_loop", LONG_LOOP)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "long")
        assert wait_run(client, run_id)["status"] == "completed"

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "completed" in shown(app, "#run-status"), "the final view")
        steps = app.screen.query_one("#steps", DataTable)
        await until(pilot, lambda: steps.row_count == 231, "every step in the table")
        assert row_text(steps, 230)[:4] == ["231", "end", "1", "completed"]
        assert row_text(steps, 229)[1:3] == ["step", "230"]
        assert shown(app, "#graph").splitlines()[-1].startswith("✓ end")

    drive(server, run_id, script)


def test_the_log_pane_shows_a_running_nodes_output_as_it_comes(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A node prints, waits on a gate, prints again: the second line reaches the log pane while
    the run's revision stays where it was (no new view brought it: the pane reads again)."""
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = write_workflow(
        tmp_path,
        "ticker",
        f"""
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def ticker(ctx):
            print("tick-before-the-gate", flush=True)
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            print("tick-after-the-gate", flush=True)
            wait_for_gate({str(entered)!r}, {str(gate) + "-2"!r})
            return {{}}

        workflow = define_workflow(
            name="ticker", start_at="ticker", nodes={{"ticker": compute(ticker)}}, edges=[]
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "ticker")
    wait_for(entered.exists, timeout_s=DEADLINE_S, what="the ticker node")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        def logged() -> str:
            return "\n".join(app.screen.query_one("#log", Log).lines)

        await until(pilot, lambda: "tick-before-the-gate" in logged(), "the first line")
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.view is not None
        revision = screen.view.revision
        gate.touch()
        await until(pilot, lambda: "tick-after-the-gate" in logged(), "the line after the gate")
        assert screen.view.revision == revision, "no new view brought it"
        (tmp_path / "gate-2").touch()
        await until(pilot, lambda: "completed" in shown(app, "#run-status"), "the end")

    drive(server, run_id, script)


def test_the_run_list_marks_a_run_that_waits_for_a_persons_answer(
    server: ServerProcess,
) -> None:
    """The STATUS column said `waiting` for a run stopped on a decision, as for any wait; it
    says what `piwf run list` says (needs action: answer), in bold, until it is answered."""
    with raw_client(server) as client:
        run_id = start(client, REPLAN, {}, "marked")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        table = app.screen.query_one("#runs", DataTable)

        def status() -> str:
            return row_text(table, 0)[1] if table.row_count else ""

        await until(pilot, lambda: status() == "waiting (needs action: answer)", "the mark")
        cell = table.get_row_at(0)[1]
        assert isinstance(cell, Text) and "bold" in str(cell.spans[0].style), cell.spans
        with Client(server.home, autostart=False) as client:
            waiting = client.run_view(run_id).display.waiting_on
            assert waiting is not None
            client.answer(waiting.request_id, {"choice": "continue"})
        await until(pilot, lambda: status() == "completed", "the answered run, unmarked")

    drive(server, None, script)


def test_an_answer_the_server_refuses_keeps_the_form_open_to_correct_it(
    server: ServerProcess,
) -> None:
    """A refused answer closed the form and left only a message under the run; the form
    stays, says why, keeps what was typed, and the corrected answer is sent from it."""
    with raw_client(server) as client:
        run_id = start(client, REPLAN, {}, "refused")

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "waiting ·" in shown(app, "#run-status"), "waiting")
        await pilot.press("a")
        await until(pilot, lambda: bool(app.screen.query("#answer-input")), "the answer form")
        form = app.screen.query_one("#answer-input", Input)
        form.value = '{"choice": "nope"}'
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.screen.query("#confirm")), "the question")
        await pilot.press("y")
        await until(
            pilot,
            lambda: (
                bool(app.screen.query("#answer-error"))
                and "choice 'nope' is not one of" in shown(app, "#answer-error")
            ),
            "the refusal, in the form",
        )
        assert "Esc to leave" in shown(app, "#answer-error")
        assert form.value == '{"choice": "nope"}' and app.focused is form
        form.value = '{"choice": "continue"}'
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.screen.query("#confirm")), "the question again")
        await pilot.press("y")
        await until(
            pilot, lambda: ": answered; accepted by human" in shown(app, "#message"), "the outcome"
        )
        assert not app.screen.query("#answer-input")
        await until(
            pilot, lambda: "completed · idle" in shown(app, "#run-status"), "the answered run"
        )

    drive(server, run_id, script)


def test_the_run_lists_footer_says_enter_opens_a_run(server: ServerProcess) -> None:
    """The table's own (hidden) Enter binding kept "open run" out of the list's footer."""

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await pilot.pause()
        keys = [(key.key, key.description) for key in app.screen.query(FooterKey)]
        assert ("enter", "open run") in keys, keys

    drive(server, None, script)
