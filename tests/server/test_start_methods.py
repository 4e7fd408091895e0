"""Children on ``multiprocessing``'s start methods: forked by a fork server, or spawned.

Real servers, real children, real signals, with both ``PIWF_START_METHOD`` values where the
property holds for both: a runner begins in its own session with its start identity recorded
and nothing of the server or the fork server in its hands; a killed runner is a crash that its
run recovers from, even when a process it forked still holds its pipes; a killed fork server
takes its child along and is replaced; a fork server that does not answer costs one start; a
killed server leaves no helper nor child, and a child ends by its parent sentinel (the server's,
not the fork server's). Workflow code reports what it saw in marker files; every wait polls a
condition against a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf.server.children.capture import (
    ATTEMPT_LOG_CAP,
    ATTEMPT_LOG_TAIL,
    head_marker,
    tail_marker,
)
from piwf.server.children.forked_fork_server import is_fork_server
from piwf.server.children.start_methods import START_TIMEOUT_S
from tests.server import harness
from tests.server.children import (
    FAST,
    HELLO,
    METHODS,
    driver_process,
    fork_servers,
    gone,
    resource_trackers,
    start_server,
)
from tests.server.harness import ServerFactory, raw_client, wait_for
from tests.server.test_execution import query, start, wait_run, write_workflow

#: How long after its server's SIGKILL a child may still run (the 2 s rule plus scheduling).
DEATH_BOUND_S = 3.0


def descriptor_targets(pid: int) -> dict[int, str]:
    """What each open descriptor of ``pid`` points at (``pipe:[N]``, ``socket:[N]``, a path)."""
    targets = {}
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with suppress(OSError):
            targets[int(entry.name)] = str(entry.readlink())
    return targets


def facts_workflow(
    directory: Path, name: str, out: Path, then: str = "pass", prelude: str = "pass"
) -> str:
    """A one-node workflow whose node writes what its process looks like to ``out`` (whole,
    then renamed), then runs ``then``; ``prelude`` runs when the file is imported (by the
    resolver and by the runner)."""
    return write_workflow(
        directory,
        name,
        f"""
        import json, os, pathlib, signal, sys, time
        from piwf.processes import start_identity
        from piwf.workflow import compute, define_workflow

        {prelude}

        def target(fd):
            try:
                return os.readlink(f"/proc/self/fd/{{fd}}")
            except OSError:
                return None  # the descriptor of the directory listing, closed by now

        def facts(ctx):
            pid = os.getpid()
            record = {{
                "pid": pid, "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                "identity": start_identity(pid), "argv": sys.argv, "cwd": os.getcwd(),
                "fds": {{fd: target(fd) for fd in os.listdir("/proc/self/fd")}},
                "faults": os.environ.get("PIWF_FAULTS"), "path0": sys.path[0],
                "sessionMark": os.environ.get("PIWF_FORK_SERVER_SESSION"),
            }}
            pathlib.Path({str(out)!r} + ".tmp").write_text(json.dumps(record))
            os.replace({str(out)!r} + ".tmp", {str(out)!r})
            {then}
            return {{"ok": True}}

        workflow = define_workflow(
            name={name!r}, start_at="a", nodes={{"a": compute(facts)}}, edges=[]
        )
        """,
    )


def read_facts(path: Path) -> dict[str, Any]:
    wait_for(path.exists, timeout_s=30, what=path.name)
    facts: dict[str, Any] = json.loads(path.read_text())
    return facts


@pytest.mark.parametrize("method", METHODS)
def test_a_runner_begins_in_its_own_session_holding_nothing_of_the_server(
    servers: ServerFactory, tmp_path: Path, method: str
) -> None:
    # The server's own fault points are not the child's (it gets PIWF_CHILD_FAULTS instead).
    server = start_server(servers, method, env={"PIWF_FAULTS": "runner.after_exit_commit@99=kill"})
    out, project = tmp_path / "facts.json", tmp_path / "project"
    project.mkdir()
    workflow = facts_workflow(tmp_path, "facts", out)
    with raw_client(server) as client:
        response = client.request(
            "run.start",
            {"workflow": workflow, "input": {}, "projectPath": str(project)},
            key="facts",
        )
        assert response.outcome == "accepted", response
        assert response.receipt is not None
        assert wait_run(client, str(response.receipt["run"]["runId"]))["status"] == "completed"
    facts = read_facts(out)
    assert facts["pgid"] == facts["pid"], "its own process group"
    if method == "forkserver":
        (fork_server,) = fork_servers(server)
        assert facts["ppid"] == fork_server.pid, "forked by the server's fork server"
        # The session every forked child shares (one scheduling group): the fork server's,
        # which is not the server's; the mark that asked for it is not passed on.
        assert facts["sid"] == fork_server.pid == os.getsid(fork_server.pid)
        assert os.getsid(server.process.pid) != fork_server.pid
        assert facts["sessionMark"] is None
    else:
        assert facts["ppid"] == server.process.pid, "spawned by the server itself"
        assert fork_servers(server) == []
        assert facts["sid"] == facts["pid"], "a spawned child leads a session of its own"
    assert facts["cwd"] == str(project)
    assert facts["faults"] is None
    assert facts["argv"][0].endswith("workflow_runner.py")
    assert facts["argv"][1] == "--fd"
    descriptors = {int(fd): target for fd, target in facts["fds"].items() if target is not None}
    channel = int(facts["argv"][2])
    assert descriptors[channel].startswith("socket:")
    # Its channel is its only socket (nothing of the listener or of clients), no database.
    assert [fd for fd, t in descriptors.items() if t.startswith("socket:")] == [channel]
    assert not any("sqlite" in target for target in descriptors.values()), descriptors
    if method == "forkserver":
        # Of the fork server's descriptors it shares only the resource tracker's pipe: not
        # the fork server's "alive" pipe, whose end-of-file ends the fork server.
        shared = set(descriptors.values()) & set(descriptor_targets(fork_server.pid).values())
        (tracker,) = resource_trackers(server)
        assert shared <= set(descriptor_targets(tracker.pid).values()), shared
    runners = "SELECT pid, process_start_identity, status FROM run_runners"
    wait_for(
        lambda: query(server, runners) == [(facts["pid"], facts["identity"], "exited")],
        what="the runner's row: its pid, its start identity and a clean exit",
    )


@pytest.mark.parametrize("method", METHODS)
def test_a_killed_runner_is_seen_ended_although_a_process_it_forked_holds_its_pipes(
    servers: ServerFactory, tmp_path: Path, method: str
) -> None:
    """The node forks a sleeper (no exec, same group: it holds every descriptor the runner
    had, its sentinel's write end under spawn among them), then the runner SIGKILLs itself.
    The exit is still seen at once, the sleeper ends with the group, the run recovers."""
    server = start_server(servers, method)
    sleeper, killed = tmp_path / "sleeper", tmp_path / "killed"
    workflow = write_workflow(
        tmp_path,
        "killed",
        f"""
        import os, pathlib, signal, time
        from piwf.workflow import compute, define_workflow

        def first(ctx):
            return {{"step": 1}}

        def die(ctx):
            marker = pathlib.Path({str(killed)!r})
            if not marker.exists():
                marker.touch()
                child = os.fork()
                if child == 0:
                    time.sleep(60)  # holds the runner's descriptors; ends with its group
                    os._exit(0)
                # Whole, then renamed: the test reads it as soon as the name exists.
                pathlib.Path({str(sleeper)!r} + ".tmp").write_text(str(child))
                os.replace({str(sleeper)!r} + ".tmp", {str(sleeper)!r})
                os.kill(os.getpid(), signal.SIGKILL)
            return {{"step": 2}}

        workflow = define_workflow(
            name="killed", start_at="first",
            nodes={{"first": compute(first), "die": compute(die)}},
            edges=[{{"from": "first", "to": "die"}}],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "killed")
        wait_for(sleeper.exists, timeout_s=30, what="the sleeper")
        forked = psutil.Process(int(sleeper.read_text()))
        assert wait_run(client, run_id, timeout_ms=20_000)["status"] == "completed"
    assert gone(forked), "the sleeper ended with its runner's group"
    rows = "SELECT status, exit_code, signal FROM run_runners ORDER BY started_at"
    wait_for(lambda: query(server, rows)[-1][0] == "exited", what="the second runner's exit")
    assert query(server, rows)[0] == ("crashed", None, "signal 9")


def test_a_killed_fork_server_takes_its_running_child_along_and_a_new_one_serves(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(servers, "forkserver")
    (first,) = fork_servers(server)
    out, gate = tmp_path / "facts.json", tmp_path / "gate"
    hold = f"""
            while not pathlib.Path({str(gate)!r}).exists():
                time.sleep(0.01)"""
    workflow = facts_workflow(tmp_path, "held", out, then=hold.strip())
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "held")
        runner = read_facts(out)["pid"]
        assert psutil.Process(runner).ppid() == first.pid
        # The fork server dies under a running child: the kernel sends the child SIGTERM (its
        # parent-death signal), the server reads end-of-file where the status would come
        # (status unknown), kills what is left of the tree, and the run gets a new runner.
        runner_process = psutil.Process(runner)
        first.kill()
        wait_for(lambda: gone(runner_process), what="the fork server's child to end")
        wait_for(
            lambda: (
                query(server, "SELECT status FROM run_runners WHERE pid = ?", (runner,))
                == [("crashed",)]
            ),
            what="the child's end seen (its status is unknown: crashed)",
        )
        gate.touch()
        assert wait_run(client, run_id)["status"] == "completed"
    (second,) = fork_servers(server)
    assert second.pid != first.pid and gone(first)
    assert read_facts(out)["ppid"] == second.pid, "the next runner came from the new one"


def test_a_fork_server_that_does_not_answer_costs_one_start_and_is_replaced(
    servers: ServerFactory, tmp_path: Path
) -> None:
    # No spare runner: the start that finds the fork server stuck must be the resolver's (a
    # spare asked for when the warm run ended would time out first and replace it).
    server = start_server(servers, "forkserver", env={"PIWF_SPARE_RUNNERS": "0"})
    (stuck,) = fork_servers(server)
    # Each start below needs a resolver child: a workflow file it has not resolved yet.
    fresh = [tmp_path / f"hello_{n}.py" for n in range(3)]
    for path in fresh:
        path.write_text(Path(HELLO).read_text())
    try:
        with raw_client(server) as client:
            warm = start(client, str(fresh[0]), {"who": "z"}, "warm")
            assert wait_run(client, warm)["status"] == "completed"
            stuck.suspend()  # it has forked before; now alive, but it will never fork again
            payload = {"workflow": str(fresh[1]), "input": {"who": "z"}}
            refused = client.request("run.start", payload, key="refused")
            assert refused.outcome == "unavailable", refused
            assert refused.error is not None and refused.error.code == "resolverFailed"
            assert f"did not start in {START_TIMEOUT_S:g} s" in refused.error.message
            assert client.request("server.status").outcome == "accepted"
            wait_for(lambda: gone(stuck), what="the fork server that did not answer to be killed")
            after = start(client, str(fresh[2]), {"who": "z"}, "after")
            assert wait_run(client, after)["status"] == "completed"
    finally:
        with suppress(psutil.Error):
            stuck.kill()
    (replacement,) = fork_servers(server)
    assert replacement.pid != stuck.pid


@pytest.mark.parametrize("method", METHODS)
def test_a_killed_server_leaves_no_helper_nor_child_and_its_run_is_recovered(
    servers: ServerFactory, tmp_path: Path, method: str
) -> None:
    server = start_server(servers, method)
    out, entered = tmp_path / "facts.json", tmp_path / "entered"
    hold = f"""
            marker = pathlib.Path({str(entered)!r})
            if not marker.exists():
                marker.touch()
                time.sleep(60)  # the runner's lifeline ends it here"""
    workflow = facts_workflow(tmp_path, "orphan", out, then=hold.strip())
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "orphan")
    runner = psutil.Process(read_facts(out)["pid"])
    helpers = resource_trackers(server) + fork_servers(server)
    assert len(helpers) == (2 if method == "forkserver" else 1)
    server.kill()
    for process in [runner, *helpers]:
        wait_for(lambda p=process: gone(p), timeout_s=DEATH_BOUND_S, what=f"{process} to end")
    second = start_server(servers, method)
    with raw_client(second) as client:
        assert wait_run(client, run_id)["status"] == "completed"
    statuses = "SELECT status FROM run_runners ORDER BY started_at"
    wait_for(
        lambda: query(second, statuses)[-2:] == [("orphaned",), ("exited",)],
        what="the orphan closed by recovery and the run finished by a new runner",
    )


