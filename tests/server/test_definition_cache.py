"""Resolved definitions kept by source identity, against a real server: a start of unchanged
sources imports the workflow once (in its runner) instead of twice (resolver and runner); a
changed root, a changed mounted file or a newly shadowing workflow resolves afresh and runs the
new code. The workflow counts its own imports in a file: the observable effect of a resolver
child is one more import."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwf.client import Client
from tests.server.harness import ServerFactory, ServerProcess
from tests.server.test_execution import FAST

COUNTING = """
from piwf.workflow import compute, define_workflow, include

with open({log!r}, "a") as log:
    log.write("imported\\n")

nodes = {{"answer": compute(lambda ctx: {{"version": {version!r}}})}}
edges = []
if {part!r}:
    nodes["part"] = include({part!r})
    edges = [{{"from": "answer", "to": "part"}}]
workflow = define_workflow(name="counted", start_at="answer", nodes=nodes, edges=edges)
"""


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def write_counting(path: Path, log: Path, version: str, *, part: str = "") -> str:
    path.write_text(COUNTING.format(log=str(log), version=version, part=part))
    return str(path)


def imports(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def completed_output(client: Client, workflow: str, **start: object) -> object:
    run = client.start_run(workflow, input={}, **start)  # type: ignore[arg-type]
    done = client.wait_run(run.run_id, timeout_s=30)
    assert done.run.status == "completed", done
    return done.output


def test_an_unchanged_source_is_resolved_once_and_a_changed_one_again(
    server: ServerProcess, tmp_path: Path
) -> None:
    log = tmp_path / "imports.log"
    workflow = write_counting(tmp_path / "counted.py", log, "one")
    with Client(server.home, autostart=False) as client:
        assert completed_output(client, workflow) == {"version": "one"}
        assert imports(log) == 2  # the resolver child, then the runner
        assert completed_output(client, workflow) == {"version": "one"}
        assert imports(log) == 3  # the runner only: no resolver child for the same sources
        write_counting(tmp_path / "counted.py", log, "two")
        assert completed_output(client, workflow) == {"version": "two"}
        assert imports(log) == 5  # changed bytes: resolved afresh


def test_a_changed_mounted_file_resolves_afresh(server: ServerProcess, tmp_path: Path) -> None:
    log = tmp_path / "imports.log"
    part = tmp_path / "part.py"
    part.write_text(
        "from piwf.workflow import compute, define_workflow\n"
        "workflow = define_workflow(name='part', start_at='p',"
        " nodes={'p': compute(lambda ctx: 1)}, edges=[])\n"
    )
    workflow = write_counting(tmp_path / "counted.py", log, "one", part=str(part))
    with Client(server.home, autostart=False) as client:
        completed_output(client, workflow)
        completed_output(client, workflow)
        assert imports(log) == 3
        part.write_text(part.read_text() + "# changed\n")
        completed_output(client, workflow)
        assert imports(log) == 5


def test_a_newly_shadowing_workflow_is_found_instead_of_the_kept_one(
    server: ServerProcess, tmp_path: Path
) -> None:
    log = tmp_path / "imports.log"
    home_dir = server.home / "workflows"
    home_dir.mkdir(exist_ok=True)
    write_counting(home_dir / "counted.py", log, "home")
    project = tmp_path / "project"
    project.mkdir()  # without a .piwf/ of its own yet
    with Client(server.home, autostart=False) as client:
        assert completed_output(client, "counted", project=project) == {"version": "home"}
        assert completed_output(client, "counted", project=project) == {"version": "home"}
        assert imports(log) == 3
        project_dir = project / ".piwf" / "workflows"
        project_dir.mkdir(parents=True)
        write_counting(project_dir / "counted.py", log, "project")  # earlier in discovery
        assert completed_output(client, "counted", project=project) == {"version": "project"}
