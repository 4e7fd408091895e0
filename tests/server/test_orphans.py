"""No process outlives its server or its run: the lifeline, the subreaper and tree kills.

Real servers, real children, real signals. Two families:

- **The server dies** (SIGKILL, never restarted) while a runner executes a node that sleeps,
  spins, waits on a subprocess of its own or left a ``setsid`` daemon behind, and while a
  resolver or a reconcile runs user code: every process of that server's tree, taken with
  psutil before the kill (runner by its ``run_runners``/``managed_resource_runners`` identity,
  the fork server and the resource tracker, grandchildren, daemons), is gone within
  :data:`BOUND_S` of the kill, with either start method (forked by the fork server, spawned).
- **The run ends** while a node's double-forked ``setsid`` daemon sleeps: the node completes,
  the run is cancelled, or the node overruns its deadline frozen and the server kills its
  runner. The daemon is gone each time, though it left the runner's process group.

Workflow code reports what it saw in marker files (written whole, then renamed); every wait
polls a condition against a deadline.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf.client import Client
from piwf.processes import is_alive
from tests.server.children import METHODS, fork_servers, gone, resource_trackers, start_server
from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import query, start, wait_run, write_workflow
from tests.server.test_resources import project_with

#: The brief's bound: every child stops within 2 s of its server's death...
DEATH_BOUND_S = 2.0
#: ...plus a margin for scheduling on a loaded machine (the kill, the wake-up, the poll).
SCHEDULING_MARGIN_S = 1.0
BOUND_S = DEATH_BOUND_S + SCHEDULING_MARGIN_S

#: Marker-file writing, shared by the generated workflow and manager code.
_REPORT = """
def report(path, **facts):
    import json, os
    temporary = path + ".tmp"
    with open(temporary, "w") as out:
        json.dump(facts, out)
    os.replace(temporary, path)
"""

#: A double fork: the middle process leads a new session and exits, the daemon (adopted by
#: its nearest subreaper, else init) reports where it landed and sleeps.
_DAEMON = """
def spawn_daemon(path):
    import os, time
    middle = os.fork()
    if middle == 0:
        try:
            os.setsid()
            parent = os.getpid()
            if os.fork() == 0:
                deadline = time.monotonic() + 10
                while os.getppid() == parent and time.monotonic() < deadline:
                    time.sleep(0.005)  # until the middle process is gone and it is adopted
                from piwf.processes import start_identity
                report(path, pid=os.getpid(), identity=start_identity(os.getpid()),
                       ppid=os.getppid(), sid=os.getsid(0), pgid=os.getpgid(0))
                time.sleep(60)
        finally:
            os._exit(0)
    os.waitpid(middle, 0)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
