"""Ctrl-C stops a command under the exit-code protocol: status 130, and with ``--json`` still
exactly one document; what the command asked of the server stays asked."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.cli.test_cli_e2e import COMMAND_TIMEOUT_S, PIWF, REPO, Piwf
from tests.cli.test_cli_e2e import piwf as piwf  # the fixture, used by name
from tests.server.harness import WITH_DEFAULT_SIGINT, wait_for

CHECKPOINT = "fixtures/workflows/checkpoint_review.py"


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_ctrl_c_stops_a_wait_with_status_130_and_the_run_goes_on(piwf: Piwf, as_json: bool) -> None:
    started = piwf.json("run", "start", CHECKPOINT, "--input", '{"steps": [1]}')
    run_id = started["run"]["runId"]
    wait_for(lambda: piwf.json("requests", "--run", run_id)["requests"], timeout_s=30)
    waiter = subprocess.Popen(
        [sys.executable, "-c", WITH_DEFAULT_SIGINT, str(PIWF), "run", "wait", run_id]
        + (["--json"] if as_json else []),
        env=piwf.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # The waiter is connected (the status request itself is the other connection).
        wait_for(
            lambda: piwf.json("server", "status")["connections"] >= 2,
            timeout_s=30,
            what="the waiter's connection",
        )
        waiter.send_signal(signal.SIGINT)
        stdout, stderr = waiter.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert waiter.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "Aborted!" not in stderr, stderr
    goes_on = (
        "only this command stopped: a run it started or waited on goes on (piwf run list shows"
        " whether a start got that far)"
    )
    if as_json:
        assert stdout.count("\n") == 1, stdout
        assert json.loads(stdout)["error"] == {
            "code": "interrupted",
            "message": f"stopped by Ctrl-C; {goes_on}",
        }
    else:
        assert stdout == ""
        assert stderr == f"interrupted; {goes_on}\n"
    # Only the wait stopped: the run still waits on its checkpoint.
    shown = piwf.json("run", "show", run_id)
    assert shown["run"]["status"] == "waiting", shown["run"]
