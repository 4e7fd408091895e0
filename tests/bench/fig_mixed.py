"""Figure 8: workflow runs and resource reconciles competing for the same slots.

A piwf server with 4 slots gets ``mixed_runs`` two-node workflow runs and ``mixed_resources``
managed resources at once; each resource's reconcile requeues itself ``mixed_rounds`` times
before it settles, so both kinds keep ready work for a while. The figure prints how long each
kind took, how admissions split while both kinds had work waiting (the scheduler alternates, so
the share should be close to even), and the most children that ran at once (never above the
capacity). Admissions and their intervals are read from the runner tables after the server
stopped: ``run_runners`` for workflow runs, ``managed_resource_runners`` for reconciles.
"""

from __future__ import annotations

import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from piwf import Client
from piwf.state import StateDatabase
from tests.bench.common import BenchError, Figure, Spread, scratch_dir
from tests.bench.fig_runs import Context, completed, submit_runs
from tests.bench.piwf_side import PiwfServer, server_settings, two_node_workflow

MANAGER = "benchspin"
SLOTS = 4
SETTLE_TIMEOUT_S = 600.0

MANAGER_SOURCE = """
from piwf.resource import define_resource_manager, requeue, settled


def initial_status(spec):
    return {"rounds": 0}


def reconcile(ctx, resource):
    done = resource.status.get("rounds", 0) + 1
    if done < resource.spec["rounds"]:
        return requeue(status={"rounds": done})
    return settled(status={"rounds": done, "phase": "done"})


manager = define_resource_manager(
    name="benchspin", initial_status=initial_status, reconcile=reconcile, timeout_ms=60_000
)
"""


def figure_mixed_pool(context: Context) -> Figure:
    sizes = context.sizes
    figure = Figure(
        8,
        f"mixed pool: {sizes.mixed_runs} runs and {sizes.mixed_resources} resources "
        f"x {sizes.mixed_rounds} reconciles on {SLOTS} slots",
        ["measure", "median [min-max]"],
    )
    figure.settings = {
        "piwf": server_settings(SLOTS),
        "workflow": "two compute nodes",
        "reconcile": f"{sizes.mixed_rounds} reconciles per resource: requeue, then settled",
    }
    samples: dict[str, list[float]] = {
        "runs_s": [],
        "reconciles_s": [],
        "run_share": [],
        "peak": [],
    }
    for _ in range(sizes.reps):
        result = _one_mixed_run(sizes.mixed_runs, sizes.mixed_resources, sizes.mixed_rounds)
        for key, value in result.items():
            samples[key].append(value)
    labels = {
        "runs_s": ("workflow runs, all completed (s)", 1.0, 2),
        "reconciles_s": ("reconciles, all settled (s)", 1.0, 2),
        "run_share": ("share of admissions to runs while both waited", 1.0, 2),
        "peak": (f"most children at once (capacity {SLOTS})", 1.0, 0),
    }
    for key, (label, scale, digits) in labels.items():
        spread = Spread.of(samples[key])
        figure.add([label, spread.show(scale, digits)], key, spread.to_json())
    figure.notes.append(
        "A share of 0.50 is strict alternation; the scheduler offers the next slot to the other "
        "kind after each admission when both have ready work."
    )
    return figure


def _one_mixed_run(runs: int, resources: int, rounds: int) -> dict[str, float]:
    with scratch_dir("mixed") as workdir:
        project = workdir / "project"
        managers = project / ".piwf" / "resource_managers"
        managers.mkdir(parents=True)
        (managers / f"{MANAGER}.py").write_text(textwrap.dedent(MANAGER_SOURCE))
        workflow = two_node_workflow(workdir)
        home = workdir / "h"
        with PiwfServer(home, max_workers=SLOTS) as server, server.client() as client:
            began = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:
                applied = pool.submit(_apply_all, client, project, resources, rounds)
                run_ids = submit_runs(client, workflow, runs, 1)
                applied.result()
            for run_id in run_ids:
                completed(client, run_id)
            runs_done = time.perf_counter() - began
            _wait_settled(client, resources)
            reconciles_done = time.perf_counter() - began
            server.stop()
        share, peak = _admissions(home / "state.sqlite")
    return {
        "runs_s": runs_done,
        "reconciles_s": reconciles_done,
        "run_share": share,
        "peak": float(peak),
    }


def _apply_all(client: Client, project: Path, resources: int, rounds: int) -> None:
    for index in range(resources):
        client.apply_resource(MANAGER, f"r{index}", {"rounds": rounds}, project=project)


def _wait_settled(client: Client, resources: int) -> None:
    """Wait until every resource settled (only its last reconcile settles it)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        listed = client.list_resources(MANAGER)
        if len(listed) == resources and all(item.state == "settled" for item in listed):
            return
        time.sleep(0.05)  # a bounded poll interval of the driver
    raise BenchError(f"the {resources} resources did not settle in {SETTLE_TIMEOUT_S:g} s")


def _admissions(database: Path) -> tuple[float, int]:
    """The run share of admissions while both kinds waited, and the peak concurrency."""
    with StateDatabase(database, mode="read-only") as db, db.read() as tx:
        runs = [
            (row[0], row[1], "run")
            for row in tx.all("SELECT started_at, finished_at FROM run_runners")
        ]
        reconciles = [
            (row[0], row[1], "reconcile")
            for row in tx.all("SELECT started_at, finished_at FROM managed_resource_runners")
        ]
    if not runs or not reconciles:
        raise BenchError("one kind of work was never admitted")
    order = sorted(runs + reconciles, key=lambda item: item[0])
    # While both kinds still had admissions ahead of them, both were waiting for slots.
    last_run = max(index for index, item in enumerate(order) if item[2] == "run")
    last_reconcile = max(index for index, item in enumerate(order) if item[2] == "reconcile")
    window = order[: min(last_run, last_reconcile) + 1]
    share = sum(1 for item in window if item[2] == "run") / len(window)
    events = sorted(
        [(start, 1) for start, _, _ in order] + [(end, -1) for _, end, _ in order if end],
        key=lambda event: (event[0], event[1]),
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return share, peak
