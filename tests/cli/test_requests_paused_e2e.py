"""What a person meets answering requests from the CLI: a paused run's requests, a run id typed
where a request id belongs, a decision's choices shown once, and a pause that stopped a manual
effect while it applied.

The installed script against a real server (the fixture of tests/cli/test_cli_e2e.py starts
nothing itself; the first command autostarts the server, and the fixture stops and reaps it).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 - a fixture used by name
from tests.cli.test_decision_inputs_e2e import CHECKPOINT, DECISION, REPLAN, pending
from tests.cli.test_parked_e2e import HELD_POST, write
from tests.server.harness import wait_for

SESSION_REVIEW = "fixtures/workflows/session_review.py"


def test_requests_marks_a_paused_run_and_names_the_resume(piwf: Piwf) -> None:  # noqa: F811
    """`piwf requests` listed a paused run's request like any other; answering it was then
    refused (runPaused) with nothing in the list having said so."""
    run_id = piwf.json("run", "start", DECISION, "--input", '{"release": "1.4"}')["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]
    assert pending(piwf, run_id)["runPaused"] is False
    piwf.json("run", "pause", run_id)

    assert pending(piwf, run_id)["runPaused"] is True
    listed = piwf.run("requests")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(request_id))
    assert f"{run_id} (paused)" in row, listed.stdout
    resume = f"its run is paused and takes no answer until resumed: piwf run resume {run_id}"
    assert f"  paused    {resume}\n" in listed.stdout, listed.stdout
    assert resume in piwf.run("run", "show", run_id).stdout

    refused = piwf.json("answer", request_id, '{"choice": "ship"}', exit_code=1)
    assert refused["error"]["code"] == "runPaused"
    piwf.json("run", "resume", run_id)
    assert pending(piwf, run_id)["runPaused"] is False
    assert "(paused)" not in piwf.run("requests").stdout
    assert piwf.json("answer", request_id, '{"choice": "ship"}')["outcome"] == "won"


def test_a_run_id_given_as_a_request_id_names_the_runs_request(piwf: Piwf) -> None:  # noqa: F811
    """`piwf answer RUN_ID ...` said only 'no request RUN_ID'; it names the run's open request
    and the command that answers it, or says the run waits on none."""
    run_id = piwf.json("run", "start", DECISION, "--input", '{"release": "1.4"}')["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]

    refused = piwf.json("answer", run_id, '{"choice": "ship"}', exit_code=1)
    assert refused["error"]["code"] == "requestNotFound"
    assert refused["error"]["message"] == (
        f"{run_id} is a run id, not a request id; the run waits on request {request_id}"
        f""" (human_decision at node "approve"): piwf answer {request_id} '{{"choice": """
        """"<choice>"}' (choices: hold, ship)"""
    )
    piwf.json("run", "pause", run_id)
    submitted = piwf.run("submit", run_id, "{}")
    assert submitted.returncode == 1
    assert f"(the run is paused: piwf run resume {run_id} first)" in submitted.stderr
    piwf.json("run", "resume", run_id)
    assert pending(piwf, run_id)["submissions"] == 0, "nothing was answered"

    piwf.json("answer", request_id, '{"choice": "ship"}')
    piwf.json("run", "wait", run_id, "--timeout", "60")
    ended = piwf.run("answer", run_id, '{"choice": "ship"}')
    assert ended.returncode == 1
    assert (
        f"{run_id} is a run id, not a request id; the run waits on no request now"
        f" (piwf run explain {run_id} says what it is doing)"
    ) in ended.stderr
    unknown = piwf.json("answer", "request-nope", "{}", exit_code=1)
    assert unknown["error"]["message"].startswith("no request request-nope (piwf requests")


def test_a_decisions_choices_are_listed_once(piwf: Piwf) -> None:  # noqa: F811
    """The human forms printed a decision's choices on their own line and again inside its
    content; the content line shows what the decision asks, --json keeps the whole content."""
    run_id = piwf.json("run", "start", DECISION, "--input", '{"release": "1.4"}')["run"]["runId"]
    replan_id = piwf.json("run", "start", REPLAN)["run"]["runId"]
    pending(piwf, run_id)
    pending(piwf, replan_id)

    for args in (("requests",), ("run", "show", run_id), ("run", "show", replan_id)):
        shown = piwf.run(*args)
        assert shown.returncode == 0, shown.stderr
        contents = [line for line in shown.stdout.splitlines() if line.startswith("  content")]
        assert contents, shown.stdout
        for line in contents:
            assert '"choices"' not in line and '"inputs"' not in line, line
    listed = piwf.run("requests").stdout
    assert '{"audience":"operator","request":{"subject":{"release":"1.4"},"title":"Ship?"}}' in (
        listed
    )
    assert listed.count("Ship it") == 2, "once in the table, once in the request's block"
    assert pending(piwf, run_id)["content"]["choices"] == {"hold": "Hold back", "ship": "Ship it"}