def test_a_forked_child_ends_by_its_parent_sentinel_when_its_server_is_killed(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """The node clears its own parent-death signal, so neither the fork server's end nor any
    signal can end it: only its lifeline, watching ``parent_process().sentinel``, can."""
    server = start_server(servers, "forkserver")
    out = tmp_path / "facts.json"
    no_parent_death_signal = """
            import ctypes
            assert ctypes.CDLL(None).prctl(1, 0, 0, 0, 0) == 0  # PR_SET_PDEATHSIG: none
            pathlib.Path(__file__ + ".cleared").touch()
            time.sleep(60)"""
    workflow = facts_workflow(tmp_path, "sentinel", out, then=no_parent_death_signal.strip())
    with raw_client(server) as client:
        start(client, workflow, {}, "sentinel")
    runner = psutil.Process(read_facts(out)["pid"])
    wait_for(Path(workflow + ".cleared").exists, what="the node to clear its signal")
    server.kill()
    wait_for(lambda: gone(runner), timeout_s=DEATH_BOUND_S, what="the runner to end by itself")


#: A stand-in for the server: it starts one forkserver child that answers, on request, whether
#: its parent sentinel is at end-of-file, and relays the answers on its stdout.
_SENTINEL_DRIVER = """
import json, multiprocessing, sys
from tests.server.sentinel_child import serve

if __name__ == "__main__":
    context = multiprocessing.get_context("forkserver")
    ours, theirs = context.Pipe()
    child = context.Process(target=serve, args=(theirs, sys.argv[1]))
    child.start()
    theirs.close()
    assert ours.recv_bytes() == b"ready"
    print(json.dumps({"child": child.pid}), flush=True)
    for _ in sys.stdin:  # one question per line, until the test kills this process
        ours.send_bytes(b"?")
        print(ours.recv_bytes().decode(), flush=True)
"""


@pytest.fixture
def sentinel_driver(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    script = tmp_path / "driver.py"
    script.write_text(_SENTINEL_DRIVER)
    with driver_process([sys.executable, str(script), str(tmp_path / "eof")]) as driver:
        yield driver


def test_under_forkserver_the_parent_sentinel_ends_with_the_server_not_the_fork_server(
    sentinel_driver: subprocess.Popen[str], tmp_path: Path
) -> None:
    """What the lifeline relies on, checked on the standard library itself: the driver plays
    the server; its fork server dies first, then the driver."""
    assert sentinel_driver.stdin is not None and sentinel_driver.stdout is not None
    child = psutil.Process(json.loads(sentinel_driver.stdout.readline())["child"])
    (fork_server,) = [
        p
        for p in psutil.Process(sentinel_driver.pid).children()
        if any("multiprocessing.forkserver" in part for part in p.cmdline())
    ]
    assert child.ppid() == fork_server.pid
    try:
        sentinel_driver.stdin.write("?\n")
        sentinel_driver.stdin.flush()
        assert sentinel_driver.stdout.readline().strip() == "open"
        fork_server.kill()
        wait_for(lambda: gone(fork_server), what="the fork server to be gone")
        sentinel_driver.stdin.write("?\n")
        sentinel_driver.stdin.flush()
        assert sentinel_driver.stdout.readline().strip() == "open", "not the fork server's"
        assert not gone(child)
        sentinel_driver.kill()
        wait_for(lambda: gone(child), what="the child to see its sentinel end and return")
        assert (tmp_path / "eof").read_text() == "eof"
    finally:
        with suppress(psutil.Error):
            child.kill()


def test_an_unknown_start_method_is_refused_before_anything_changes(
    servers: ServerFactory,
) -> None:
    server = servers.start(env={**FAST, "PIWF_START_METHOD": "thread"})
    assert server.ready["ok"] is False
    assert server.ready["error"]["code"] == "serverStart"
    message = server.ready["error"]["message"]
    assert "PIWF_START_METHOD must be one of forkserver, spawn, not 'thread'" in message
    assert server.process.wait(timeout=10) != 0
    assert not (servers.home / "state.sqlite").exists()


def test_a_restarted_helper_is_captured_in_the_private_helpers_log(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(servers, "forkserver")
    (tracker,) = resource_trackers(server)
    tracker.kill()
    wait_for(lambda: gone(tracker), what="the resource tracker to end")
    with raw_client(server) as client:
        answer = client.request(
            "run.start", {"workflow": HELLO, "input": {"who": "z"}}, key="after"
        )
        assert answer.outcome == "accepted", answer
        assert answer.receipt is not None
        assert wait_run(client, answer.receipt["run"]["runId"])["status"] == "completed"
    (replacement,) = resource_trackers(server)
    assert replacement.pid != tracker.pid
    log = server.home / "server" / "runners" / "helpers.log"
    wait_for(lambda: "resource_tracker" in log.read_text(), what="the relaunch warning")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_resolver_killed_by_a_signal_answers_unavailable_and_stores_nothing(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(servers, "forkserver")
    workflow = write_workflow(
        tmp_path,
        "dies_resolving",
        """
        import os, signal, sys
        from piwf.workflow import compute, define_workflow

        if sys.argv[0].endswith("resolver.py"):  # only inside the resolver child
            os.kill(os.getpid(), signal.SIGKILL)

        workflow = define_workflow(
            name="dies_resolving", start_at="a", nodes={"a": compute(lambda ctx: 1)}, edges=[]
        )
        """,
    )
    with raw_client(server) as client:
        response = client.request("run.start", {"workflow": workflow, "input": {}}, key="dies")
        again = client.request("run.start", {"workflow": workflow, "input": {}}, key="dies")
    for answer in (response, again):
        assert answer.outcome == "unavailable", answer
        assert answer.error is not None and answer.error.code == "resolverFailed"
        assert answer.error.message == (
            f"the resolver child was killed by SIGKILL without an answer while loading {workflow}"
        )
    assert query(server, "SELECT count(*) FROM runs") == [(0,)]
    receipts = "SELECT count(*) FROM server_commands WHERE idempotency_key = 'dies'"
    assert query(server, receipts) == [(0,)]


def test_the_bootstrap_refuses_a_kind_that_is_not_an_entry_before_it_acts() -> None:
    program = textwrap.dedent(
        """
        import os, sys
        from multiprocessing.connection import Pipe
        from piwf.runner import bootstrap

        ours, theirs = Pipe()
        session = os.getsid(0)
        try:
            bootstrap.main("os", theirs, theirs, theirs, "/", {})
        except ValueError:
            sys.exit(0 if os.getsid(0) == session else 2)
        sys.exit(1)
        """
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("method", METHODS)
def test_a_server_started_by_the_console_script_never_reruns_it_in_a_child(
    servers: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """``multiprocessing`` prepares a child by re-running its parent's main script; the
    ``piwf`` script would cost every child an import of the CLI."""
    script = str(Path(sys.executable).parent / "piwf")
    monkeypatch.setattr(harness, "SERVER_COMMAND", [script, "server", "run"])
    server = start_server(servers, method)
    assert psutil.Process(server.process.pid).cmdline()[1].endswith("piwf")
    out = tmp_path / "modules.json"
    report = f"""
            pathlib.Path({str(out)!r}).write_text(json.dumps(sorted(sys.modules)))"""
    workflow = facts_workflow(tmp_path, "modules", tmp_path / "facts.json", then=report.strip())
    with raw_client(server) as client:
        assert wait_run(client, start(client, workflow, {}, "modules"))["status"] == "completed"
    modules = json.loads(out.read_text())
    assert "piwf.runner.workflow_runner" in modules
    assert "piwf.cli" not in modules and "click" not in modules
    # Nor anything of the server: its fork-server Process is unpickled as the standard one.
    assert [name for name in modules if name.startswith("piwf.server")] == []


@pytest.mark.parametrize("method", METHODS)
def test_what_a_child_wrote_before_it_exited_is_delivered_before_its_exit(
    tmp_path: Path, method: str
) -> None:
    """On the supervisor itself (tests/server/exit_order_driver.py): the child answers and
    exits while the loop does not turn, so its answer, its sentinel and (spawned) the SIGCHLD
    are all ready at the next turn; the answer still comes first."""
    repository = str(Path(__file__).resolve().parents[2])
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.server.exit_order_driver", method, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repository,
        start_new_session=True,
    )
    try:
        out, err = driver.communicate(timeout=120)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
    assert driver.returncode == 0, err
    assert json.loads(out) == {"messagesBeforeExit": 1, "exitCode": 0}


@pytest.mark.parametrize("method", METHODS)
def test_a_childs_output_is_captured_privately_and_capped_and_a_flood_kills_nothing(
    servers: ServerFactory, tmp_path: Path, method: str
) -> None:
    server = start_server(servers, method)
    out = tmp_path / "facts.json"
    flood = """
            print("before the flood", flush=True)
            for _ in range(200):
                sys.stdout.write("x" * 65536)
                sys.stdout.flush()"""
    workflow = facts_workflow(tmp_path, "flood", out, then=flood.strip())
    with raw_client(server) as client:
        assert wait_run(client, start(client, workflow, {}, "flood"))["status"] == "completed"
    rows = "SELECT status, runner_epoch FROM run_runners ORDER BY started_at"
    wait_for(
        lambda: [row[0] for row in query(server, rows)] == ["exited"],
        what="the flooding runner's own exit",
    )
    epoch = query(server, rows)[0][1]
    log = server.home / "server" / "runners" / f"{epoch}.log"
    # The node's output is its attempt's (bounded by the attempt cap, the rest counted and
    # dropped). The runner's own log got none of it, so it was never made (a capture's file is
    # made by its first byte).
    assert not log.exists()
    attempts = "SELECT a.status, l.log_file, l.stdout_bytes, l.kept_bytes, l.dropped_bytes"
    attempts += " FROM attempt_logs l JOIN node_attempts a USING (attempt_id)"
    [(status, log_file, stdout, kept, dropped)] = query(server, attempts)
    assert status == "completed"
    flooded_log = server.home / log_file
    assert stat.S_IMODE(flooded_log.stat().st_mode) == 0o600
    assert stdout == 17 + 200 * 65536
    assert (kept, dropped) == (ATTEMPT_LOG_CAP, stdout - ATTEMPT_LOG_CAP)
    head = ATTEMPT_LOG_CAP - ATTEMPT_LOG_TAIL
    assert flooded_log.read_bytes() == (
        b"before the flood\n"
        + b"x" * (head - 17)
        + head_marker(head, ATTEMPT_LOG_TAIL)
        + tail_marker(stdout - ATTEMPT_LOG_CAP, ATTEMPT_LOG_TAIL)
        + b"x" * ATTEMPT_LOG_TAIL
    )


def test_the_fork_server_runs_before_the_server_listens(
    servers: ServerFactory, tmp_path: Path
) -> None:
    # `piwf server run` forks it once the server's modules are imported, before the server
    # opens anything; started with the server's loop, it would not exist before listening.
    hits = tmp_path / "faults.log"
    environment = {
        **os.environ,
        **FAST,
        "PIWF_HOME": str(servers.home),
        "PIWF_START_METHOD": "forkserver",
        "PIWF_FAULTS": "server.before_listen@1=stop",
        "PIWF_FAULTS_LOG": str(hits),
    }
    process = subprocess.Popen(
        harness.SERVER_COMMAND,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: hits.exists() and "server.before_listen" in hits.read_text())
        server = harness.ServerProcess(servers.home, process, {})
        stopped = psutil.Process(process.pid)
        wait_for(lambda: stopped.status() == psutil.STATUS_STOPPED, what="the stopped server")
        assert not (servers.home / "server" / "server.sock").exists()
        assert len(fork_servers(server)) == 1
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def test_a_server_that_does_not_start_leaves_no_fork_server(servers: ServerFactory) -> None:
    first = start_server(servers, "forkserver")
    born = time.time() - 0.1
    refused = servers.start(env={**FAST, "PIWF_START_METHOD": "forkserver"})
    assert refused.ready["ok"] is False
    assert refused.process.wait(timeout=10) != 0

    def orphaned_fork_servers() -> list[psutil.Process]:
        """Fork servers made since the refused server started whose server is gone (a fork
        server forked from its server shows the standard command line as its title, which
        hides its environment, so it is known by its parent, not by its PIWF_HOME)."""
        found = []
        for process in psutil.process_iter():
            with suppress(psutil.Error):
                if (
                    is_fork_server(process.cmdline())
                    and process.create_time() >= born
                    and process.status() != psutil.STATUS_ZOMBIE
                    and not _child_of_a_server(process)
                ):
                    found.append(process)
        return found

    # The refused server's fork server ends with it (end-of-file on its alive pipe).
    wait_for(
        lambda: orphaned_fork_servers() == [], what="no fork server left by the refused server"
    )
    assert len(fork_servers(first)) == 1, "the first server keeps its own"


def _child_of_a_server(process: psutil.Process) -> bool:
    """Whether ``process``'s parent is a live piwf server (an orphan's is init or a reaper)."""
    parent = process.parent()
    return (
        parent is not None
        and parent.status() != psutil.STATUS_ZOMBIE
        and "server run" in " ".join(parent.cmdline())
    )
