"""``piwf session attach`` when its terminal or its server goes away under an open turn.

Closing the terminal (a hang-up) is the end of input: the turn is aborted and the run pauses,
as with Ctrl-D, instead of the turn being left open to end ``lost`` (three of those fail the
step ``missingSubmission``). A server restart is no end at all: the host attaches again,
reports the step it shows as still on the screen, and the line typed next is the turn's
answer, instead of the reattach ending the host's own turn and the host exiting 1.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import subprocess
import termios
import time

from piwf.client import Client
from tests.server.harness import ServerFactory, ServerProcess
from tests.server.test_execution import FAST
from tests.server.test_session_attach_ends import (
    EXIT_DEADLINE_S,
    PIWF,
    REVIEW,
    Host,
    hosts,
    server,
    start_host,
)

__all__ = ["hosts", "server"]  # fixtures used here


class TerminalHost:
    """``piwf session attach`` in a pseudo-terminal that is its controlling terminal, as in
    a terminal window: closing the terminal hangs it up (SIGHUP, then EIO on every read)."""

    def __init__(self, server: ServerProcess, session: str) -> None:
        self.master, slave = pty.openpty()

        def take_the_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen(
            [str(PIWF), "session", "attach", session],
            env={**os.environ, "PIWF_HOME": str(server.home)},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=take_the_terminal,
        )
        os.close(slave)
        self.seen = b""

    def until(self, text: str) -> None:
        """Read the screen until ``text`` shows (bounded)."""
        deadline = time.monotonic() + EXIT_DEADLINE_S
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never showed: {self.seen!r}"
            if select.select([self.master], [], [], left)[0]:
                chunk = os.read(self.master, 65536)
                assert chunk, f"the terminal closed before {text!r}: {self.seen!r}"
                self.seen += chunk

    def close_terminal(self) -> int:
        """Close the terminal window; return the host's exit code once it ended."""
        os.close(self.master)
        return self.process.wait(timeout=EXIT_DEADLINE_S)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def test_closing_the_terminal_aborts_the_turn_and_pauses_the_run(server: ServerProcess) -> None:
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "x"}, session="hangup-1")
        for _ in range(3):  # three lost turns would fail the step: aborts never do
            host = TerminalHost(server, "hangup-1")
            try:
                host.until("output JSON>")
                assert host.close_terminal() == 0
            finally:
                host.kill()
            assert client.run_view(run.run_id).display.status == "paused"
            client.resume_run(run.run_id)
        turns = client.read_capture(run.run_id)
        assert [turn.segment.failure for turn in turns] == ["the turn ended aborted"] * 3
        assert client.get_run(run.run_id).run.status == "waiting"


def test_a_server_restart_under_an_open_turn_keeps_the_turn(
    servers: ServerFactory, hosts: list[Host]
) -> None:
    first = servers.start(env=FAST)
    with Client(first.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "x"}, session="restart-1")
    host = start_host(hosts, first, "restart-1", "--exit-when-done", stdin=subprocess.PIPE)
    host.wait_for_stderr("output JSON>")
    first.kill()
    second = servers.start(env=FAST)
    host.type('{"note": "typed across the restart"}')
    host.wait_for_stderr("answer JSON>")
    host.type('{"approved": true}')
    assert host.exit_code() == 0, host.stderr()
    said = host.stderr()
    assert "already ended" not in said and "not captured" not in said, said
    with Client(second.home, autostart=False) as client:
        detail = client.wait_run(run.run_id, timeout_s=20)
        assert detail.run.status == "completed"
        draft = client.read_capture(run.run_id)[0].segment
        assert (draft.node_path, draft.status) == ("draft", "complete")
