"""A run's lifecycle ends where the docs say, driven through the installed script.

A run cancelled while paused is terminal in every respect (not paused, counted alike by both
status commands, prunable, titled); a server started on a database where an older piwf left
such a run flagged paused repairs it. The fixture of tests/cli/test_cli_e2e.py gives each test
a private ``PIWF_HOME``; the first command autostarts the server and the fixture reaps it.
"""

from __future__ import annotations

import time
from pathlib import Path

from piwf.state import StateDatabase
from tests.cli.test_cli_e2e import HOLD, Piwf, piwf  # noqa: F401 - a fixture used by name
from tests.server.harness import wait_for

CHECKPOINT = "fixtures/workflows/checkpoint_review.py"
HELLO = "fixtures/workflows/hello.py"


def until_now() -> str:
    """A cutoff after every run that ended so far (``--before`` takes no future time): only a
    protection keeps such a tree from the prune."""
    return str(time.time_ns() // 1_000_000)


def start(cli: Piwf, workflow: str, *args: str) -> str:
    return str(cli.json("run", "start", workflow, *args)["run"]["runId"])


def protected_reasons(cli: Piwf) -> dict[str, list[str]]:
    preview = cli.json("state", "prune", "--before", until_now(), "--dry-run")
    return {tree["rootRunId"]: tree["reasons"] for tree in preview["protected"]}


def test_a_run_cancelled_while_paused_is_finished_prunable_and_not_paused(
    piwf: Piwf,  # noqa: F811
) -> None:
    run_id = start(piwf, CHECKPOINT, "--input", '{"steps": [1]}')
    wait_for(
        lambda: piwf.json("run", "show", run_id)["run"]["status"] == "waiting",
        30,
        "the run waiting at its checkpoint",
    )
    # A control with nothing to do says so, and changes nothing.
    idle = piwf.json("run", "resume", run_id)
    assert (idle["outcome"], idle["run"]["paused"]) == ("unchanged", False)
    assert idle["run"]["revision"] == piwf.json("run", "show", run_id)["run"]["revision"]
    said = piwf.run("run", "resume", run_id).stdout
    assert said.startswith("nothing to resume (the run is neither paused nor parked"), said
    paused = piwf.json("run", "pause", run_id)
    assert (paused["outcome"], paused["run"]["paused"]) == ("changed", True)
    again = piwf.json("run", "pause", run_id)
    assert (again["outcome"], again["run"]["revision"]) == ("unchanged", paused["run"]["revision"])
    assert piwf.run("run", "pause", run_id).stdout.startswith("already paused, nothing changed:")
    # A restart of a run that has not ended names the status shown and the ways on.
    unfinished = piwf.json("run", "restart", run_id, exit_code=1)["error"]
    assert unfinished == {
        "code": "runCommand",
        "message": f"run {run_id} is paused and has not ended; only a run that ended restarts."
        f" To go on with it: piwf run explain {run_id}; to start over, cancel it first"
        f" (piwf run cancel {run_id}), then restart it",
    }

    cancelling = piwf.json("run", "cancel", run_id)
    assert cancelling["outcome"] == "changed"
    cancelled = cancelling["run"]
    assert (cancelled["status"], cancelled["paused"]) == ("cancelled", False)
    assert cancelled["finishedAt"] is not None
    twice = piwf.run("run", "cancel", run_id).stdout.strip()
    assert twice.startswith("already cancelled, nothing changed:"), twice
    assert twice.endswith("cancelled  checkpoint_review"), twice
    assert piwf.json("run", "cancel", run_id)["outcome"] == "unchanged"
    for verb in ("resume", "pause"):  # an ended run neither resumes nor pauses: it restarts
        refused = piwf.json("run", verb, run_id, exit_code=1)["error"]
        assert refused == {
            "code": "runCommand",
            "message": f"run {run_id} has ended (cancelled); only an unfinished run can {verb}."
            f" To run it again: piwf run restart {run_id}",
        }

    assert piwf.json("server", "status")["pausedRuns"] == 0
    assert piwf.json("state", "status")["pausedRuns"] == 0
    assert protected_reasons(piwf) == {}
    preview = piwf.json("state", "prune", "--before", until_now(), "--dry-run")
    assert [tree["rootRunId"] for tree in preview["trees"]] == [run_id]


def test_a_cancel_of_a_run_that_ended_otherwise_says_so_and_how_to_run_it_again(
    piwf: Piwf,  # noqa: F811
) -> None:
    ended = piwf.json("run", "start", HELLO, "--input", '{"who": "Ada"}', "--wait")["run"]
    run_id = ended["runId"]
    refused = piwf.json("run", "cancel", run_id, exit_code=1)["error"]
    assert refused == {
        "code": "runCommand",
        "message": f"run {run_id} has already ended (completed); there is nothing to cancel."
        f" To run it again: piwf run restart {run_id}",
    }
    said = piwf.run("run", "cancel", run_id)
    assert said.returncode == 1
    assert said.stderr.strip() == f"Error: {refused['message']}", said.stderr
    assert piwf.json("run", "show", run_id)["run"]["revision"] == ended["revision"]


def test_a_run_cancelled_while_paused_and_queued_keeps_its_title(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    assert piwf.json("server", "start", "--max-workers", "1")["started"] is True
    hold = tmp_path / "hold.py"
    hold.write_text(HOLD)
    holding = start(piwf, str(hold))
    queued = start(piwf, CHECKPOINT, "--input", '{"steps": [1]}')
    titled = start(piwf, CHECKPOINT, "--input", '{"steps": [2]}', "--title", "mine")
    for run_id in (queued, titled):
        assert piwf.json("run", "pause", run_id)["run"]["queueStatus"] == "parked"
        assert piwf.json("run", "cancel", run_id)["run"]["paused"] is False
    piwf.json("run", "cancel", holding)

    listed = {run["runId"]: run for run in piwf.json("run", "list")["runs"]}
    assert listed[queued]["title"] == "checkpoint_review", "an untitled workflow's name"
    assert listed[titled]["title"] == "mine"
    assert "cancelled  checkpoint_review" in piwf.run("run", "list").stdout
    table = piwf.run("run", "list").stdout.splitlines()
    assert any(line.startswith(queued) and line.endswith("checkpoint_review") for line in table)


def test_the_logs_of_a_run_cancelled_before_any_node_ran_say_it_ended(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    assert piwf.json("server", "start", "--max-workers", "1")["started"] is True
    hold = tmp_path / "hold.py"
    hold.write_text(HOLD)
    holding = start(piwf, str(hold))
    queued = start(piwf, HELLO, "--input", '{"who": "Ada"}')
    assert piwf.run("run", "logs", queued).stdout == f"run {queued} has no node output yet\n"
    piwf.json("run", "cancel", queued)
    piwf.json("run", "cancel", holding)

    # A run that ended gets no output later: the line says so instead of "yet".
    said = piwf.run("run", "logs", queued)
    assert (said.returncode, said.stdout) == (
        0,
        f"run {queued} ended cancelled and no node of it ran: there is no output\n",
    )
    said = piwf.run("run", "logs", queued, "--node", "greet")
    assert (said.returncode, said.stdout) == (
        0,
        f"run {queued} ended cancelled and node greet never ran: there is no output\n",
    )
    logs = piwf.json("run", "logs", queued)
    assert (logs["attempts"], logs["runStatus"], logs["terminal"]) == ([], "cancelled", True)


def test_a_server_start_clears_the_pause_an_older_piwf_left_on_a_cancelled_run(
    piwf: Piwf,  # noqa: F811
) -> None:
    run_id = start(piwf, CHECKPOINT, "--input", '{"steps": [1]}')
    piwf.json("run", "pause", run_id)
    piwf.json("run", "cancel", run_id)
    assert piwf.json("server", "stop")["wasRunning"] is True
    # What an older piwf's cancel of a paused run wrote: terminal, finished and still paused.
    with StateDatabase(piwf.home / "state.sqlite") as db, db.write() as tx:
        tx.execute("UPDATE runs SET paused = 1 WHERE run_id = ?", (run_id,))
        finished_at = tx.scalar("SELECT finished_at FROM runs WHERE run_id = ?", (run_id,))

    run = piwf.json("run", "show", run_id)["run"]
    assert (run["status"], run["paused"], run["finishedAt"]) == ("cancelled", False, finished_at)
    assert piwf.json("state", "status")["pausedRuns"] == 0
    assert protected_reasons(piwf) == {}
    assert piwf.json("server", "stop")["wasRunning"] is True
    run = piwf.json("run", "show", run_id)["run"]
    assert run["paused"] is False, "a second start repairs nothing and breaks nothing"


CHANGING = """
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="chg", start_at="a", nodes={"a": compute(lambda ctx: {"v": "ORIGINAL"})}, edges=[]
)
"""

GATED = """
import pathlib, time
from piwf.workflow import compute, define_workflow

def hold(ctx):
    pathlib.Path(ctx.input["entered"]).touch()
    deadline = time.monotonic() + 60
    while not pathlib.Path(ctx.input["gate"]).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return {}

workflow = define_workflow(name="gated", start_at="hold", nodes={"hold": compute(hold)}, edges=[])
"""


def test_a_restart_after_a_source_change_is_refused_with_the_command_for_the_current_sources(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = tmp_path / "c.py"
    workflow.write_text(CHANGING)
    run = piwf.json("run", "start", str(workflow), "--wait")["run"]
    assert run["status"] == "completed"

    workflow.write_text(CHANGING.replace("ORIGINAL", "CHANGED"))
    refused = piwf.json("run", "restart", run["runId"], exit_code=1)["error"]
    assert refused["code"] == "runCommand"
    assert f"changed: {workflow}" in refused["message"]
    assert refused["message"].endswith(f"piwf run start {workflow}")
    workflow.unlink()
    refused = piwf.json("run", "restart", run["runId"], exit_code=1)["error"]
    assert f"missing: {workflow}" in refused["message"], "a deleted file is missing, not changed"
    assert [item["runId"] for item in piwf.json("run", "list")["runs"]] == [run["runId"]]

    workflow.write_text(CHANGING)
    restarting = piwf.json("run", "restart", run["runId"])
    assert restarting["outcome"] == "changed"
    restarted = restarting["run"]
    waited = piwf.json("run", "wait", restarted["runId"], "--timeout", "30")
    assert waited["run"]["status"] == "completed", "the restored recorded source restarts"
    # A run restarts once: asking again names the restart it has.
    again = piwf.json("run", "restart", run["runId"])
    assert (again["outcome"], again["run"]["runId"]) == ("unchanged", restarted["runId"])
    said = piwf.run("run", "restart", run["runId"]).stdout
    assert said.startswith(f"already restarted as {restarted['runId']}"), said


def test_a_run_parked_for_a_missing_source_says_missing_and_how_to_run_the_current_sources(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow, entered, gate = tmp_path / "gated.py", tmp_path / "entered", tmp_path / "gate"
    workflow.write_text(GATED)
    gates = f'{{"entered": "{entered}", "gate": "{gate}"}}'
    run_id = start(piwf, str(workflow), "--input", gates)
    wait_for(entered.exists, 30, "the hold node")
    piwf.json("run", "pause", run_id)
    workflow.unlink()
    gate.touch()
    piwf.json("run", "resume", run_id)
    wait_for(
        lambda: piwf.json("run", "explain", run_id)["cause"] == "sourceChanged",
        30,
        "the run parked sourceChanged",
    )
    explained = piwf.json("run", "explain", run_id)
    assert f"missing: {workflow}" in explained["explanation"]
    assert "changed:" not in explained["explanation"]
    assert explained["commands"] == [
        f"piwf run resume {run_id}",
        f"piwf run cancel {run_id}",
        f"piwf run start {workflow}",
    ]
    assert not any("restart" in command for command in explained["commands"])
    # The run had an input: the advice to start anew says to give it again (it is never shown).
    assert "giving it the input you gave this one" in explained["explanation"]


def test_an_empty_input_file_is_refused_as_empty_and_nothing_starts(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    empty = tmp_path / "input.json"
    empty.write_text("\n")
    said = piwf.run("run", "start", HELLO, "--input-file", str(empty))
    assert said.returncode == 2, said.stderr
    assert said.stderr.rstrip().endswith(
        "Error: Invalid value for --input-file: not valid JSON for piwf (notJson): not JSON:"
        " Expecting value: line 2 column 1 (char 1); the text is empty: give a JSON value,"
        " e.g. '{}'"
    ), said.stderr
    refused = piwf.json("run", "start", HELLO, "--input", "", exit_code=2)["error"]
    assert refused["message"].endswith("; the text is empty: give a JSON value, e.g. '{}'")
    assert piwf.json("server", "status") == {"state": "stopped"}, "nothing was sent"


def test_the_explanation_of_a_restarted_run_points_at_its_restart(
    piwf: Piwf,  # noqa: F811
) -> None:
    ended = start(piwf, CHECKPOINT, "--input", '{"steps": [1]}')
    piwf.json("run", "cancel", ended)
    offered = piwf.json("run", "explain", ended)
    assert offered["commands"] == [f"piwf run restart {ended}"]
    # Cancelled by a person: no failure or error to point at.
    assert offered["explanation"] == "the run ended cancelled. Restart to run it again."
    restart = piwf.json("run", "restart", ended)["run"]["runId"]

    # A run restarts once: the explanation names the new run instead of a second restart.
    explained = piwf.json("run", "explain", ended)
    assert explained["commands"] == [f"piwf run show {restart}"]
    assert explained["explanation"].endswith(f" It was restarted as {restart}."), explained
    assert piwf.json("run", "show", ended)["display"]["restartedAs"] == restart
    assert f"  next      piwf run show {restart}\n" in piwf.run("run", "show", ended).stdout
    piwf.json("run", "cancel", restart)
