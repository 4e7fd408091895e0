"""Figures 1-3: throughput, latency and per-node overhead of piwf and its peers, and the floor.

What one "two-node workflow" is, per system:

- piwf: a workflow file with two ``compute`` nodes (``first`` -> ``second``), started with
  ``Client.start_run`` (a resolver child loads and digests the file, the run is committed) and
  executed by one runner child; completion observed with ``Client.wait_run`` (the server
  answers when the run is terminal).
- DBOS: one ``@DBOS.workflow`` calling two ``@DBOS.step`` functions (see the DBOS driver).
- Huey: the pipeline ``first_task.s(v).then(second_task)`` (see the Huey app).
"""

from __future__ import annotations

import ctypes
import os
import resource
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from piwf.client import Client
from piwf.state import StateDatabase
from tests.bench import peers
from tests.bench.common import BenchError, Figure, Spread, percentile, scratch_dir
from tests.bench.piwf_side import PiwfServer, chain_workflow, server_settings, two_node_workflow
from tests.bench.sizes import Sizes

RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Context:
    """What every figure gets: its sizes and the systems to measure."""

    sizes: Sizes
    systems: frozenset[str]


def completed(client: Client, run_id: str) -> None:
    final = client.wait_run(run_id, timeout_s=RUN_TIMEOUT_S)
    if final.run.status != "completed":
        raise BenchError(f"run {run_id} ended {final.run.status} ({final.run.error_code})")


def submit_runs(client: Client, workflow: Path, runs: int, threads: int) -> list[str]:
    """Start ``runs`` runs of ``workflow`` from ``threads`` threads (1 = a plain loop)."""

    def submit(i: int) -> str:
        return client.start_run(workflow, input={"v": i}).run_id

    if threads == 1:
        return [submit(i) for i in range(runs)]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(submit, range(runs)))


def piwf_throughput(workdir: Path, runs: int, threads: int) -> float:
    """Seconds for ``runs`` two-node runs, submitted by ``threads`` threads (1 = a plain loop)."""
    workflow = two_node_workflow(workdir)
    with PiwfServer(workdir / "h") as server, server.client() as client:
        completed(client, client.start_run(workflow, input={"v": 0}).run_id)  # warm-up
        began = time.perf_counter()
        for run_id in submit_runs(client, workflow, runs, threads):
            completed(client, run_id)
        return time.perf_counter() - began


#: DBOS's queue polling at its best throughput setting, next to the suite's 100 ms one.
DBOS_FAST_POLL_S = 0.01


def figure_throughput(context: Context) -> Figure:
    sizes = context.sizes
    n = sizes.throughput_runs
    figure = Figure(
        1,
        f"throughput: {n} two-node workflows, 4 workers (runs/s)",
        [
            "system",
            "one run is",
            "runs/s median [min-max]",
            "CPU s per run",
            "piwf (loop) ÷",
            "piwf (threads) ÷",
        ],
    )
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    dbos_slow = f"DBOS queue, {peers.PEER_POLL_S * 1000:g} ms polling"
    dbos_fast = f"DBOS queue, {DBOS_FAST_POLL_S * 1000:g} ms polling"
    described: dict[str, str] = {
        "piwf, submit loop": "2 compute nodes, 1 runner child",
        f"piwf, {sizes.submit_threads} submit threads": "2 compute nodes, 1 runner child",
        dbos_slow: "workflow + 2 steps",
        dbos_fast: "workflow + 2 steps",
        "Huey": "pipeline of 2 tasks",
    }
    measure: dict[str, Callable[[Path], float]] = {
        "piwf, submit loop": lambda d: piwf_throughput(d, n, 1),
        f"piwf, {sizes.submit_threads} submit threads": lambda d: piwf_throughput(
            d, n, sizes.submit_threads
        ),
    }
    if "dbos" in context.systems:
        measure[dbos_slow] = lambda d: float(peers.run_dbos("throughput", d, n=n)["seconds"])
        measure[dbos_fast] = lambda d: float(
            peers.run_dbos("throughput", d, n=n, poll_s=DBOS_FAST_POLL_S)["seconds"]
        )
    if "huey" in context.systems:
        measure["Huey"] = lambda d: float(peers.run_huey("throughput", d, n=n)["seconds"])
    with adopting_orphans():
        for _ in range(sizes.reps):
            for name, run in measure.items():
                with scratch_dir() as workdir:
                    before = children_cpu_s()
                    rates.setdefault(name, []).append(n / run(workdir))
                    cpu.setdefault(name, []).append((children_cpu_s() - before) / n)
    spreads = {name: Spread.of(values) for name, values in rates.items()}
    loop = spreads["piwf, submit loop"].median
    threaded = spreads[f"piwf, {sizes.submit_threads} submit threads"].median
    for name, spread in spreads.items():
        cpu_per_run = Spread.of(cpu[name]).median
        figure.add(
            [
                name,
                described[name],
                spread.show(digits=1),
                f"{cpu_per_run:.4f}",
                f"{loop / spread.median:.2f}",
                f"{threaded / spread.median:.2f}",
            ],
            name,
            {"runsPerSecond": spread.to_json(), "runs": n, "cpuSecondsPerRun": cpu_per_run},
        )
    figure.settings = {"piwf": server_settings(4), **_peer_settings(context)}
    figure.notes.append(
        "each repetition: a fresh server/consumer/process and database, one warm-up run, then "
        "the clock runs from the first submission to the last observed completion"
    )
    figure.notes.append(
        "CPU s per run: user + system CPU of every process the repetition started (the piwf "
        "server with its fork server, runner and resolver children; the DBOS or Huey driver "
        "process and its workers), start-up and warm-up included, divided by the runs; the "
        "submitting client threads of piwf run in the bench process and are not counted"
    )
    figure.notes.append(
        f"DBOS is shown at its best throughput setting ({DBOS_FAST_POLL_S * 1000:g} ms queue "
        f"polling) and at the suite's {peers.PEER_POLL_S * 1000:g} ms; its default is 1 s"
    )
    return figure


