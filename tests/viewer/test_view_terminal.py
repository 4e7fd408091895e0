"""``piwf view`` in a real terminal (tmux), as a person runs it.

What a workflow wrote (a node's log, its failure) holds terminal escapes and bidirectional
controls, which the screen must show escaped (``\\x1b``, ``\\u202e``), never send to the
terminal: only a real terminal shows the difference (an OSC escape would set the pane's title,
a clear screen would wipe what the viewer drew, a right-to-left override would reorder a line).

A server stopped under an open viewer stays stopped: the viewer says it cannot reach it and
goes on once one runs again, it never starts one behind the person who stopped it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.harness import ServerProcess, raw_client, wait_for
from tests.server.test_execution import start, wait_run, write_workflow
from tests.tmux import TmuxTerminal
from tests.viewer.conftest import require_textual

require_textual()

PIWF = Path(sys.executable).parent / "piwf"
#: Sets the terminal's title, clears the screen and turns the text red, when interpreted.
ESCAPES = "\\x1b]0;HIJACKED\\x07\\x1b[2J\\x1b[31mred\\x1b[0m"
NOISY = f"""
import sys
from piwf.workflow import compute, define_workflow

ESCAPES = "{ESCAPES}"
BIDI = "abc\\u202eevil\\u202c"

def noisy(ctx):
    print("out:" + ESCAPES)
    print("bidi:" + BIDI)
    print("cr:shown\\\\rhidden")
    print("tab:\\\\tafter", file=sys.stderr)
    raise RuntimeError("fail:" + ESCAPES)

workflow = define_workflow(
    name="noisy",
    start_at="noisy",
    nodes={{"noisy": compute(noisy)}},
    edges=[],
)
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_nodes_escapes_and_bidi_controls_are_shown_escaped_never_interpreted(
    server: ServerProcess, tmp_path: Path, terminals: list[TmuxTerminal]
) -> None:
    workflow = write_workflow(tmp_path, "noisy", NOISY)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "noisy-1")
        assert wait_run(client, run_id)["status"] == "failed"
    env = {"PIWF_HOME": str(server.home), "PATH": os.environ["PATH"], "TERM": "xterm-256color"}
    command = f"{shlex.quote(str(PIWF))} view {run_id}"
    terminal = TmuxTerminal(f"piwf-view-escapes-{os.getpid()}", command, env, width=200)
    terminals.append(terminal)
    terminal.wait_for_text("cr:shown")
    before = terminal.title()
    terminal.press("l")  # every attempt's log: the log pane is drawn again
    terminal.wait_for_text("log of every attempt")
    screen = terminal.screen()
    shown = r"\x1b]0;HIJACKED\x07\x1b[2J\x1b[31mred\x1b[0m"
    assert f"out:{shown}" in screen, screen  # the log pane
    assert f"fail:{shown}" in screen, screen  # the explanation and the steps' RESULT
    assert r"bidi:abc\u202eevil\u202c" in screen, screen
    assert r"cr:shown\rhidden" in screen, screen  # a carriage return hides nothing
    assert "\u202e" not in screen, screen
    # What the viewer drew above the log is still there: no escape cleared the screen.
    assert f"{run_id}  noisy" in screen, screen
    assert "HIJACKED" not in terminal.title() and terminal.title() == before
    terminal.press("q")
    terminal.wait_for_text("EXIT=0")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_server_stopped_under_the_viewer_stays_stopped_until_one_is_started(
    server: ServerProcess, terminals: list[TmuxTerminal]
) -> None:
    env = {"PIWF_HOME": str(server.home), "PATH": os.environ["PATH"], "TERM": "xterm-256color"}
    terminal = TmuxTerminal(f"piwf-view-stop-{os.getpid()}", f"{PIWF} view", env, width=200)
    terminals.append(terminal)
    terminal.wait_for_text("no runs yet")
    piwf = {**os.environ, "PIWF_HOME": str(server.home)}
    stopped = subprocess.run([PIWF, "server", "stop"], env=piwf, capture_output=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: not server.alive(), timeout_s=30, what="the server to exit")
    try:
        # The viewer tried again (it does every second) and found no server: it started none.
        terminal.wait_for_text("cannot list the runs: no piwf server is running; start one with")
        assert "autostart" not in terminal.screen(), "no words of the Python client's"
        status = subprocess.run([PIWF, "server", "status"], env=piwf, capture_output=True)
        assert b"no piwf server is running" in status.stdout + status.stderr, status
        started = subprocess.run([PIWF, "server", "start"], env=piwf, capture_output=True)
        assert started.returncode == 0, started.stderr
        terminal.wait_for_text("no runs yet")  # the list is back, the message gone
        terminal.press("q")
        terminal.wait_for_text("EXIT=0")
    finally:  # the server started above (or, wrongly, by the viewer)
        subprocess.run([PIWF, "server", "stop"], env=piwf, capture_output=True, timeout=60)
