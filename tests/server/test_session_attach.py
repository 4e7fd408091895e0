"""``piwf session attach`` driven in a real terminal (tmux: send keys, read the screen): a
person acts as the session through an agent step and a checkpoint to completion, and Ctrl-C
aborts a turn, which pauses the run."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.client import Client
from tests.server.harness import ServerFactory, ServerProcess, wait_for
from tests.server.test_execution import FAST

PIWF = Path(sys.executable).parent / "piwf"
REVIEW = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "session_review.py")

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Terminal:
    """One tmux session on its own tmux server, running one command in an 80x40 pane."""

    def __init__(self, socket: str, command: str, env: dict[str, str]) -> None:
        self.socket = socket
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        # `read` keeps the pane after the command ends, so its exit status can be read.
        script = f"env {exports} {command}; echo EXIT=$?; read held"
        self._tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "40", script)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "t")

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", "t", "-l", text)
        self._tmux("send-keys", "-t", "t", "Enter")

    def interrupt(self) -> None:
        self._tmux("send-keys", "-t", "t", "C-c")

    def wait_for_text(self, text: str, *, count: int = 1) -> None:
        wait_for(
            lambda: self.screen().count(text) >= count,
            timeout_s=30,
            what=f"{text!r} on the screen:\n{self.screen()}",
        )

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


@pytest.fixture
def terminals(tmp_path: Path) -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def attach(server: ServerProcess, terminals: list[Terminal], session: str) -> Terminal:
    env = {"PIWF_HOME": str(server.home), "PATH": os.environ["PATH"]}
    command = f"{shlex.quote(str(PIWF))} session attach {session} --exit-when-done"
    terminal = Terminal(f"piwf-test-{os.getpid()}-{session}", command, env)
    terminals.append(terminal)
    return terminal


def test_a_person_takes_an_agent_step_and_a_checkpoint_to_completion(
    server: ServerProcess, terminals: list[Terminal]
) -> None:
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "the release"}, session="tty-1")
    terminal = attach(server, terminals, "tty-1")
    terminal.wait_for_text("Draft a one-line note about the release.")
    terminal.wait_for_text("output JSON>")
    terminal.type("not json")
    terminal.wait_for_text("not JSON")
    terminal.type('{"note": "ship it"}')
    terminal.wait_for_text("Approve the draft")
    terminal.wait_for_text("answer JSON>")
    terminal.type('{"approved": true}')
    terminal.wait_for_text("EXIT=0")
    screen = terminal.screen()
    assert 'run completed: {"approval":{"approved":true},"note":"ship it"}' in screen
    with Client(server.home, autostart=False) as client:
        done = client.wait_run(run.run_id, timeout_s=10)
        assert done.run.status == "completed"
        assert done.output == {"note": "ship it", "approval": {"approved": True}}
        # Each turn's capture keeps the step as shown and every line the person typed.
        captured = client.read_capture(run.run_id)
    draft = captured[0]
    assert draft.segment.status == "complete"
    assert [(e.kind, e.content) for e in draft.entries[1:]] == [
        ("user", "not json"),
        ("user", '{"note": "ship it"}'),
    ]
    assert draft.entries[0].kind == "workflowMessage"
    assert draft.segment.roles["prompt"] == draft.entries[0].entry_id
    assert draft.segment.roles["response"] == draft.entries[2].entry_id


# conformance: I5
def test_ctrl_c_during_a_step_aborts_the_turn_and_pauses_the_run(
    server: ServerProcess, terminals: list[Terminal]
) -> None:
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "x"}, session="tty-2")
        terminal = attach(server, terminals, "tty-2")
        terminal.wait_for_text("output JSON>")
        terminal.interrupt()
        terminal.wait_for_text("turn aborted")
        assert client.run_view(run.run_id).display.status == "paused"
        client.resume_run(run.run_id)
        terminal.wait_for_text("── step (resumed)")  # the step is presented once more
        terminal.wait_for_text("output JSON>", count=2)
        terminal.type('{"note": "after the pause"}')
        terminal.wait_for_text("answer JSON>")
        terminal.type("{}")
        terminal.wait_for_text("EXIT=0")
        assert client.wait_run(run.run_id, timeout_s=10).run.status == "completed"
