"""A child's start does not wait for its pid: the fork server reports it later.

Real servers and real fork servers, stopped (SIGSTOP) or killed between the request for a
child and its pid, which a workflow file does from inside its resolver (the resolver's parent
is the fork server; the run's runner is asked for next): the server serves meanwhile and
records the runner's start identity once the pid comes; a fork server killed then costs that
one start (its slot freed, its run rescued as for a runner that could not be started); a run
cancelled meanwhile ends its runner when the pid comes. Then the same on the supervisor
itself, for both start methods where it applies (``tests/server/start_driver.py``). Every wait
polls a condition against a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from tests.server.children import METHODS, fork_servers, start_server
from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import query, start, wait_run
from tests.server.test_start_methods import facts_workflow, read_facts

#: Run by a workflow file's import inside the resolver only: it stops its own fork server
#: (its parent), so the run's runner is asked for while the fork server cannot fork it.
STOP_THE_FORK_SERVER = (
    'if sys.argv[0].endswith("resolver.py"): os.kill(os.getppid(), signal.SIGSTOP)'
)
#: A run's runner rows, oldest first: status, pid, start identity, exit code, signal, diagnostic.
RUNNER_ROWS = (
    "SELECT r.status, r.pid, r.process_start_identity, r.exit_code, r.signal, b.content"
    " FROM run_runners r LEFT JOIN blobs b ON b.blob_hash = r.diagnostic_hash"
    " WHERE r.run_id = ? ORDER BY r.started_at"
)
#: These servers keep no spare runner: the start they stop is the one a launch asks for (a
#: launch handed to a spare asks for none; tests/server/test_spare_runners.py).
NO_SPARES = {"PIWF_SPARE_RUNNERS": "0"}
#: The one row of a runner asked for whose pid has not come.
ASKED_FOR = [("starting", None, None, None, None, None)]


def runner_asked_for_without_a_pid(server: ServerProcess, run_id: str) -> None:
    wait_for(
        lambda: query(server, RUNNER_ROWS, (run_id,)) == ASKED_FOR,
        what="the runner asked for, its pid unknown",
    )


def test_a_runner_start_returns_before_its_fork_server_forks_and_the_loop_serves_meanwhile(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """The runner is asked for while its fork server is stopped: the server goes on serving
    with the runner's pid unknown; once the fork server resumes, the runner runs and its pid
    and start identity are recorded."""
    server = start_server(servers, "forkserver", env=NO_SPARES)
    (fork_server,) = fork_servers(server)
    out = tmp_path / "facts.json"
    workflow = facts_workflow(tmp_path, "later", out, prelude=STOP_THE_FORK_SERVER)
    with raw_client(server) as client:
        try:
            run_id = start(client, workflow, {}, "later")
            runner_asked_for_without_a_pid(server, run_id)
            assert fork_server.status() == psutil.STATUS_STOPPED
            assert client.request("server.status").outcome == "accepted"
            assert query(server, RUNNER_ROWS, (run_id,)) == ASKED_FOR
        finally:
            fork_server.resume()
        assert wait_run(client, run_id)["status"] == "completed"
    facts = read_facts(out)
    assert facts["ppid"] == fork_server.pid
    wait_for(
        lambda: (
            query(server, RUNNER_ROWS, (run_id,))
            == [("exited", facts["pid"], facts["identity"], 0, None, None)]
        ),
        what="the runner's pid and start identity recorded, and its clean exit",
    )


def test_a_fork_server_killed_before_it_forks_a_runner_costs_that_start_and_the_run_goes_on(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """As a runner that could not be started at all: its slot is freed at once, and its run
    is rescued once its claim expires (short here), then finished by a runner of a new fork
    server."""
    server = start_server(
        servers,
        "forkserver",
        env={"PIWF_RUN_LEASE_MS": "1500", "PIWF_RUN_RENEW_S": "0.5", **NO_SPARES},
    )
    (fork_server,) = fork_servers(server)
    out = tmp_path / "facts.json"
    workflow = facts_workflow(tmp_path, "lost", out, prelude=STOP_THE_FORK_SERVER)
    try:
        with raw_client(server) as client:
            run_id = start(client, workflow, {}, "lost")
            runner_asked_for_without_a_pid(server, run_id)
            fork_server.kill()
            assert wait_run(client, run_id)["status"] == "completed"
    finally:
        with suppress(psutil.Error):
            fork_server.kill()
    facts = read_facts(out)
    failed = ("orphaned", None, None, None, None, None)
    finished = ("exited", facts["pid"], facts["identity"], 0, None, None)
    wait_for(
        lambda: finished in query(server, RUNNER_ROWS, (run_id,)),
        what="the end of the runner that finished the run",
    )
    assert query(server, RUNNER_ROWS, (run_id,)) == [failed, finished]
    (replacement,) = fork_servers(server)
    assert replacement.pid != fork_server.pid and facts["ppid"] == replacement.pid
    log = (server.home / "server" / "server.log").read_text()
    assert "could not be started: the fork server ended before it started the child" in log


def test_a_run_cancelled_before_its_runner_has_a_pid_ends_that_runner_when_the_pid_comes(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(servers, "forkserver", env=NO_SPARES)
    (fork_server,) = fork_servers(server)
    out = tmp_path / "facts.json"
    workflow = facts_workflow(tmp_path, "cancelled", out, prelude=STOP_THE_FORK_SERVER)
    with raw_client(server) as client:
        try:
            run_id = start(client, workflow, {}, "cancelled")
            runner_asked_for_without_a_pid(server, run_id)
            cancelled = client.request("run.cancel", {}, key="cancel", run_id=run_id)
            assert cancelled.outcome == "accepted", cancelled
        finally:
            fork_server.resume()
        assert wait_run(client, run_id)["status"] == "cancelled"
    wait_for(
        lambda: [row[0] for row in query(server, RUNNER_ROWS, (run_id,))] == ["cancelled"],
        what="the runner's end recorded",
    )
    ((_, _, _, exit_code, signalled, _),) = query(server, RUNNER_ROWS, (run_id,))
    # Forked once the fork server resumed and stopped as its pid came: a signal (or the exit
    # of its SIGTERM handling), not the 255 of a start that failed.
    assert (exit_code, signalled) in ((None, "signal 15"), (None, "signal 9"), (143, None))
    wait_for(lambda: fork_server.children() == [], what="nothing left under the fork server")
    assert not out.exists(), "the node never ran"


@pytest.mark.parametrize(
    ("scenario", "method"),
    [("stopped", "forkserver"), ("killed", "forkserver")]
    + [(scenario, method) for scenario in ("stop", "kill") for method in METHODS],
)
def test_the_supervisor_reports_a_pid_that_comes_later(
    tmp_path: Path, scenario: str, method: str
) -> None:
    """On the supervisor itself (tests/server/start_driver.py)."""
    repository = str(Path(__file__).resolve().parents[2])
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.server.start_driver", scenario, method, str(tmp_path)],
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
    report = json.loads(out)
    seen = report["seen"]
    if scenario == "stopped":
        # start() returned, and the loop ran a timer, while the fork server could not fork.
        assert report["pidAtReturn"] is None and report["pidWhileStopped"] is None
        assert report["eventsWhileStopped"] == []
        assert report["events"] == ["started:a", "exit:a"]
        assert seen["a"] == {
            "identityIsTheChilds": True,
            "parent": report["forkServer"],
            "exitCode": 0,
            "startFailure": None,
            "registered": False,
            "answered": True,  # its request was written before its pid came
        }
    elif scenario == "killed":
        assert report["events"] == ["exit:a", "started:b", "exit:b"]  # never "started:a"
        assert seen["a"] == {
            "exitCode": 255,
            "startFailure": "the fork server ended before it started the child",
            "registered": False,
            "answered": False,
        }
        assert report["childrenAfterFailure"] == []
        assert seen["b"]["exitCode"] == 0 and seen["b"]["answered"] is True
        assert seen["b"]["parent"] != report["forkServer"], "forked by a new fork server"
    else:
        if method == "forkserver":
            assert report["pidAtRequest"] is None, "asked for before the pid came"
        assert report["events"] == ["started:a", "exit:a"]
        assert report["childEnded"] is True
        assert seen["a"]["identityIsTheChilds"] is True
        expected = (
            {-signal.SIGKILL} if scenario == "kill" else {-signal.SIGTERM, -signal.SIGKILL, 143}
        )
        assert seen["a"]["exitCode"] in expected
