"""Make docs/images/piwf-view.png: the run screen of ``piwf view`` on a real run.

    python -m tests.tools.screenshot [--out docs/images/piwf-view.png]

Starts a real server in a temporary home (tests/server/harness.py), starts a run whose
``review`` node prints to its log and then holds on a gate file, opens the run in the viewer
under Textual's pilot, saves the screen as SVG (``App.export_screenshot``) and converts it to
PNG with ``cairosvg`` (a dev tool: ``pip install cairosvg``; never a piwf dependency). Then it
opens the gate, lets the run finish and stops the server.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

from textual.widgets import Static

from piwf import Client
from piwf.cli.view import wording
from piwf.viewer import ViewerApp
from tests.server.harness import ServerFactory, wait_for
from tests.server.test_execution import hold_until_gate

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 30.0

WORKFLOW = """
from piwf.workflow import compute, define_workflow

{gate}

def fetch(ctx):
    print("fetched 3 orders from the queue")
    return {{"orders": [101, 102, 103]}}

def review(ctx):
    print("checking order 101: ok")
    print("checking order 102: ok")
    ctx.publish_update("progress", "orders", {{"checked": 2, "of": 3}})
    print("checking order 103 ...")
    wait_for_gate({entered!r}, {gate_file!r})
    return {{"approved": 3}}

workflow = define_workflow(
    name="nightly-orders",
    start_at="fetch",
    nodes={{
        "fetch": compute(fetch),
        "review": compute(review),
        "report": compute(lambda ctx: {{"sent": True}}),
    }},
    edges=[{{"from": "fetch", "to": "review"}}, {{"from": "review", "to": "report"}}],
)
"""


async def capture(client: Client, run_id: str) -> str:
    """The SVG of the run screen once it shows the running node and its log."""
    app = ViewerApp(client, wording(), run_id)
    async with app.run_test(size=(120, 32)) as pilot:
        deadline = time.monotonic() + DEADLINE_S
        while "node review" not in str(app.screen.query_one("#run-status", Static).render()):
            if time.monotonic() > deadline:
                raise SystemExit("the viewer never showed the running node")
            await pilot.pause(0.05)
        await pilot.press("l")  # every attempt's log
        await pilot.pause(1.0)  # let the log worker fill the pane (a picture, not a test)
        return app.export_screenshot(title="piwf view")


def main() -> None:
    import cairosvg  # a dev tool, imported only here

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "piwf-view.png")
    out = parser.parse_args().out
    root = Path(tempfile.mkdtemp(prefix="pwshot", dir="/tmp"))
    factory = ServerFactory(root / "h")
    try:
        server = factory.start(env={"PIWF_IDLE_EXIT_S": "0"})
        entered, gate = root / "entered", root / "gate"
        source = root / "nightly_orders.py"
        source.write_text(
            textwrap.dedent(WORKFLOW).format(
                gate=hold_until_gate(), entered=str(entered), gate_file=str(gate)
            )
        )
        with Client(server.home, autostart=False) as client:
            run_id = client.start_run(source, input={}).run_id
            wait_for(entered.exists, timeout_s=DEADLINE_S, what="the review node")
            svg = asyncio.run(capture(client, run_id))
            gate.touch()
            client.wait_run(run_id, DEADLINE_S)
        out.parent.mkdir(parents=True, exist_ok=True)
        cairosvg.svg2png(bytestring=svg.encode(), write_to=str(out), output_width=1600)
        print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    finally:
        factory.cleanup()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
