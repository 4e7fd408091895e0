"""An agent step driven from the installed ``piwf`` script: list, submit wrong, submit right.

No agent command is configured, so the step parks ``waiting`` for an outside submission, as a
person (or any agent with a shell) would make it.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli_e2e import COMMAND_TIMEOUT_S, REPO, Piwf
from tests.cli.test_cli_e2e import piwf as piwf  # the fixture, used by name
from tests.cli_process import PIWF
from tests.server.harness import wait_for

AGENT = """
from piwf.workflow import agent, compute, define_workflow


def check(output, ctx):
    if not isinstance(output, dict) or not str(output.get("summary", "")).strip():
        raise ValueError('submit {"summary": <non-empty text>}')
    return {"summary": output["summary"].strip()}


workflow = define_workflow(
    name="summarise",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: f"Summarise {ctx.input['topic']} in one sentence.",
            expected_output='{"summary": "text"}',
            validate=check,
        ),
        "finish": compute(lambda ctx: ctx.outputs["ask"]),
    },
    edges=[{"from": "ask", "to": "finish"}],
)
"""


# conformance: I3
def test_a_rejected_then_accepted_submission_completes_the_run(
    piwf: Piwf,
    tmp_path: Path,
) -> None:
    workflow = tmp_path / "summarise.py"
    workflow.write_text(AGENT)
    run_id = piwf.json("run", "start", str(workflow), "--input", '{"topic": "tides"}')["run"][
        "runId"
    ]
    requests = wait_for(lambda: piwf.json("requests", "--run", run_id)["requests"], timeout_s=30)
    (request,) = requests
    request_id = request["requestId"]
    assert request["kind"] == "agent"
    assert request["content"]["expectedOutput"] == '{"summary": "text"}'

    listed = piwf.run("requests")
    assert listed.returncode == 0, listed.stderr
    assert "Summarise tides in one sentence." in listed.stdout
    assert '{"summary": "text"}' in listed.stdout
    assert f"piwf submit {request_id} '<json>'" in listed.stdout
    assert "session" not in piwf.json("requests", "--run", run_id)["requests"][0]
    # What to do next, as the run view says it, is a command the CLI takes.
    shown_view = piwf.json("run", "show", run_id)
    assert shown_view["display"]["waitingOn"]["command"] == f"piwf submit {request_id} '<json>'"
    assert "15 min left (not counting)" in listed.stdout  # no agent works on it

    answered = piwf.run("answer", request_id, '{"summary": "x"}')
    assert answered.returncode == 1
    assert f"piwf submit {request_id}" in answered.stderr

    wrong = piwf.run("submit", request_id, '{"summary": "   "}')
    assert wrong.returncode == 1
    assert 'ValueError: submit {"summary": <non-empty text>}' in wrong.stderr
    pending = piwf.json("requests", "--run", run_id)["requests"]
    assert [r["requestId"] for r in pending] == [request_id]
    assert pending[0]["latestRejection"] == 'ValueError: submit {"summary": <non-empty text>}'

    right = subprocess.run(
        [str(PIWF), "submit", request_id, "-", "--json"],
        input='{"summary": "  The moon pulls the sea.  "}',
        env=piwf.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert right.returncode == 0, right.stderr
    assert '"outcome":"accepted"' in right.stdout
    assert '"value":{"summary":"The moon pulls the sea."}' in right.stdout

    waited = piwf.json("run", "wait", run_id)
    assert waited["run"]["status"] == "completed"
    assert waited["output"] == {"summary": "The moon pulls the sea."}
    shown = piwf.run("run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "agent requests:" in shown.stdout
    assert "1. rejected at" in shown.stdout
    assert 'ValueError: submit {"summary": <non-empty text>}' in shown.stdout
    assert "2. accepted at" in shown.stdout
    assert '{"summary":"The moon pulls the sea."}' in shown.stdout

    update = piwf.run("update", request_id, '{"late": true}')
    assert update.returncode == 1
    assert "requestNotOpen" in piwf.run("update", request_id, "{}", "--json").stdout
    # The run has ended: a late submission is told the step took its output, nothing more.
    late = piwf.json("submit", request_id, '{"summary": "again"}', exit_code=1)["error"]
    assert late["code"] == "requestNotOpen"
    assert late["message"] == (
        f"request {request_id} was already completed by an accepted submission; its step took"
        f" that output (piwf run show {run_id})"
    )


def test_a_late_submission_says_how_the_step_without_an_output_ended(
    piwf: Piwf, tmp_path: Path
) -> None:
    workflow = tmp_path / "summarise.py"
    workflow.write_text(AGENT)
    never = [sys.executable, str(REPO / "fixtures" / "agents" / "never_submits.py")]
    failing = piwf.json(
        "run", "start", str(workflow), "--input", '{"topic": "tides"}',
        "--agent-command",
        shlex.join([*never, str(tmp_path / "turns"), "--name", "$PIWF_REQUEST_ID"]),
    )["run"]["runId"]  # fmt: skip
    assert piwf.json("run", "wait", failing, exit_code=1)["run"]["status"] == "failed"
    failed_request = (tmp_path / "turns").read_text().split(":", 1)[0]
    cancelled = piwf.json("run", "start", str(workflow), "--input", '{"topic": "x"}')["run"][
        "runId"
    ]
    (waiting,) = wait_for(lambda: piwf.json("requests", "--run", cancelled)["requests"], 30)
    piwf.json("run", "cancel", cancelled)

    for run_id, request_id, how in [
        (failing, failed_request, "its step ended failed before an output was accepted"),
        (cancelled, waiting["requestId"], "its step was cancelled with its run"),
    ]:
        refused = piwf.json("submit", request_id, '{"summary": "late"}', exit_code=1)["error"]
        assert refused == {
            "code": "requestNotOpen",
            "message": f"request {request_id} is closed: {how}; it takes no output"
            f" (piwf run show {run_id})",
        }
