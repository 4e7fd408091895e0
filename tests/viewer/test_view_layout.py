"""``piwf view`` in a real terminal (tmux) when what it shows is larger than the terminal: more
runs than rows, a failure message of thousands of characters. Only a real terminal shows what
is on screen: a widget's text can be right while the layout pushes it out of sight.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests.server.harness import ServerProcess, raw_client, wait_for
from tests.server.test_execution import start, wait_run, write_workflow
from tests.tmux import TmuxTerminal
from tests.viewer.conftest import require_textual

require_textual()

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

PIWF = Path(sys.executable).parent / "piwf"
ECHO = """
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="echo",
    start_at="echo",
    nodes={"echo": compute(lambda ctx: {})},
    edges=[],
)
"""
LONG_FAILURE = """
from piwf.workflow import compute, define_workflow

def fail(ctx):
    print("the log line")
    raise RuntimeError("long:" + "y" * 30000)

workflow = define_workflow(
    name="longfail",
    start_at="fail",
    nodes={"fail": compute(fail)},
    edges=[],
)
"""


def open_viewer(
    server: ServerProcess, terminals: list[TmuxTerminal], name: str, *args: str, height: int = 40
) -> TmuxTerminal:
    env = {"PIWF_HOME": str(server.home), "PATH": os.environ["PATH"], "TERM": "xterm-256color"}
    command = " ".join(shlex.quote(part) for part in (str(PIWF), "view", *args))
    terminal = TmuxTerminal(f"piwf-view-{name}-{os.getpid()}", command, env, height=height)
    terminals.append(terminal)
    return terminal


def test_a_list_longer_than_the_terminal_keeps_the_newest_run_and_the_message_in_sight(
    server: ServerProcess, tmp_path: Path, terminals: list[TmuxTerminal]
) -> None:
    workflow = write_workflow(tmp_path, "echo", ECHO)
    with raw_client(server) as client:
        first = [start(client, workflow, {}, f"echo-{n}") for n in range(15)]
        terminal = open_viewer(server, terminals, "long-list", height=12)
        terminal.wait_for_text(first[-1])
        # Runs started while the list shows: the newest comes in sight at the top, as long as
        # the person did not move the cursor away from it.
        later = [start(client, workflow, {}, f"later-{n}") for n in range(15)]
        for run_id in later:
            assert wait_run(client, run_id)["status"] == "completed"
    # The newest run, once it completed (every later run was listed by then), is in sight.
    terminal.wait_for_text(f"{later[-1]}  completed")
    # The server stops: the line saying so shows under the 30 runs, not below the screen.
    server.terminate()
    wait_for(lambda: not server.alive(), timeout_s=30, what="the server to exit")
    terminal.wait_for_text("cannot list the runs: no piwf server is running")
    terminal.press("q")
    terminal.wait_for_text("EXIT=0")


def test_a_long_failure_leaves_the_steps_and_the_log_in_sight(
    server: ServerProcess, tmp_path: Path, terminals: list[TmuxTerminal]
) -> None:
    workflow = write_workflow(tmp_path, "longfail", LONG_FAILURE)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "longfail-1")
        assert wait_run(client, run_id)["status"] == "failed"
    terminal = open_viewer(server, terminals, "long-failure", run_id)
    terminal.wait_for_text("the log line")
    screen = terminal.screen()
    assert "OUTCOME" in screen and "log of fail" in screen, screen
    # The explanation is cut, and still says where the whole record is and what to run next.
    assert f"piwf run explain {run_id}" in screen, screen
    assert "next: piwf run restart" in screen, screen
    terminal.press("q")
    terminal.wait_for_text("EXIT=0")


def test_ctrl_c_quits_the_viewer(server: ServerProcess, terminals: list[TmuxTerminal]) -> None:
    terminal = open_viewer(server, terminals, "ctrl-c")
    terminal.wait_for_text("no runs yet")
    terminal.interrupt()
    terminal.wait_for_text("EXIT=0")
