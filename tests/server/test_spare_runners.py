"""Spare runners: an idle workflow-runner child kept ready, handed its run by a launch.

Real servers, real fork servers (and spawned children), real signals. A spare is found as the
server's descendant titled ``piwf runner (idle)``; what a run's runner really was comes from its
node (``facts_workflow``: pid, working directory, ``sys.path``) and from its ``run_runners`` row.
Every wait polls a condition against a deadline.
"""

from __future__ import annotations

import json
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from tests.server.children import METHODS, gone, start_server
from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import (
    FAST,
    hold_until_gate,
    query,
    start,
    wait_run,
    write_workflow,
)
from tests.server.test_start_methods import facts_workflow, read_facts

IDLE_TITLE = "piwf runner (idle)"
RUNNER_ROWS = "SELECT pid, process_start_identity, status FROM run_runners"


def idle_spares(server: ServerProcess) -> list[psutil.Process]:
    """The server's live descendants waiting, titled as spares, for a launch."""
    found = []
    with suppress(psutil.Error):
        for child in psutil.Process(server.process.pid).children(recursive=True):
            with suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE and " ".join(child.cmdline()).startswith(
                    IDLE_TITLE
                ):
                    found.append(child)
    return found


def one_spare(server: ServerProcess, other_than: int | None = None) -> psutil.Process:
    """Wait until the server keeps exactly one spare (not ``other_than``) and return it."""
    found: list[psutil.Process] = []

    def look() -> bool:
        found[:] = idle_spares(server)
        return len(found) == 1 and found[0].pid != other_than

    wait_for(look, timeout_s=30, what="one spare runner")
    return found[0]


def run_facts(server: ServerProcess, tmp_path: Path, name: str) -> tuple[dict[str, object], Path]:
    """Run the facts workflow with a project directory of its own; return its facts."""
    out, project = tmp_path / f"{name}.json", tmp_path / f"{name}-project"
    project.mkdir()
    workflow = facts_workflow(tmp_path, name, out)
    with raw_client(server, client_id=f"client-{name}") as client:
        response = client.request(
            "run.start",
            {"workflow": workflow, "input": {}, "projectPath": str(project)},
            key=name,
        )
        assert response.outcome == "accepted", response
        assert response.receipt is not None
        assert wait_run(client, str(response.receipt["run"]["runId"]))["status"] == "completed"
    return read_facts(out), project


@pytest.mark.parametrize("method", METHODS)
def test_a_launch_hands_its_run_to_the_spare_the_server_kept_ready(
    servers: ServerFactory, tmp_path: Path, method: str
) -> None:
    server = start_server(servers, method)
    spare = one_spare(server)
    assert query(server, RUNNER_ROWS) == [], "a spare has no row: nothing of any run is its"
    facts, project = run_facts(server, tmp_path, "facts")
    assert facts["pid"] == spare.pid, "the run ran in the spare that waited for it"
    assert facts["cwd"] == str(project), "it entered the run's project directory"
    wait_for(
        lambda: query(server, RUNNER_ROWS) == [(spare.pid, facts["identity"], "exited")],
        what="the runner's row: the spare's pid, its start identity, a clean exit",
    )
    # It ran one generation and exited; the next spare is another process.
    wait_for(lambda: gone(spare), what="the used spare's exit")
    one_spare(server, other_than=spare.pid)


