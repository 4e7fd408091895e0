"""``include("name")`` end to end: the installed script against a real server.

A parent in the project includes ``child`` by name and ``builtin:noop``. The child is found as
``run start child`` would find it; the run records which file that was; ``run show`` and
``workflows show`` say so. A project file added later that shadows the name is what the next
``run start`` runs, while a run started before it, resumed by a new runner after a server
restart or restarted, keeps the file it recorded.
"""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path
from typing import Any

import pytest

from piwf import __version__
from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 (the fixture)
from tests.server.harness import wait_for

CHILD = """
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="child", start_at="say", nodes={{"say": compute(lambda ctx: {who!r})}},
    edges=[], exits={{"done": {{"from": "say"}}}},
)
"""

PARENT = """
from piwf.workflow import checkpoint, compute, define_workflow, include

workflow = define_workflow(
    name="parent",
    start_at="gate",
    includes={
        "child": include("child"),
        "echo": include("builtin:noop", input=lambda ctx: ctx.outputs["child"]["output"]),
    },
    nodes={"gate": checkpoint(summary="go on?")},
    edges=[{"from": "gate", "to": "child"}, {"from": "child.done", "to": "echo"}],
)
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "shop"
    root.mkdir()
    return root


def sources_of(cli: Piwf, run_id: str) -> dict[str, dict[str, Any]]:
    """The recorded sources of a run by mount path (``""``: the root)."""
    shown = cli.json("run", "show", run_id)
    return {source["mountPath"]: source for source in shown["sources"]}


def pending_request(cli: Piwf, run_id: str) -> str:
    def listed() -> str | None:
        found = cli.json("requests", "--run", run_id)["requests"]
        return str(found[0]["requestId"]) if found else None

    request_id: str = wait_for(listed, timeout_s=30, what=f"the checkpoint of {run_id}")
    return request_id


def test_a_parent_runs_its_child_by_name_and_shows_what_each_mount_recorded(
    piwf: Piwf,  # noqa: F811
    project: Path,
) -> None:
    piwf.home.mkdir(mode=0o700)
    child = write(piwf.home / "workflows" / "child.py", CHILD.format(who="home"))
    parent = write(project / ".piwf" / "workflows" / "parent.py", PARENT)
    run_id = piwf.json("run", "start", "parent", "--project", str(project))["run"]["runId"]
    assert piwf.json("answer", pending_request(piwf, run_id), "{}")["outcome"] == "won"
    finished = piwf.json("run", "wait", run_id, "--timeout", "30")
    assert finished["run"]["status"] == "completed", finished
    assert piwf.json("run", "show", run_id)["output"] == {"input": "home"}

    sources = sources_of(piwf, run_id)
    assert set(sources) == {"", "child", "echo"}
    root, mounted, builtin = sources[""], sources["child"], sources["echo"]
    assert (root["referenceKind"], root["reference"], root["sourceRef"]) == (
        "name",
        "parent",
        str(parent),
    )
    assert mounted == {
        "mountPath": "child",
        "referenceKind": "name",
        "reference": "child",
        "sourceType": "file",
        "sourceRef": str(child),
        "sourceRevision": hashlib.sha256(child.read_bytes()).hexdigest(),
    }, "a file has no piwfVersion"
    assert (builtin["referenceKind"], builtin["sourceType"], builtin["sourceRef"]) == (
        "builtin",
        "builtin",
        "builtin:noop",
    )
    assert builtin["piwfVersion"] == __version__
    text = piwf.run("run", "show", run_id)
    assert text.returncode == 0, text.stderr
    assert "name child" in text.stdout and str(child) in text.stdout
    assert f"builtin:noop (piwf {__version__})" in text.stdout

    # workflows show lists what a start records, in the same shape.
    shown = piwf.json("workflows", "show", "parent", "--project", str(project))
    assert {source["mountPath"]: source for source in shown["sources"]} == sources
    described = piwf.run("workflows", "show", "parent", "--project", str(project))
    assert described.returncode == 0, described.stderr
    assert "name child" in described.stdout and str(child) in described.stdout


def test_a_new_shadowing_file_is_run_by_the_next_start_while_started_runs_keep_theirs(
    piwf: Piwf,  # noqa: F811
    project: Path,
) -> None:
    piwf.home.mkdir(mode=0o700)
    home_child = write(piwf.home / "workflows" / "child.py", CHILD.format(who="home"))
    write(project / ".piwf" / "workflows" / "parent.py", PARENT)
    start = ("run", "start", "parent", "--project", str(project))
    before = piwf.json(*start)["run"]["runId"]
    before_request = pending_request(piwf, before)  # resolved and waiting at its gate

    project_child = write(project / ".piwf" / "workflows" / "child.py", CHILD.format(who="shop"))
    after = piwf.json(*start)["run"]["runId"]
    after_request = pending_request(piwf, after)
    assert sources_of(piwf, before)["child"]["sourceRef"] == str(home_child)
    assert sources_of(piwf, after)["child"]["sourceRef"] == str(project_child)

    # A new runner loads the earlier run after a restart: the recorded file, not the shadow.
    assert piwf.json("server", "stop")["wasRunning"] is True
    for request_id in (before_request, after_request):
        assert piwf.json("answer", request_id, "{}")["outcome"] == "won"
    for run_id, expected in ((before, "home"), (after, "shop")):
        finished = piwf.json("run", "wait", run_id, "--timeout", "30")
        assert finished["run"]["status"] == "completed", finished
        assert piwf.json("run", "show", run_id)["output"] == {"input": expected}

    restarted = piwf.json("run", "restart", before)["run"]["runId"]
    assert sources_of(piwf, restarted) == sources_of(piwf, before)
    answered = piwf.json("answer", pending_request(piwf, restarted), "{}")
    assert answered["outcome"] == "won"
    finished = piwf.json("run", "wait", restarted, "--timeout", "30")
    assert finished["run"]["status"] == "completed", finished
    assert piwf.json("run", "show", restarted)["output"] == {"input": "home"}
