"""A thread the workflow code leaves running never keeps a child, or a runner slot, taken."""

from __future__ import annotations

from pathlib import Path

import psutil

from tests.server.harness import ServerFactory, raw_client, wait_for
from tests.server.test_execution import (
    FAST,
    runner_children,
    runner_statuses,
    start,
    wait_run,
    write_workflow,
)

# Each import (in the resolver child, then in the runner) and the node start a non-daemon
# thread that waits for an event nobody sets.
LINGERING = """
import threading
from piwf.workflow import compute, define_workflow

NEVER = threading.Event()
threading.Thread(target=NEVER.wait, name="import-thread").start()


def spawn(ctx):
    threading.Thread(target=NEVER.wait, name="node-thread").start()
    return ctx.input


workflow = define_workflow(
    name=NAME, start_at="spawn", nodes={"spawn": compute(spawn)}, edges=[]
)
"""


def resolver_children(pid: int) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if " ".join(child.cmdline()).startswith("piwf resolver"):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_children_end_with_their_work_whatever_threads_the_workflow_left_running(
    servers: ServerFactory, tmp_path: Path
) -> None:
    # One slot: a runner that stayed after its run ended would keep the second run queued.
    server = servers.start(env={**FAST, "PIWF_MAX_WORKERS": "1"})
    first = write_workflow(tmp_path, "first", LINGERING.replace("NAME", "'first'"))
    second = write_workflow(tmp_path, "second", LINGERING.replace("NAME", "'second'"))
    with raw_client(server) as client:
        run_id = start(client, first, 1, "first")
        wait_for(lambda: resolver_children(server.process.pid) == [], what="the resolver's exit")
        assert wait_run(client, run_id)["status"] == "completed"
        wait_for(lambda: runner_statuses(server) == ["exited"], what="the first runner's exit")
        assert runner_children(server) == []
        run_id = start(client, second, 2, "second")
        run = wait_run(client, run_id, timeout_ms=20_000)
    assert run["status"] == "completed", run
    wait_for(lambda: runner_children(server) == [], what="the second runner's exit")
