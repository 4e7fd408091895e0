"""``piwf view`` in a real terminal (tmux) when the viewer itself fails: exit 1, a traceback
without the values it held, and a line saying the runs are unaffected.

The failure is a fault point (``viewer.show_runs``, armed with ``raise``) in the code that
shows the run list, as a rendering bug would fail there; the run's title is a marker that
must not reach the screen, as it would through the traceback's local variables (the runs
being shown).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests.server.harness import ServerProcess, raw_client
from tests.server.test_execution import wait_run, write_workflow
from tests.tmux import TmuxTerminal
from tests.viewer.conftest import require_textual

require_textual()

PIWF = Path(sys.executable).parent / "piwf"
MARKER = "payload-that-stays-private"
ECHO = """
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="echo",
    start_at="echo",
    nodes={"echo": compute(lambda ctx: {})},
    edges=[],
)
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_viewer_that_fails_exits_1_without_the_values_it_held(
    server: ServerProcess, tmp_path: Path, terminals: list[TmuxTerminal]
) -> None:
    workflow = write_workflow(tmp_path, "echo", ECHO)
    with raw_client(server) as client:
        started = client.request(
            "run.start", {"workflow": workflow, "input": {}, "title": MARKER}, key="echo-1"
        )
        assert started.receipt is not None, started
        wait_run(client, started.receipt["run"]["runId"])
    env = {
        "PIWF_HOME": str(server.home),
        "PATH": os.environ["PATH"],
        "TERM": "xterm-256color",
        "PIWF_FAULTS": "viewer.show_runs@1=raise",
    }
    command = f"{shlex.quote(str(PIWF))} view"
    terminal = TmuxTerminal(f"piwf-view-crash-{os.getpid()}", command, env, history_lines=300)
    terminals.append(terminal)
    terminal.wait_for_text("EXIT=1", timeout_s=60)
    screen = terminal.screen()
    assert "FaultInjectedError" in screen, screen
    assert "piwf view stopped on an unexpected error" in screen, screen
    assert MARKER not in screen, screen
