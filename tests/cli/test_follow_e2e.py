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

from tests.cli.test_cli_e2e import COMMAND_TIMEOUT_S, PIWF, REPO, Piwf, processes_of
from tests.cli.test_cli_e2e import piwf as piwf  # the fixture, used by name
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


def read_until(process: subprocess.Popen[str], wanted: str, seen: list[str]) -> None:
    """Read ``process``'s stdout into ``seen`` line by line until a line contains ``wanted``
    (30 s at most; fails with what it printed)."""
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    while not any(wanted in line for line in seen):
        left = deadline - time.monotonic()
        assert left > 0, seen
        ready, _, _ = select.select([process.stdout], [], [], left)
        if ready:
            line = process.stdout.readline()
            assert line, ("the follower ended early", seen, process.wait())
            seen.append(line)


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
        text=True,
    )
    try:
        seen: list[str] = []
        read_until(follower, "following (Ctrl-C stops):", seen)
        killed = server_pid(piwf)
        entered.unlink()
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: not psutil.pid_exists(killed), timeout_s=30, what="the server's end")
        # The follower starts a server again; it recovers the run and runs "hold" once more.
        read_until(follower, 'running "hold" (attempt 2)', seen)
        wait_for(entered.exists, timeout_s=30, what="the second attempt")
        gate.touch()
        out, err = follower.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    assert "Traceback" not in err, err
    lines = "".join(seen).splitlines() + out.splitlines()
    assert lines[-2].startswith(f"{run_id}  completed"), lines
    assert lines[-1] == 'output: {"done":true}', lines
