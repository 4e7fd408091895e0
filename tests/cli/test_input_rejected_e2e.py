"""A run whose workflow refuses its input, through the installed ``piwf`` script against a real
server (the fixture of tests/cli/test_cli_e2e.py).

The refusal is its own failure class, ``inputRejected`` (never ``nodeFailed``: no node ran),
and every view of the run says what the workflow refused (the field and the rule, never the
value sent) and that the way on is a new run with a corrected input: ``run explain`` and
``run show`` offer ``run start``, not a restart; the run has no controls; ``run restart`` is
refused (it would give the workflow the same input); ``run wait`` says so on stderr.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 - a fixture used by name

WORKFLOW = """
from pydantic import BaseModel, Field

from piwf.workflow import compute, define_workflow


class ReleaseInput(BaseModel):
    service: str
    replicas: int = Field(ge=1, le=10)


workflow = define_workflow(
    name="release",
    start_at="plan",
    input=ReleaseInput,
    nodes={"plan": compute(lambda ctx: {"service": ctx.input.service})},
    edges=[],
)
"""

#: A value that must never be echoed back: it only appears in the input sent.
SECRET = "tok-8f3a5e-do-not-echo"


def test_a_refused_input_is_input_rejected_and_offers_a_new_run_not_a_restart(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = tmp_path / "release.py"
    path.write_text(textwrap.dedent(WORKFLOW).lstrip(), encoding="utf-8")
    bad = json.dumps({"service": "shop", "replicas": SECRET})
    ended = piwf.json("run", "start", str(path), "--input", bad, "--wait", exit_code=1)
    run = ended["run"]
    run_id = run["runId"]
    assert (run["status"], run["errorCode"], run["needsAction"]) == (
        "failed",
        "inputRejected",
        False,
    )
    assert ended["error"] == (
        "input rejected by workflow 'release': ValidationError: 1 validation error for"
        " ReleaseInput\nreplicas\n  Input should be a valid integer, unable to parse string as"
        " an integer [type=int_parsing]"
    )

    shown = piwf.json("run", "show", run_id)
    assert shown["run"]["errorCode"] == "inputRejected"
    assert shown["display"]["controls"] == []
    assert shown["steps"]["total"] == 0

    explained = piwf.json("run", "explain", run_id)
    start_again = f"piwf run start {path} --input JSON"
    assert explained["cause"] == "inputRejected"
    assert explained["commands"] == [start_again]
    assert "replicas: Input should be a valid integer" in explained["explanation"]
    assert f"piwf workflows show {path}" in explained["explanation"]

    text = piwf.run("run", "show", run_id)
    assert text.returncode == 0, text.stderr
    assert f"next  {start_again}" in text.stdout
    assert "restart" not in text.stdout

    restart = piwf.run("run", "restart", run_id)
    assert restart.returncode == 1, (restart.stdout, restart.stderr)
    assert restart.stderr.startswith(
        f"Error: run {run_id} cannot restart: its workflow rejected its input (inputRejected)"
    ), restart.stderr
    assert start_again in restart.stderr
    assert [listed["runId"] for listed in piwf.json("run", "list")["runs"]] == [run_id]

    waited = piwf.run("run", "wait", run_id)
    assert waited.returncode == 1
    assert "ended failed (inputRejected): input rejected by workflow 'release'" in waited.stderr
    assert f"start a new run with a corrected input: {start_again}" in waited.stderr

    every_output = [ended, shown, explained, text.stdout, restart.stderr, waited.stderr]
    assert SECRET not in json.dumps(every_output)
