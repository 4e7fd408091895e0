"""Ctrl-C stops a command under the exit-code protocol: status 130, and with ``--json`` still
exactly one document; what the command asked of the server stays asked. SIGTERM stops a
command that waits on a run the same way, with status 143 (not a silent death)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli_e2e import COMMAND_TIMEOUT_S, REPO, Piwf
from tests.cli.test_cli_e2e import piwf as piwf  # the fixture, used by name
from tests.cli_process import PIWF
from tests.server.harness import WITH_DEFAULT_SIGINT, wait_for

CHECKPOINT = "fixtures/workflows/checkpoint_review.py"


GOES_ON = (
    "only this command stopped: a run it started or waited on goes on (piwf run list shows"
    " whether a start got that far)"
)
#: Each signal: the exit status, the error code, what the JSON message says stopped it, and
#: the human line's first word.
STOPS = {
    signal.SIGINT: (130, "interrupted", "Ctrl-C", "interrupted"),
    signal.SIGTERM: (143, "terminated", "SIGTERM", "terminated"),
}


def waiting_run(piwf: Piwf) -> str:
    """A run that waits on its checkpoint request (it holds no child)."""
    run_id: str = piwf.json("run", "start", CHECKPOINT, "--input", '{"steps": [1]}')["run"]["runId"]
    wait_for(lambda: piwf.json("requests", "--run", run_id)["requests"], timeout_s=30)
    return run_id


def started(piwf: Piwf, arguments: list[str]) -> subprocess.Popen[str]:
    """``piwf ARGUMENTS`` started with the default SIGINT handler, in a session of its own."""
    return subprocess.Popen(
        [sys.executable, "-c", WITH_DEFAULT_SIGINT, str(PIWF), *arguments],
        env=piwf.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def stopped_while_waiting(
    piwf: Piwf, arguments: list[str], signum: signal.Signals
) -> subprocess.CompletedProcess[str]:
    """Run ``piwf ARGUMENTS``, send it ``signum`` once it is connected, and return how it ended."""
    waiter = started(piwf, arguments)
    try:
        # The waiter is connected (the status request itself is the other connection).
        wait_for(
            lambda: piwf.json("server", "status")["connections"] >= 2,
            timeout_s=30,
            what="the waiter's connection",
        )
        waiter.send_signal(signum)
        stdout, stderr = waiter.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    return subprocess.CompletedProcess(waiter.args, waiter.returncode, stdout, stderr)


@pytest.mark.parametrize("signum", list(STOPS), ids=["sigint", "sigterm"])
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_a_signal_stops_a_wait_with_its_status_and_the_run_goes_on(
    piwf: Piwf, as_json: bool, signum: signal.Signals
) -> None:
    status, code, by, said = STOPS[signum]
    run_id = waiting_run(piwf)
    ended = stopped_while_waiting(
        piwf, ["run", "wait", run_id] + (["--json"] if as_json else []), signum
    )
    stdout, stderr = ended.stdout, ended.stderr
    assert ended.returncode == status, (stdout, stderr)
    assert "Traceback" not in stderr and "Aborted!" not in stderr, stderr
    if as_json:
        assert stdout.count("\n") == 1, stdout
        assert json.loads(stdout)["error"] == {
            "code": code,
            "message": f"stopped by {by}; {GOES_ON}",
        }
    else:
        assert stdout == ""
        assert stderr == f"{said}; {GOES_ON}\n"
    # Only the wait stopped: the run still waits on its checkpoint.
    shown = piwf.json("run", "show", run_id)
    assert shown["run"]["status"] == "waiting", shown["run"]


FOLLOWS = {
    "show": ["run", "show", "RUN", "--follow"],
    "logs": ["run", "logs", "RUN", "--follow"],
    "logs-json": ["run", "logs", "RUN", "--follow", "--json"],
}


@pytest.mark.parametrize("signum", list(STOPS), ids=["sigint", "sigterm"])
@pytest.mark.parametrize("follow", list(FOLLOWS))
def test_a_signal_stops_following_saying_so_with_its_status_and_the_run_goes_on(
    piwf: Piwf, follow: str, signum: signal.Signals
) -> None:
    status, code, by, said = STOPS[signum]
    run_id = waiting_run(piwf)
    arguments = [run_id if word == "RUN" else word for word in FOLLOWS[follow]]
    ended = stopped_while_waiting(piwf, arguments, signum)
    assert ended.returncode == status, (ended.stdout, ended.stderr)
    assert "Traceback" not in ended.stderr and "Aborted!" not in ended.stderr, ended.stderr
    if "--json" in arguments:
        # JSON lines: every piece read, then the error document that says why it stopped.
        lines = ended.stdout.splitlines()
        assert lines, ended.stdout
        assert all("attempt" in json.loads(line) for line in lines[:-1]), lines
        assert json.loads(lines[-1]) == {
            "error": {"code": code, "message": f"stopped by {by}; {GOES_ON}"}
        }
        assert ended.stderr == ""
    else:
        assert ended.stderr == f"{said}; {GOES_ON}\n"
    assert piwf.json("run", "show", run_id)["run"]["status"] == "waiting"


SLOW_VALIDATE = """
import os, time
from piwf.workflow import agent, define_workflow

def check(output, ctx):
    deadline = time.monotonic() + 60
    while not os.path.exists({flag!r}) and time.monotonic() < deadline:
        time.sleep(0.02)
    return output

workflow = define_workflow(
    name="slow_validate", start_at="ask",
    nodes={{"ask": agent(prompt="go", expected_output="{{}}", validate=check)}}, edges=[],
)
"""


@pytest.mark.parametrize("signum", list(STOPS), ids=["sigint", "sigterm"])
def test_a_signal_stops_a_submit_saying_its_output_is_validated_all_the_same(
    piwf: Piwf, signum: signal.Signals, tmp_path: Path
) -> None:
    """Stopped while its output was validated, `piwf submit` said "a run it started or waited
    on goes on (piwf run list ...)", which says nothing of the submission; SIGTERM killed it
    silently. It says the output is validated all the same and how to read the outcome."""
    status, code, by, _ = STOPS[signum]
    flag = tmp_path / "validate-may-finish"
    workflow = tmp_path / "slow_validate.py"
    workflow.write_text(SLOW_VALIDATE.format(flag=str(flag)))
    run_id = piwf.json("run", "start", str(workflow))["run"]["runId"]
    (request,) = wait_for(lambda: piwf.json("requests", "--run", run_id)["requests"], timeout_s=30)
    request_id = request["requestId"]
    submit = started(piwf, ["submit", request_id, "{}", "--json"])
    try:
        wait_for(
            lambda: piwf.json("requests", "--run", run_id)["requests"][0]["submissions"] == 1,
            timeout_s=30,
            what="the submission, validating",
        )
        submit.send_signal(signum)
        stdout, stderr = submit.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.communicate()
    assert submit.returncode == status, (stdout, stderr)
    assert json.loads(stdout) == {
        "error": {
            "code": code,
            "message": (
                f"stopped by {by}; only this command stopped: an output it had sent is validated"
                f" all the same and keeps its outcome (piwf submit {request_id} with the same"
                " output again reports it, or submits it if it never arrived)"
            ),
        }
    }
    flag.write_text("")
    again = piwf.json("submit", request_id, "{}")
    assert again["outcome"] == "accepted"
    assert piwf.json("run", "wait", run_id)["run"]["status"] == "completed"
