"""A run of any length resumes after its server was killed.

A resumed runner needs the run's saved state: every finished step with its output, so the
engine can replay the routing to where the run stopped. That state grows with the run. It
used to travel as one value (inline, or by one content reference of at most 256 MiB), so a
long run could never resume: its new runner refused the reference and the run parked
``runnerNoProgress`` for good. Now the runner reads the steps in bounded pages.

The workflow loops over a node with a ~1 MB output until the saved steps pass 256 MiB, then
waits at a gate node; the test kills the server there (a crash, ``kill -9``), starts a new one,
opens the gate and expects the run to resume from the gate's visit and complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from piwf.config import MAX_CONTENT_BYTES
from tests.server.harness import ServerFactory, wait_for
from tests.server.test_execution import FAST

PIWF = Path(sys.executable).parent / "piwf"

#: Output bytes of one loop visit, and visits enough for the steps to pass one content value.
PAD_BYTES = 960_000
VISITS = MAX_CONTENT_BYTES // PAD_BYTES + 12

LONG_LOOP = """
import os
import time

from piwf.workflow import compute, define_workflow


def work(ctx):
    done = ctx.visit >= ctx.input["visits"]
    return {"i": ctx.visit, "pad": "x" * ctx.input["pad"], "route": "done" if done else "again"}


def gate(ctx):
    with open(ctx.input["arrived"], "a") as marker:
        marker.write(f"{ctx.attempt}\\n")
    deadline = time.monotonic() + 120
    while not os.path.exists(ctx.input["gate"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"visits": ctx.outputs["work"]["i"], "padBytes": len(ctx.outputs["work"]["pad"])}


workflow = define_workflow(
    name="long_loop",
    start_at="work",
    nodes={"work": compute(work), "gate": compute(gate)},
    edges=[
        {"from": "work", "switch": {"on": "$output.route",
                                    "cases": {"again": "work", "done": "gate"}}},
    ],
    max_steps=1000,
)
"""


def piwf(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PIWF), *args],
        env={**os.environ, "PIWF_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_a_run_whose_saved_steps_pass_one_content_value_resumes_after_a_server_crash(
    servers: ServerFactory, tmp_path: Path
) -> None:
    assert VISITS * PAD_BYTES > MAX_CONTENT_BYTES
    workflow = tmp_path / "long_loop.py"
    workflow.write_text(textwrap.dedent(LONG_LOOP))
    arrived, gate = tmp_path / "arrived", tmp_path / "gate"
    run_input = {"visits": VISITS, "pad": PAD_BYTES, "gate": str(gate), "arrived": str(arrived)}

    first = servers.start(env=FAST)
    assert first.ready["ok"] is True, first.ready
    started = piwf(
        servers.home, "run", "start", str(workflow), "--input", json.dumps(run_input), "--json"
    )
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run"]["runId"]
    wait_for(arrived.exists, timeout_s=150, what="the run reaches its gate")
    first.kill()

    second = servers.start(env=FAST)
    assert second.ready["ok"] is True, second.ready
    wait_for(
        lambda: arrived.read_text().split() == ["1", "2"],
        timeout_s=60,
        what="the new server's runner resumes the gate's visit",
    )
    gate.touch()
    waited = piwf(servers.home, "run", "wait", run_id, "--timeout", "60", "--json")
    assert waited.returncode == 0, (waited.stdout[-2000:], waited.stderr[-2000:])
    result = json.loads(waited.stdout)
    assert result["run"]["status"] == "completed"
    assert result["output"] == {"visits": VISITS, "padBytes": PAD_BYTES}
