"""``piwf run show RUN --follow`` when its server dies under it: the follower starts a server
again, says that the node runs again as its next attempt, and ends with the run (exit 0, no
traceback)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tests.cli.test_cli_e2e import COMMAND_TIMEOUT_S, REPO, Piwf, processes_of
from tests.cli.test_cli_e2e import piwf as piwf  # the fixture, used by name
from tests.cli_process import PIWF
from tests.server.harness import wait_for
from tests.server.test_execution import hold_until_gate, write_workflow


def held_workflow(directory: Path, entered: Path, gate: Path) -> str:
    """``hold`` (blocks on ``gate``, each attempt touching ``entered``) then ``last``."""
    return write_workflow(
        directory,
        "held",
        f"""
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def hold(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return {{"held": True}}

        workflow = define_workflow(
            name="held",
            start_at="hold",
            nodes={{"hold": compute(hold), "last": compute(lambda ctx: {{"done": True}})}},
            edges=[{{"from": "hold", "to": "last"}}],
        )
        """,
    )


class Lines:
    """The lines a process prints on stdout, read from its descriptor as they come.

    Not through the pipe's text reader: a ``readline`` takes in a whole chunk, so a line that
    came with an earlier one would wait in that reader's buffer while ``select`` (which sees
    only the descriptor) waits for more, and a test would time out on a line already printed.
    """

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        self.process = process
        self.descriptor = process.stdout.fileno()
        self.seen: list[str] = []
        self.partial = b""

    def read_until(self, wanted: str, timeout_s: float = 30.0) -> None:
        """Read until a line contains ``wanted`` (fails with what was printed)."""
        deadline = time.monotonic() + timeout_s
        while not any(wanted in line for line in self.seen):
            left = deadline - time.monotonic()
            assert left > 0, "".join(self.seen) + self.partial.decode(errors="replace")
            ready, _, _ = select.select([self.descriptor], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.descriptor, 65536)
            assert chunk, ("the follower ended early", self.seen, self.process.wait())
            *complete, self.partial = (self.partial + chunk).split(b"\n")
            self.seen += [line.decode() for line in complete]


def server_pid(piwf: Piwf) -> int:
    (server,) = [
        process
        for process in processes_of(piwf.home)
        if "server" in process.cmdline() and "run" in process.cmdline()
    ]
    return server.pid


def test_a_follower_whose_server_is_killed_goes_on_and_shows_the_next_attempt(
    piwf: Piwf, tmp_path: Path
) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = held_workflow(tmp_path, entered, gate)
    run_id = piwf.json("run", "start", workflow)["run"]["runId"]
    wait_for(entered.exists, timeout_s=30, what="the hold node")
    follower = subprocess.Popen(
        [str(PIWF), "run", "show", run_id, "--follow"],
        env=piwf.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    printed = Lines(follower)
    try:
        printed.read_until("following (Ctrl-C stops):")
        killed = server_pid(piwf)
        entered.unlink()
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: not psutil.pid_exists(killed), timeout_s=30, what="the server's end")
        # The follower starts a server again; it recovers the run and runs "hold" once more.
        printed.read_until('running "hold" (attempt 2)')
        wait_for(entered.exists, timeout_s=30, what="the second attempt")
        gate.touch()
        out_bytes, err_bytes = follower.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    out, err = (printed.partial + out_bytes).decode(), err_bytes.decode()
    assert follower.returncode == 0, err
    assert "Traceback" not in err, err
    lines = printed.seen + out.splitlines()
    assert lines[-2].startswith(f"{run_id}  completed"), lines
    assert lines[-1] == 'output: {"done":true}', lines


def test_a_follower_says_running_only_while_a_node_runs(piwf: Piwf, tmp_path: Path) -> None:
    """A parked run keeps its interrupted attempt and a sleeping one its timer node as the
    view's ``currentNode``: neither is running, and ``--follow`` must not say it is."""
    crash = write_workflow(
        tmp_path,
        "crash",
        """
        import os
        from piwf.workflow import compute, define_workflow

        def die(ctx):
            os._exit(3)

        workflow = define_workflow(
            name="crash", start_at="a",
            nodes={"a": compute(lambda ctx: 1), "b": compute(die)},
            edges=[{"from": "a", "to": "b"}],
        )
        """,
    )
    parked = piwf.json("run", "start", crash)["run"]["runId"]
    wait_for(
        lambda: piwf.json("run", "show", parked)["run"]["needsAction"], 60, "the no-progress park"
    )
    followed = piwf.run("run", "show", parked, "--follow")
    assert followed.returncode == 0, followed.stderr
    tail = followed.stdout.split("following (Ctrl-C stops):\n")[1]
    assert "running" not in tail, tail
    assert tail.startswith('  blocked: its runner exited with code 3 while node "b"'), tail

    nap = write_workflow(
        tmp_path,
        "nap",
        """
        from piwf.workflow import compute, define_workflow, sleep

        workflow = define_workflow(
            name="nap", start_at="nap",
            nodes={"nap": sleep(5000), "after": compute(lambda ctx: 1)},
            edges=[{"from": "nap", "to": "after"}],
        )
        """,
    )
    sleeping = piwf.json("run", "start", nap)["run"]["runId"]
    wait_for(lambda: piwf.json("run", "explain", sleeping)["cause"] == "sleeping", 30, "the timer")
    explained = piwf.json("run", "explain", sleeping)["explanation"]
    assert explained.startswith('node "nap" is a timer: the run sleeps until '), explained
    followed = piwf.run("run", "show", sleeping, "--follow")
    assert followed.returncode == 0, followed.stderr
    tail = followed.stdout.split("following (Ctrl-C stops):\n")[1]
    assert 'running "nap"' not in tail, tail
    assert '  sleeping at node "nap" until ' in tail, tail
