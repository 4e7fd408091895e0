"""``piwf run fork RUN --from NODE`` end to end: the installed script against a real server.

A chain ``a -> b -> c`` whose nodes append their name to a marker file, so the file says which
workflow code really ran; ``a`` returns how many marks existed when it ran, so a run that ran
``a`` again would carry another value. The fixture of tests/cli/test_cli_e2e.py gives each test
a private ``PIWF_HOME``; the first command autostarts the server and the fixture reaps it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 - a fixture used by name
from tests.server.harness import wait_for

CHAIN = """
import pathlib, time
from piwf.workflow import compute, define_workflow

MARKS = pathlib.Path({marks!r})

def mark(name):
    with MARKS.open("a") as marks:
        marks.write(name + "\\n")
    return len(MARKS.read_text().splitlines())

def a(ctx):
    return {{"a": mark("a")}}

def b(ctx):
    gate = ctx.input.get("gate")
    if gate:
        pathlib.Path(gate + ".entered").touch()
        deadline = time.monotonic() + 60
        while not pathlib.Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    if ctx.input.get("fail"):
        raise RuntimeError("b was told to fail")
    mark("b")
    return {{"b": ctx.outputs["a"]["a"] + 100}}

def c(ctx):
    mark("c")
    return {{"a": ctx.outputs["a"]["a"], "b": ctx.outputs["b"]["b"]}}

workflow = define_workflow(
    name="chain",
    start_at="a",
    nodes={{"a": compute(a), "b": compute(b), "c": compute(c)}},
    edges=[{{"from": "a", "to": "b"}}, {{"from": "b", "to": "c"}}],
)
"""

POST = """
import os
from piwf.workflow import action, compute, define_workflow, manual_effect

def post(ctx):
    os._exit(23)  # the runner dies while the manual effect applies: its outcome is unknown