@contextmanager
def adopting_orphans() -> Iterator[None]:
    """While inside, this process is the subreaper of its descendants (Linux): a piwf server's
    fork server and the runners it forked outlive their parent by a moment and would be reaped
    by init, their CPU time lost. On the way out it stops adopting and reaps what it adopted,
    so later figures (5 measures how fast init reaps an orphan) see the usual parentage."""
    _set_subreaper(True)
    try:
        yield
    finally:
        _set_subreaper(False)
        children_cpu_s()


def children_cpu_s() -> float:
    """User + system CPU seconds of every descendant of this process that has ended so far;
    every descendant that ended is reaped here first, within a few seconds."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # no descendant left
        if pid == 0:
            time.sleep(0.05)  # one still running: it ends with its parent
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _set_subreaper(adopting: bool) -> None:
    """Adopt orphaned descendants, or stop adopting them (``PR_SET_CHILD_SUBREAPER``)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(adopting), 0, 0, 0)


_PR_SET_CHILD_SUBREAPER = 36


def piwf_latencies(workdir: Path, samples: int) -> tuple[list[float], list[float]]:
    """(request -> observed completion, request -> run.start answered) for ``samples`` runs."""
    workflow = two_node_workflow(workdir)
    totals: list[float] = []
    submits: list[float] = []
    with PiwfServer(workdir / "h") as server, server.client() as client:
        completed(client, client.start_run(workflow, input={"v": 0}).run_id)
        for i in range(samples):
            began = time.perf_counter()
            run = client.start_run(workflow, input={"v": i})
            submits.append(time.perf_counter() - began)
            completed(client, run.run_id)
            totals.append(time.perf_counter() - began)
    return totals, submits


def figure_latency(context: Context) -> Figure:
    sizes = context.sizes
    figure = Figure(
        2,
        "latency: one two-node run from request to observed completion (ms)",
        ["system", "p50 median [min-max]", "p95 median [min-max]"],
    )
    p50: dict[str, list[float]] = {}
    p95: dict[str, list[float]] = {}

    def record(name: str, values: list[float]) -> None:
        p50.setdefault(name, []).append(percentile(values, 50))
        p95.setdefault(name, []).append(percentile(values, 95))

    for _ in range(sizes.reps):
        with scratch_dir() as workdir:
            totals, submits = piwf_latencies(workdir, sizes.latency_samples)
            record("piwf", totals)
            record("piwf: run.start answered (part of the above)", submits)
        if "dbos" in context.systems:
            with scratch_dir() as workdir:
                result = peers.run_dbos("latency", workdir, samples=sizes.latency_samples)
                record("DBOS queue", result["queued"])
                record("DBOS start_workflow (no queue)", result["direct"])
        if "huey" in context.systems:
            with scratch_dir() as workdir:
                result = peers.run_huey("latency", workdir, samples=sizes.latency_samples)
                record("Huey", result["latencies"])
    for name in p50:
        low, high = Spread.of(p50[name]), Spread.of(p95[name])
        figure.add(
            [name, low.show(1000), high.show(1000)],
            name,
            {"p50S": low.to_json(), "p95S": high.to_json(), "samples": sizes.latency_samples},
        )
    figure.settings = {"piwf": server_settings(4), **_peer_settings(context)}
    figure.notes.append(
        f"{sizes.latency_samples} sequential samples per repetition on a warm server/consumer/"
        "process; percentiles per repetition, then median [min-max] over repetitions"
    )
    return figure


