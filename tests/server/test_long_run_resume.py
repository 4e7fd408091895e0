"""A run of any length resumes after its server was killed.

A resumed runner needs the run's saved state: every finished step with its output, so the
engine can replay the routing to where the run stopped. That state grows with the run. It
used to travel as one value (inline, or by one content reference of at most 256 MiB), so a
long run could never resume: its new runner refused the reference and the run parked
``runnerNoProgress`` for good. Now the runner reads the steps in bounded pages.

The workflow loops over a node until its saved steps take several pages, then waits at a gate
node; the test kills the server there (a crash, ``kill -9``), starts a new one, opens the gate
and expects the run to resume from the gate's visit and complete. In the default tier the steps
are many small outputs (about 1.5 MB, three pages); the ``soak`` case writes ~1 MB outputs until
the steps pass 256 MiB, which failed before the pages (about 16 s and 260 MB of disk).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from piwf.config import MAX_CONTENT_BYTES
from tests.cli_process import run_piwf
from tests.server.harness import ServerFactory, wait_for
from tests.server.test_execution import FAST

#: Output bytes of one loop visit, and visits enough for the steps to pass one content value.
PAD_BYTES = 960_000
VISITS = MAX_CONTENT_BYTES // PAD_BYTES + 12
#: The default tier's loop: many small steps, several pages of them (each ~512 KiB).
SMALL_PAD_BYTES = 2_500
SMALL_VISITS = 600

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
    max_steps=5000,
)
"""


def piwf(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_piwf(args, env={**os.environ, "PIWF_HOME": str(home)}, timeout=180)


@pytest.mark.parametrize(
    ("visits", "pad_bytes"),
    [
        pytest.param(SMALL_VISITS, SMALL_PAD_BYTES, id="600-small-steps"),
        pytest.param(VISITS, PAD_BYTES, id="past-one-content-value", marks=pytest.mark.soak),
    ],
)
def test_a_run_whose_saved_steps_take_pages_resumes_after_a_server_crash(
    servers: ServerFactory, tmp_path: Path, visits: int, pad_bytes: int
) -> None:
    assert visits != VISITS or VISITS * PAD_BYTES > MAX_CONTENT_BYTES
    workflow = tmp_path / "long_loop.py"
    workflow.write_text(textwrap.dedent(LONG_LOOP))
    arrived, gate = tmp_path / "arrived", tmp_path / "gate"
    run_input = {"visits": visits, "pad": pad_bytes, "gate": str(gate), "arrived": str(arrived)}

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
    assert result["output"] == {"visits": visits, "padBytes": pad_bytes}