def test_a_spare_that_warmed_up_runs_its_run_with_nothing_of_the_warm_up_left(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """The spare loaded and ran piwf's built-in noop while it waited (runner/warm_up.py): the
    run's node finds its own workflow module as the only one loaded, and the runner reported
    no failed warm-up."""
    server = start_server(servers, "forkserver")
    spare = one_spare(server)
    out, modules = tmp_path / "facts.json", tmp_path / "modules.json"
    report = f"""
            loaded = [m.__file__ for n, m in sys.modules.items() if n.startswith("_piwf_workflow_")]
            pathlib.Path({str(modules)!r}).write_text(json.dumps(loaded))"""
    workflow = facts_workflow(tmp_path, "warmed", out, then=report.strip())
    with raw_client(server) as client:
        assert wait_run(client, start(client, workflow, {}, "warmed"))["status"] == "completed"
    assert read_facts(out)["pid"] == spare.pid
    assert json.loads(modules.read_text()) == [str(Path(workflow).resolve())]
    runner_logs = b"".join(p.read_bytes() for p in (server.home / "server").rglob("*.log"))
    assert b"warm-up skipped" not in runner_logs


def test_the_next_spare_waits_while_the_run_that_took_the_last_one_still_runs(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """Once a launched runner is ready (its start no longer needs the CPU), the slot it left
    free gets its spare: the next run, started while this one runs, does not wait for a fork.
    The claim poll (the scheduler's backstop, which also refills) is set far beyond the test."""
    server = start_server(servers, "forkserver", env={"PIWF_CLAIM_POLL_S": "600"})
    first_spare = one_spare(server)
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = write_workflow(
        tmp_path,
        "held",
        f"""
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def hold(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return {{}}

        workflow = define_workflow(
            name="held", start_at="hold", nodes={{"hold": compute(hold)}}, edges=[]
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "held")
        wait_for(entered.exists, what="the held node to run")
        assert not gone(first_spare), "the run runs in the spare that waited for it"
        # The run is still running: a new spare is already there for the next launch.
        next_spare = one_spare(server, other_than=first_spare.pid)
        assert query(server, "SELECT status FROM runs") == [("running",)]
        gate.touch()
        assert wait_run(client, run_id)["status"] == "completed"
    assert not gone(next_spare)


def test_a_spare_enters_the_project_directory_as_a_fresh_runner_would(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """The first entry of ``sys.path`` (the server's start directory) becomes the run's
    project directory, with or without a spare, so a project's own modules import alike."""
    paths = {}
    for count in ("1", "0"):
        server = start_server(servers, "forkserver", env={"PIWF_SPARE_RUNNERS": count})
        if count == "1":
            one_spare(server)
        facts, project = run_facts(server, tmp_path, f"path{count}")
        paths[count] = facts
        assert facts["cwd"] == str(project)
        server.terminate()
    assert [paths[count]["path0"] for count in ("1", "0")] == [
        str(tmp_path / "path1-project"),
        str(tmp_path / "path0-project"),
    ]


def test_without_spares_each_launch_starts_its_own_child(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(servers, "forkserver", env={"PIWF_SPARE_RUNNERS": "0"})
    before = {child.pid for child in psutil.Process(server.process.pid).children(recursive=True)}
    facts, _project = run_facts(server, tmp_path, "fresh")
    assert facts["pid"] not in before, "a child started for this launch, after it was asked"
    assert idle_spares(server) == []


def test_a_spare_that_dies_unused_is_replaced_and_leaves_nothing_in_the_state(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(servers, "forkserver")
    spare = one_spare(server)
    spare.kill()
    wait_for(lambda: gone(spare), what="the killed spare's end")
    replacement = one_spare(server, other_than=spare.pid)
    assert query(server, RUNNER_ROWS) == []
    log = (server.home / "server" / "server.log").read_text()
    assert "spare runner runner-" in log and "ended unused" in log
    facts, _project = run_facts(server, tmp_path, "after")
    assert facts["pid"] == replacement.pid


def test_a_spare_ends_with_its_server(servers: ServerFactory) -> None:
    server = start_server(servers, "forkserver")
    spare = one_spare(server)
    server.kill()
    # Its lifeline sees the server's end (nothing signals it: it has a session of its own).
    wait_for(lambda: gone(spare), timeout_s=15, what="the spare's end after its server's")


def test_a_spare_count_that_is_not_a_count_stops_the_server_with_the_variable_named(
    servers: ServerFactory,
) -> None:
    server = servers.start(env={**FAST, "PIWF_SPARE_RUNNERS": "-1"})
    assert server.ready.get("ok") is not True
    assert "PIWF_SPARE_RUNNERS" in str(server.ready), server.ready