def commit_floor(directory: Path, commits: int, journal: str, rep: int) -> float:
    """Median seconds of one ``BEGIN IMMEDIATE; INSERT; COMMIT`` with ``synchronous=FULL``, on
    a new file ``floor-<journal>-<rep>.sqlite`` in ``directory``."""
    path = directory / f"floor-{journal}-{rep}.sqlite"
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute(f"PRAGMA journal_mode={journal}")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB NOT NULL) STRICT")
        timings = []
        for i in range(commits):
            began = time.perf_counter()
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO t (v) VALUES (?)", (i.to_bytes(8, "big") * 8,))
            connection.execute("COMMIT")
            timings.append(time.perf_counter() - began)
    finally:
        connection.close()
    return statistics.median(timings)


def piwf_chain(workdir: Path, nodes: int, reps: int) -> dict[str, Any]:
    """Per-rep marginal seconds per node, plus the run's revisions and runner messages."""
    two = chain_workflow(workdir, 2)
    long = chain_workflow(workdir, nodes)
    per_node: list[float] = []
    totals: list[float] = []
    with PiwfServer(workdir / "h") as server, server.client() as client:
        completed(client, client.start_run(two).run_id)
        run_id = ""
        for _ in range(reps):
            began = time.perf_counter()
            completed(client, client.start_run(two).run_id)
            short_s = time.perf_counter() - began
            began = time.perf_counter()
            run_id = client.start_run(long).run_id
            completed(client, run_id)
            long_s = time.perf_counter() - began
            totals.append(long_s)
            per_node.append((long_s - short_s) / (nodes - 2))
        counts = _run_counts(server.home, run_id)
    return {"perNode": per_node, "totals": totals, **counts}


def _run_counts(home: Path, run_id: str) -> dict[str, int]:
    """Revisions and runner messages (changes, each with its receipt) of one run."""
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        revisions = tx.scalar(
            "SELECT revision FROM resources r JOIN runs u ON u.resource_id = r.resource_id"
            " WHERE u.run_id = ?",
            (run_id,),
        )
        messages = tx.scalar(
            "SELECT count(*) FROM runner_messages m JOIN run_runners r"
            " ON r.runner_epoch = m.runner_epoch WHERE r.run_id = ?",
            (run_id,),
        )
    return {"revisions": int(revisions), "runnerMessages": int(messages)}


def figure_per_node(context: Context) -> Figure:
    sizes = context.sizes
    nodes = sizes.chain_nodes
    figure = Figure(
        3,
        f"per-node overhead: a {nodes}-node compute chain in one run (ms per node)",
        ["what", "ms median [min-max]", "÷ floor"],
    )
    with scratch_dir() as workdir:
        wal = [commit_floor(workdir, sizes.floor_commits, "wal", i) for i in range(sizes.reps)]
        rollback = [
            commit_floor(workdir, sizes.floor_commits, "delete", i) for i in range(sizes.reps)
        ]
    floor = Spread.of(wal)
    with scratch_dir() as workdir:
        chain = piwf_chain(workdir, nodes, sizes.reps)
    rows: list[tuple[str, Spread, dict[str, Any]]] = [
        (
            "piwf: one compute node (marginal, (T(n) - T(2)) / (n - 2))",
            Spread.of(chain["perNode"]),
            {
                "revisionsPerNode": chain["revisions"] / nodes,
                "runnerMessagesPerNode": chain["runnerMessages"] / nodes,
                "totalS": Spread.of(chain["totals"]).to_json(),
            },
        )
    ]
    if "dbos" in context.systems:
        with scratch_dir() as workdir:
            result = peers.run_dbos("chain", workdir, n=nodes, samples=sizes.reps)
        steps = [(c - t) / (nodes - 2) for c, t in zip(result["chain"], result["two"], strict=True)]
        rows.append(("DBOS: one step (marginal, start_workflow)", Spread.of(steps), {}))
    rows.append(("floor: SQLite commit, WAL + synchronous=FULL", floor, {}))
    rows.append(("SQLite commit, rollback journal + FULL (DBOS's mode)", Spread.of(rollback), {}))
    for name, spread, extra in rows:
        figure.add(
            [name, spread.show(1000, 3), f"{spread.median / floor.median:.1f}"],
            name,
            {"seconds": spread.to_json(), **extra},
        )
    figure.notes.append(
        f"piwf run of {nodes} nodes: {chain['revisions']} run revisions "
        f"({chain['revisions'] / nodes:.2f} per node) and {chain['runnerMessages']} stored runner "
        "messages; a node's end and the next node's start commit in one transaction (one batch "
        "call), so a node costs one commit"
    )
    figure.notes.append(
        f"floor: median of {sizes.floor_commits} commits of one small row, same process and "
        "file system as the benchmark homes"
    )
    figure.settings = {"piwf": server_settings(4), **_peer_settings(context)}
    return figure


def _peer_settings(context: Context) -> dict[str, str]:
    chosen = peers.settings()
    return {name: text for name, text in chosen.items() if name.lower() in context.systems}