def test_a_pause_that_stopped_a_manual_effect_says_what_the_resume_does(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A pause stops a manual action mid-way: the effect stays stored `applying` though nothing
    applies it, and `effect resolve` answered 'applying, nothing to resolve'. The views say the
    pause stopped it and that the resume parks the run with it ambiguous; the resolve says to
    resume first."""
    flow = write(tmp_path / "held.py", HELD_POST)
    started = piwf.json("run", "start", str(flow), "--input", json.dumps({"dir": str(tmp_path)}))
    run_id = started["run"]["runId"]
    wait_for((tmp_path / "posting").exists, 60, "the manual action to begin")
    piwf.json("run", "pause", run_id)
    (effect,) = piwf.json("run", "show", run_id)["effects"]
    effect_id = effect["effectId"]
    assert effect["status"] == "applying", "the stored state is unchanged by the pause"

    shown = piwf.run("run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.startswith(f"  {effect_id}"))
    assert "chat.post  manual    applying (stopped by the pause)  1" in row, shown.stdout
    after_resume = (
        f"the pause stopped manual effect {effect_id} (chat.post) while it applied: after the"
        " resume the run parks with it ambiguous, for you to check whether it happened and"
        f" settle it (piwf effect resolve {effect_id} --applied|--retry)"
    )
    assert f"it is paused: piwf run resume {run_id}; {after_resume}" in shown.stdout
    explained = piwf.json("run", "explain", run_id)
    assert explained["explanation"].endswith(f"But {after_resume}.")

    for flag in ("--applied", "--retry"):
        refused = piwf.json("effect", "resolve", effect_id, flag, exit_code=1)
        assert refused["error"]["message"].startswith(
            f"effect {effect_id} is not ambiguous yet: its run {run_id} is paused"
        ), refused
        assert f"(piwf run resume {run_id})" in refused["error"]["message"]
    (effect,) = piwf.json("run", "show", run_id)["effects"]
    assert effect["status"] == "applying", "a refused resolve changes nothing"

    piwf.json("run", "resume", run_id)
    waited = piwf.run("run", "wait", run_id, "--timeout", "60", "--json")
    assert json.loads(waited.stdout)["run"]["errorCode"] == "effectAmbiguous"
    assert "stopped by the pause" not in piwf.run("run", "show", run_id).stdout
    piwf.json("effect", "resolve", effect_id, "--applied")
    piwf.json("run", "resume", run_id)
    assert piwf.json("run", "wait", run_id, "--timeout", "60")["run"]["status"] == "completed"


def test_a_checkpoint_block_names_its_run(piwf: Piwf) -> None:  # noqa: F811
    """Agent requests named their run below the table; checkpoints and decisions did not."""
    started = piwf.json("run", "start", CHECKPOINT, "--input", '{"steps": ["a"]}')
    run_id = started["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]
    listed = piwf.run("requests").stdout
    block = listed.split(f"  request  {request_id}\n", 1)[1]
    assert block.startswith(f"  kind     checkpoint\n  run      {run_id}\n"), listed


def test_run_list_marks_a_run_whose_request_waits_for_a_persons_answer(
    piwf: Piwf,  # noqa: F811
) -> None:
    """`piwf run list` said only `waiting` for a run stopped on a decision or a checkpoint,
    the same as for a run whose agent works: nothing said that a person must answer."""
    run_id = piwf.json("run", "start", DECISION, "--input", '{"release": "1.4"}')["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]

    def row() -> str:
        listed = piwf.run("run", "list")
        assert listed.returncode == 0, listed.stderr
        return next(line for line in listed.stdout.splitlines() if line.startswith(run_id))

    def listed_run() -> dict[str, object]:
        runs = piwf.json("run", "list")["runs"]
        found: dict[str, object] = next(run for run in runs if run["runId"] == run_id)
        return found

    assert f"{run_id}  waiting (needs action: answer)  " in row()
    assert listed_run()["waitingForPerson"] is True
    piwf.json("run", "pause", run_id)  # paused: the resume comes first, the answer after
    assert f"{run_id}  paused  " in row()
    assert listed_run()["waitingForPerson"] is False
    piwf.json("run", "resume", run_id)
    assert piwf.json("answer", request_id, '{"choice": "ship"}')["outcome"] == "won"
    wait_for(
        lambda: listed_run()["displayStatus"] == "completed", timeout_s=30, what="the answered run"
    )
    assert listed_run()["waitingForPerson"] is False
    assert "needs action" not in row()


def test_an_interactive_runs_agent_request_names_its_session_not_piwf_submit(
    piwf: Piwf,  # noqa: F811
) -> None:
    """`piwf answer` on an interactive run's agent request, and a run id given as a request id,
    named `piwf submit REQUEST '<json>'`, which an interactive run refuses (sessionAuthority);
    they name the session's host, as `piwf requests` and `run show` do."""
    started = piwf.json(
        "run", "start", SESSION_REVIEW, "--input", '{"topic": "x"}', "--session", "probe-1"
    )
    run_id = started["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]
    through = "through its session: piwf session attach probe-1"

    refused = piwf.json("answer", request_id, '{"note": "x"}', exit_code=1)
    assert refused["error"] == {
        "code": "notDecisionRequest",
        "message": f"request {request_id} is an agent step's request, not a checkpoint or"
        f" decision; submit its output {through}",
    }
    for command in ("answer", "submit"):
        by_run = piwf.json(command, run_id, '{"note": "x"}', exit_code=1)["error"]
        assert by_run["code"] == "requestNotFound"
        assert f'request {request_id} (agent at node "draft"): {through}' in by_run["message"]
        assert "piwf submit" not in by_run["message"]
    assert pending(piwf, run_id)["submissions"] == 0, "nothing was submitted"