"""

#: What each node does once it has reported its runner's pid (and its own child's).
_BLOCKERS = {
    "sleep": "time.sleep(60)",
    "busy": (
        "deadline = time.monotonic() + 60\n"
        "            while time.monotonic() < deadline:\n"
        "                pass  # a pure Python loop: the lifeline thread must still get the GIL"
    ),
    "subprocess": "child.wait()",
    "daemon": "time.sleep(60)",
}


def workflow_file(directory: Path, name: str, source: str) -> str:
    """Write ``source`` (helpers first) as ``name``.py in ``directory``; return its path."""
    return write_workflow(directory, name, _REPORT + _DAEMON + textwrap.dedent(source))


def blocking_workflow(directory: Path, blocker: str, marker: Path, daemon: Path) -> str:
    """A one-node workflow whose node reports its facts to ``marker``, then blocks."""
    return workflow_file(
        directory,
        f"blocks_{blocker}",
        f"""
        import os, subprocess, sys, time
        from piwf.workflow import compute, define_workflow

        def hold(ctx):
            child = None
            if {blocker!r} == "subprocess":
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            if {blocker!r} == "daemon":
                spawn_daemon({str(daemon)!r})
            report({str(marker)!r}, pid=os.getpid(), child=child and child.pid)
            {_BLOCKERS[blocker]}
            return 1

        workflow = define_workflow(
            name="blocks_{blocker}", start_at="hold", nodes={{"hold": compute(hold)}}, edges=[]
        )
        """,
    )


def read_report(path: Path) -> dict[str, Any]:
    """The facts workflow code wrote to ``path`` (it renames a whole file into place)."""
    wait_for(path.exists, timeout_s=30, what=path.name)
    facts: dict[str, Any] = json.loads(path.read_text())
    return facts


def recorded_process(server: ServerProcess, table: str, pid: int) -> psutil.Process:
    """The live child ``pid`` as ``table`` records it (pid and exact start identity)."""

    def live() -> psutil.Process | None:
        rows = query(server, f"SELECT process_start_identity FROM {table} WHERE pid = ?", (pid,))
        for (identity,) in rows:
            if identity is not None and is_alive(identity):
                return psutil.Process(pid)
        return None

    process: psutil.Process = wait_for(live, timeout_s=30, what=f"{pid} live in {table}")
    return process


def server_tree(server: ServerProcess) -> list[psutil.Process]:
    """Every live process below the server now (the fork server, the resource tracker,
    children, grandchildren, daemons adopted by a runner)."""
    tree = [p for p in psutil.Process(server.process.pid).children(recursive=True) if not gone(p)]
    assert set(resource_trackers(server)) <= set(tree)
    return tree


def kill_and_time_the_tree(server: ServerProcess, tree: list[psutil.Process]) -> float:
    """SIGKILL the server; return how long its tree took to be gone (fail past 15 s)."""
    killed_at = time.monotonic()
    server.process.kill()
    wait_for(
        lambda: all(gone(process) for process in tree),
        timeout_s=15,
        what=f"the server's tree {[p.pid for p in tree]} to be gone",
    )
    elapsed = time.monotonic() - killed_at
    server.process.wait(timeout=10)
    return elapsed


# -- the server dies -------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("blocker", sorted(_BLOCKERS))
def test_a_runner_and_everything_it_started_end_with_a_killed_server(
    servers: ServerFactory, tmp_path: Path, method: str, blocker: str
) -> None:
    server = start_server(servers, method)
    marker, daemon = tmp_path / "node.json", tmp_path / "daemon.json"
    workflow = blocking_workflow(tmp_path, blocker, marker, daemon)
    with raw_client(server) as client:
        start(client, workflow, {}, f"blocks-{blocker}")
    runner = recorded_process(server, "run_runners", read_report(marker)["pid"])
    facts = read_report(marker)
    tree = server_tree(server)
    pids = {process.pid for process in tree}
    assert runner.pid in pids
    if method == "forkserver":
        (fork_server,) = fork_servers(server)
        assert runner.ppid() == fork_server.pid and fork_server.pid in pids
    else:
        assert runner.ppid() == server.process.pid and not fork_servers(server)
    if blocker == "subprocess":
        assert facts["child"] in pids, "the node's subprocess is in the tree"
    if blocker == "daemon":
        adopted = read_report(daemon)
        assert adopted["ppid"] == runner.pid, "the runner adopted the daemon (subreaper)"
        assert adopted["sid"] == adopted["pgid"] != runner.pid, "the daemon left the group"
        assert adopted["pid"] in pids
    elapsed = kill_and_time_the_tree(server, tree)
    assert elapsed <= BOUND_S, f"the last of {sorted(pids)} ended {elapsed:.2f} s after the kill"


_IMPORT_BLOCKS = (
    _REPORT
    + """
import os, sys, time
from piwf.workflow import compute, define_workflow

if sys.argv[0].endswith("resolver.py"):  # only inside the resolver child
    report({marker!r}, pid=os.getpid())
    time.sleep(60)

workflow = define_workflow(
    name="slow_import", start_at="a", nodes={{"a": compute(lambda ctx: 1)}}, edges=[]
)
"""
)

_RECONCILE_BLOCKS = (
    _REPORT
    + """
import os, time
from piwf.resource import define_resource_manager, settled

def reconcile(ctx, resource):
    report(resource.spec["marker"], pid=os.getpid())
    time.sleep(60)   # ignores ctx.signal on purpose
    return settled()

