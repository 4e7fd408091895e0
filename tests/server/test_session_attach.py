"""``piwf session attach`` driven in a real terminal (tmux: send keys, read the screen): a
person acts as the session through an agent step and a checkpoint to completion, Ctrl-C
aborts a turn, which pauses the run, and Ctrl-D aborts it too and detaches."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.client import Client
from tests.server.harness import ServerFactory, ServerProcess
from tests.server.test_execution import FAST
from tests.tmux import TmuxTerminal

PIWF = Path(sys.executable).parent / "piwf"
REVIEW = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "session_review.py")

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


@pytest.fixture
def terminals(tmp_path: Path) -> Iterator[list[TmuxTerminal]]:
    opened: list[TmuxTerminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def attach(server: ServerProcess, terminals: list[TmuxTerminal], session: str) -> TmuxTerminal:
    env = {"PIWF_HOME": str(server.home), "PATH": os.environ["PATH"]}
    command = f"{shlex.quote(str(PIWF))} session attach {session} --exit-when-done"
    terminal = TmuxTerminal(f"piwf-test-{os.getpid()}-{session}", command, env, history_lines=200)
    terminals.append(terminal)
    return terminal


def test_a_person_takes_an_agent_step_and_a_checkpoint_to_completion(
    server: ServerProcess, terminals: list[TmuxTerminal]
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
    server: ServerProcess, terminals: list[TmuxTerminal]
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


def test_ctrl_d_during_a_step_aborts_the_turn_once_and_detaches(
    server: ServerProcess, terminals: list[TmuxTerminal]
) -> None:
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "x"}, session="tty-3")
        terminal = attach(server, terminals, "tty-3")
        terminal.wait_for_text("output JSON>")
        terminal.press("C-d")
        terminal.wait_for_text("EXIT=1")  # detached before the run ended (--exit-when-done)
        screen = terminal.screen()
        assert screen.count("turn aborted") == 1, screen
        assert "end of input: detached" in screen, screen
        assert client.run_view(run.run_id).display.status == "paused"