workflow = define_workflow(
    name="post",
    start_at="prepare",
    nodes={
        "prepare": compute(lambda ctx: {"text": "hi"}),
        "post": action(effect=manual_effect("chat.post"), run=post),
        "after": compute(lambda ctx: "after"),
    },
    edges=[{"from": "prepare", "to": "post"}, {"from": "post", "to": "after"}],
)
"""

WAIT_S = "60"


def write(directory: Path, name: str, source: str) -> str:
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def run_ids(cli: Piwf) -> list[str]:
    return [run["runId"] for run in cli.json("run", "list")["runs"]]


def refused(cli: Piwf, run_id: str, node: str) -> dict[str, Any]:
    """``run fork`` that must be refused: exit 1 with a ``runCommand`` error; its message."""
    answer = cli.json("run", "fork", run_id, "--from", node, exit_code=1)
    error: dict[str, Any] = answer["error"]
    assert error["code"] == "runCommand", error
    return error


def completed_chain(cli: Piwf, directory: Path, marks: Path) -> tuple[str, str]:
    """Write :data:`CHAIN` (marking into ``marks``), run it to completion; its file and run."""
    chain = write(directory, "chain", CHAIN.format(marks=str(marks)))
    source = cli.json("run", "start", chain, "--wait", "--timeout", WAIT_S)["run"]["runId"]
    return chain, source


def test_a_fork_starts_at_the_node_with_the_earlier_outputs_and_runs_only_what_follows(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"
    chain, source = completed_chain(piwf, tmp_path, marks)
    assert piwf.json("run", "show", source)["output"] == {"a": 1, "b": 101}
    assert marks.read_text().split() == ["a", "b", "c"]

    forked = piwf.json("run", "fork", source, "--from", "b")["run"]
    fork_id = forked["runId"]
    assert fork_id != source
    assert (forked["lineage"], forked["parentRunId"], forked["rootRunId"]) == (
        "fork",
        source,
        source,
    )
    finished = piwf.json("run", "wait", fork_id, "--timeout", WAIT_S)
    assert finished["run"]["status"] == "completed"
    assert finished["output"] == {"a": 1, "b": 101}, "c saw a's output from the source"
    assert marks.read_text().split() == ["a", "b", "c", "b", "c"], "a did not run again"

    detail = piwf.json("run", "show", fork_id)
    assert (detail["run"]["lineage"], detail["run"]["parentRunId"]) == ("fork", source)
    assert [source_file["sourceRef"] for source_file in detail["sources"]] == [chain]
    steps = piwf.json("run", "steps", fork_id)["steps"]
    assert [step["path"] for step in steps] == ["a", "b", "c"]
    shown = piwf.run("run", "show", fork_id)
    assert shown.returncode == 0, shown.stderr
    assert f"{source} (fork)" in shown.stdout
    assert piwf.json("run", "show", source)["run"]["lineage"] == "root"

    human = piwf.run("run", "fork", source, "--from", "c")
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith("forked as run-"), human.stdout
    second = human.stdout.split()[2]
    assert piwf.json("run", "wait", second, "--timeout", WAIT_S)["output"] == {"a": 1, "b": 101}
    assert marks.read_text().split() == ["a", "b", "c", "b", "c", "c"]

    failing = piwf.json(
        "run",
        "start",
        chain,
        "--input",
        '{"fail": true}',
        "--wait",
        "--timeout",
        WAIT_S,
        exit_code=1,
    )["run"]["runId"]
    before = run_ids(piwf)
    unknown = refused(piwf, source, "nowhere")
    assert unknown["message"].startswith("fork from node 'nowhere' refused: "), unknown
    assert "has no node of that path; its nodes: a, b, c;" in unknown["message"]
    assert f"piwf run steps {source}" in unknown["message"]
    # A near miss is named; the human form names what was given, its control characters
    # escaped, and a long value is cut, not repeated whole.
    near = piwf.run("run", "fork", source, "--from", "bb\x1b[2J" + "x" * 200)
    assert near.returncode == 1, near.stderr
    assert near.stderr.startswith("Error: fork from node 'bb\\x1b[2J"), near.stderr
    assert "x" * 100 not in near.stderr and "\x1b" not in near.stderr
    typo = refused(piwf, source, "B")
    assert "its nodes: a, b, c (did you mean b?);" in typo["message"], typo
    never = refused(piwf, failing, "c")
    assert never["message"] == (
        f"fork from node 'c' refused: that node never ran in run {failing};"
        " fork from a node that ran: a, b"
    )
    first = refused(piwf, source, "a")
    assert f"piwf run restart {source}" in first["message"]
    missing = piwf.json("run", "fork", "run-does-not-exist", "--from", "b", exit_code=1)
    assert missing["error"]["code"] == "runNotFound"
    assert run_ids(piwf) == before, "a refused fork creates nothing"
    assert marks.read_text().split() == ["a", "b", "c", "b", "c", "c", "a"]


def test_a_fork_is_refused_while_the_run_executes_or_has_an_ambiguous_effect(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"
    gate = tmp_path / "gate"
    chain = write(tmp_path, "chain", CHAIN.format(marks=str(marks)))
    held = piwf.json("run", "start", chain, "--input", f'{{"gate": "{gate}"}}')["run"]["runId"]
    wait_for(Path(f"{gate}.entered").exists, timeout_s=30, what="b to hold at the gate")
    before = run_ids(piwf)
    running = refused(piwf, held, "b")
    assert f"piwf run pause {held}" in running["message"]
    assert run_ids(piwf) == before
    gate.touch()
    done = piwf.json("run", "wait", held, "--timeout", WAIT_S)
    assert done["run"]["status"] == "completed"

    post = write(tmp_path, "post", POST)
    parked = piwf.json("run", "start", post)["run"]["runId"]
    wait_for(
        lambda: piwf.json("run", "show", parked)["run"]["displayStatus"] == "ambiguous",
        timeout_s=30,
        what="the run to park with its effect ambiguous",
    )
    (effect,) = piwf.json("run", "show", parked)["effects"]
    before = run_ids(piwf)
    ambiguous = refused(piwf, parked, "post")
    assert f"{effect['effectId']} (ambiguous)" in ambiguous["message"]
    assert "piwf effect resolve EFFECT_ID --applied | --retry" in ambiguous["message"]
    assert run_ids(piwf) == before, "a refused fork creates nothing"


def test_a_fork_is_refused_when_a_recorded_source_changed_as_a_restart_is(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"
    chain, source = completed_chain(piwf, tmp_path, marks)
    Path(chain).write_text(CHAIN.format(marks=str(marks)) + "\n# edited\n")
    before = run_ids(piwf)
    changed = refused(piwf, source, "b")
    assert changed["message"] == (
        f"fork from node 'b' refused: run {source} cannot fork: a fork runs the workflow"
        " sources the run recorded, and"
        f" they are not on disk as recorded (changed: {chain}). Restore the recorded file to"
        f" fork it, or start a new run of the current sources: piwf run start {chain}"
    )
    assert run_ids(piwf) == before, "a refused fork creates nothing"