manager = define_resource_manager(
    name="sleepy", initial_status=lambda spec: {}, reconcile=reconcile, timeout_ms=60000
)
"""
)


@pytest.mark.parametrize("method", METHODS)
def test_a_resolver_running_import_time_code_ends_with_a_killed_server(
    servers: ServerFactory, tmp_path: Path, method: str
) -> None:
    server = start_server(servers, method)
    marker = tmp_path / "resolver.json"
    workflow = write_workflow(tmp_path, "slow_import", _IMPORT_BLOCKS.format(marker=str(marker)))
    with raw_client(server) as client:
        client.send("run.start", {"workflow": workflow, "input": {}}, key="slow")
        resolver = psutil.Process(read_report(marker)["pid"])
        tree = server_tree(server)
        assert resolver in tree, "the resolver is a child of this server (or its fork server)"
        elapsed = kill_and_time_the_tree(server, tree)
    assert elapsed <= BOUND_S, f"the resolver's tree ended {elapsed:.2f} s after the kill"


@pytest.mark.parametrize("method", METHODS)
def test_a_resource_runner_ends_with_a_killed_server(
    servers: ServerFactory, tmp_path: Path, method: str
) -> None:
    server = start_server(servers, method)
    marker = tmp_path / "reconcile.json"
    project = project_with(tmp_path, sleepy=_RECONCILE_BLOCKS)
    with Client(home=server.home, autostart=False) as client:
        client.apply_resource("sleepy", "s", {"marker": str(marker)}, project=project)
    runner = recorded_process(server, "managed_resource_runners", read_report(marker)["pid"])
    tree = server_tree(server)
    assert runner in tree
    elapsed = kill_and_time_the_tree(server, tree)
    assert elapsed <= BOUND_S, f"the resource runner's tree ended {elapsed:.2f} s after the kill"


# -- the run ends ----------------------------------------------------------------------------


def daemon_workflow(
    directory: Path, daemon: Path, marker: Path, then: str, timeout_ms: int | None
) -> str:
    """A one-node workflow whose node leaves a ``setsid`` daemon behind, reports its runner's
    pid to ``marker``, then does ``then``."""
    return workflow_file(
        directory,
        "daemonizes",
        f"""
        import os, pathlib, signal, time
        from piwf.workflow import compute, define_workflow

        def leave_a_daemon(ctx):
            if not os.path.exists({str(daemon)!r}):
                spawn_daemon({str(daemon)!r})
                report({str(marker)!r}, pid=os.getpid())
                {then}
            return {{"done": True}}

        workflow = define_workflow(
            name="daemonizes",
            start_at="a",
            nodes={{"a": compute(leave_a_daemon, timeout_ms={timeout_ms!r})}},
            edges=[],
        )
        """,
    )


def adopted_daemon(daemon: Path, runner_pid: int | None = None) -> str:
    """The daemon's start identity, once it reported that it left the runner's session and
    was adopted by the runner."""
    facts = read_report(daemon)
    assert facts["sid"] == facts["pgid"] != runner_pid, "the daemon left the runner's group"
    if runner_pid is not None:
        assert facts["ppid"] == runner_pid, "the runner adopted it (subreaper)"
    identity: str = facts["identity"]
    return identity


def test_a_nodes_daemon_is_gone_before_the_node_is_recorded_finished(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(servers, "forkserver")
    daemon, marker = tmp_path / "daemon.json", tmp_path / "node.json"
    workflow = daemon_workflow(tmp_path, daemon, marker, then="pass", timeout_ms=None)
    with raw_client(server) as client:
        run = wait_run(client, start(client, workflow, {}, "daemon"))
        assert run["status"] == "completed"
        # Checked at once, not waited for: the node's processes end before its result is sent.
        assert not is_alive(adopted_daemon(daemon, read_report(marker)["pid"]))
    statuses = "SELECT status FROM run_runners ORDER BY started_at"
    wait_for(lambda: query(server, statuses) == [("exited",)], what="a clean exit")


@pytest.mark.parametrize("method", METHODS)
def test_a_nodes_daemon_ends_when_the_run_is_cancelled(
    servers: ServerFactory, tmp_path: Path, method: str
) -> None:
    server = start_server(servers, method)
    daemon, marker = tmp_path / "daemon.json", tmp_path / "node.json"
    workflow = daemon_workflow(tmp_path, daemon, marker, then="time.sleep(60)", timeout_ms=None)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "daemon")
        runner = recorded_process(server, "run_runners", read_report(marker)["pid"])
        identity = adopted_daemon(daemon, runner.pid)
        cancelled = client.request("run.cancel", key="cancel", run_id=run_id)
        assert cancelled.outcome == "accepted", cancelled
        wait_for(lambda: not is_alive(identity), timeout_s=10, what="the daemon to end")
        wait_for(lambda: gone(runner), timeout_s=10, what="the runner to end")
    statuses = "SELECT status FROM run_runners ORDER BY started_at"
    wait_for(lambda: query(server, statuses)[-1] == ("cancelled",), what="the runner's row")


def test_a_frozen_nodes_daemon_ends_when_the_server_kills_its_runner_at_the_deadline(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """The runner is stopped (SIGSTOP) past its node's deadline, so it can end nothing itself:
    the server's kill freezes and walks the tree and takes the daemon too."""
    server = start_server(servers, "forkserver")
    daemon, marker = tmp_path / "daemon.json", tmp_path / "node.json"
    freeze = "os.kill(os.getpid(), signal.SIGSTOP)  # the whole runner, engine included"
    workflow = daemon_workflow(tmp_path, daemon, marker, then=freeze, timeout_ms=300)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "daemon")
        runner = recorded_process(server, "run_runners", read_report(marker)["pid"])
        identity = adopted_daemon(daemon, runner.pid)
        wait_for(lambda: runner.status() == psutil.STATUS_STOPPED, what="the runner to freeze")
        wait_for(lambda: gone(runner), timeout_s=15, what="the server to kill the runner")
        wait_for(lambda: not is_alive(identity), timeout_s=5, what="the daemon to end with it")
        assert wait_run(client, run_id)["status"] == "completed"
    statuses = "SELECT status FROM run_runners ORDER BY started_at"
    assert ("timedOut",) in query(server, statuses)
