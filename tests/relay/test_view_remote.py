"""``piwf view --remote`` through a real relay: the same live view, its client on a WebSocket.

A gated run (``first``, ``hold`` blocked on a gate file, ``last``) is followed to completion
twice: by the Textual app under its test pilot with ``Client(remote=...)`` (the client
``piwf view --remote`` builds), and by the ``piwf view --remote`` command itself in a real
terminal (tmux: read the screen). Every wait is a bounded poll, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf import Client
from tests.relay.conftest import RelayFactory, require_websockets
from tests.server.harness import ServerProcess
from tests.tmux import TmuxTerminal
from tests.viewer.conftest import require_textual
from tests.viewer.test_viewer_pilot import DEADLINE_S, gated_run, row_text, shown, until

require_websockets()
require_textual()

from textual.pilot import Pilot  # noqa: E402
from textual.widgets import DataTable  # noqa: E402

from piwf.cli.view import wording  # noqa: E402
from piwf.viewer import ViewerApp  # noqa: E402

PIWF = Path(sys.executable).parent / "piwf"


# conformance: I7
def test_the_viewer_over_the_relay_follows_a_run_to_completion(
    server: ServerProcess, relays: RelayFactory, tmp_path: Path
) -> None:
    run_id, gate = gated_run(server, tmp_path, "remote")
    relay = relays.start()

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "node hold" in shown(app, "#run-status"), "the current node")
        assert "running · executing" in shown(app, "#run-status")
        gate.touch()
        await until(pilot, lambda: "completed · idle" in shown(app, "#run-status"), "completed")
        steps = app.screen.query_one("#steps", DataTable)
        assert [row_text(steps, i)[1:4] for i in range(steps.row_count)] == [
            ["first", "1", "completed"],
            ["hold", "1", "completed"],
            ["last", "1", "completed"],
        ]

    async def main(client: Client) -> None:
        app = ViewerApp(client, wording(), run_id)
        async with app.run_test(size=(140, 40)) as pilot:
            await script(app, pilot)

    with Client(remote=relay.url) as client:
        asyncio.run(main(client))


def test_the_viewer_over_the_relay_says_to_start_the_server_on_the_relays_machine(
    server: ServerProcess, relays: RelayFactory
) -> None:
    """`piwf server start` typed where the viewer runs would start an unrelated local server:
    a remote viewer whose server stopped points at the relay's machine, as the relay does."""
    relay = relays.start()

    async def script(app: ViewerApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: "no runs yet" in shown(app, "#message"), "the empty list")
        server.terminate()
        await until(pilot, lambda: "cannot list the runs" in shown(app, "#message"), "the error")
        message = " ".join(shown(app, "#message").split())
        assert "no piwf server is running on the relay's machine; start it there" in message
        assert "goes on by itself once one runs" in message

    async def main(client: Client) -> None:
        app = ViewerApp(client, wording())
        async with app.run_test(size=(160, 40)) as pilot:
            await script(app, pilot)

    with Client(remote=relay.url) as client:
        asyncio.run(main(client))


@pytest.fixture
def terminal_sockets() -> Iterator[list[TmuxTerminal]]:
    opened: list[TmuxTerminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_piwf_view_remote_in_a_terminal_follows_a_run_to_completion(
    server: ServerProcess,
    relays: RelayFactory,
    tmp_path: Path,
    terminal_sockets: list[TmuxTerminal],
) -> None:
    run_id, gate = gated_run(server, tmp_path, "terminal")
    relay = relays.start()
    # Another home, never started: the view must not touch the local socket or start a server.
    elsewhere = tmp_path / "elsewhere"
    env = {"PIWF_HOME": str(elsewhere), "PATH": os.environ["PATH"], "TERM": "xterm-256color"}
    command = f"{shlex.quote(str(PIWF))} view --remote {relay.url} {run_id}"
    terminal = TmuxTerminal(f"piwf-relay-{os.getpid()}", command, env, width=140)
    terminal_sockets.append(terminal)
    terminal.wait_for_text("running · executing", timeout_s=DEADLINE_S)
    gate.touch()
    terminal.wait_for_text("completed · idle", timeout_s=DEADLINE_S)
    terminal.press("q")
    terminal.wait_for_text("EXIT=0", timeout_s=DEADLINE_S)
    assert not elsewhere.exists(), "a remote view starts no local server"
