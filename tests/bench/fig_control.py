"""Figures 4, 6 and 7: control-plane responsiveness, growth with the database, memory."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.bench import peers
from tests.bench.common import (
    Figure,
    Spread,
    collect_json,
    percentile,
    scratch_dir,
    spawn_driver,
)
from tests.bench.fig_runs import Context, completed, submit_runs
from tests.bench.piwf_side import (
    PiwfServer,
    held_workflow,
    rss,
    server_settings,
    two_node_workflow,
    wait_entered,
)
from tests.bench.seed import build_template, seed_database

MIB = 1024 * 1024


def run_pollers(
    home: Path, clients: int, processes: int, seconds: float, operation: str
) -> list[float]:
    """``clients`` closed-loop clients spread over ``processes`` poller processes."""
    start_at = time.time() + 1.0 + 0.2 * processes
    share = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    started = [
        spawn_driver(
            [
                sys.executable,
                "-m",
                "tests.bench.pollers",
                json.dumps(
                    {
                        "home": str(home),
                        "clients": count,
                        "seconds": seconds,
                        "startAt": start_at,
                        "operation": operation,
                    }
                ),
            ]
        )
        for count in share
        if count
    ]
    latencies: list[float] = []
    for process in started:
        latencies.extend(collect_json(process, seconds + 120)["latencies"])
    return latencies


def figure_control_plane(context: Context) -> Figure:
    sizes = context.sizes
    clients = sizes.poll_clients
    figure = Figure(
        4,
        f"control plane: server.status while {clients} clients poll (ms)",
        ["server state", "p50 median [min-max]", "p99 median [min-max]", "requests/s"],
    )
    found: dict[str, dict[str, list[float]]] = {}

    def record(name: str, latencies: list[float]) -> None:
        entry = found.setdefault(name, {"p50": [], "p99": [], "rate": []})
        entry["p50"].append(percentile(latencies, 50))
        entry["p99"].append(percentile(latencies, 99))
        entry["rate"].append(len(latencies) / sizes.poll_seconds)

    for _ in range(sizes.reps):
        with scratch_dir() as workdir:
            markers = workdir / "markers"
            markers.mkdir()
            gate = workdir / "gate"
            spin = held_workflow(workdir, markers, gate, spin=True)
            with PiwfServer(workdir / "h") as server, server.client() as client:
                record(
                    "idle, no children",
                    run_pollers(
                        server.home,
                        clients,
                        sizes.poll_processes,
                        sizes.poll_seconds,
                        "server.status",
                    ),
                )
                run_ids = [client.start_run(spin).run_id for _ in range(4)]
                wait_entered(markers, 4)
                record(
                    "4 runner children spinning in compute",
                    run_pollers(
                        server.home,
                        clients,
                        sizes.poll_processes,
                        sizes.poll_seconds,
                        "server.status",
                    ),
                )
                gate.touch()
                for run_id in run_ids:
                    completed(client, run_id)
    for name, entry in found.items():
        low, high, rate = (Spread.of(entry[k]) for k in ("p50", "p99", "rate"))
        figure.add(
            [name, low.show(1000, 2), high.show(1000, 2), f"{rate.median:.0f}"],
            name,
            {"p50S": low.to_json(), "p99S": high.to_json(), "requestsPerSecond": rate.to_json()},
        )
    figure.settings = {
        "piwf": server_settings(4),
        "clients": f"{clients} closed-loop piwf Clients in {sizes.poll_processes} processes, "
        f"{sizes.poll_seconds:g} s per measurement",
        "children": "4 runs whose node burns CPU until released (the 4 execution slots)",
    }
    figure.notes.append(f"machine has {psutil.cpu_count()} logical cores shared by all of this")
    return figure


def _latencies(call: Any, count: int) -> list[float]:
    values = []
    for _ in range(count):
        began = time.perf_counter()
        call()
        values.append(time.perf_counter() - began)
    return values


def figure_growth(context: Context) -> Figure:
    sizes = context.sizes
    figure = Figure(
        6,
        "growth: latency with a small and a large database (ms)",
        [
            "runs in database",
            "operation",
            "p50 median [min-max]",
            "p95 median [min-max]",
            "÷ small",
        ],
    )
    with scratch_dir() as workdir:
        template = build_template(workdir)
        template.gate.touch()
        base: dict[str, float] = {}
        for count in (sizes.growth_small, sizes.growth_large):
            home = workdir / f"g{count}"
            report = seed_database(template, home / "state.sqlite", terminal=count, resumable=0)
            figure.notes.append(
                f"{count:,} runs seeded in {report.seconds:.1f} s "
                f"({report.database_bytes / MIB:.0f} MiB)"
            )
            with PiwfServer(home) as server, server.client() as client:
                began = time.perf_counter()
                verdict = client.state_verify()
                verify_s = time.perf_counter() - began
                if not verdict.valid:
                    raise AssertionError(f"seeded database is not valid: {verdict.violations[:3]}")
                figure.notes.append(f"state.verify of {count:,} runs: valid, {verify_s:.2f} s")
                operations: dict[str, Callable[[], object]] = {
                    "run.list (first page, 50)": client.list_runs,
                    "server.status": client.server_status,
                }
                for name, call in operations.items():
                    call()
                    p50, p95 = [], []
                    for _ in range(sizes.reps):
                        values = _latencies(call, sizes.growth_requests)
                        p50.append(percentile(values, 50))
                        p95.append(percentile(values, 95))
                    low, high = Spread.of(p50), Spread.of(p95)
                    ratio = "1.00" if name not in base else f"{low.median / base[name]:.2f}"
                    base.setdefault(name, low.median)
                    figure.add(
                        [f"{count:,}", name, low.show(1000, 2), high.show(1000, 2), ratio],
                        f"{name} @ {count}",
                        {
                            "runs": count,
                            "p50S": low.to_json(),
                            "p95S": high.to_json(),
                            "requests": sizes.growth_requests,
                        },
                    )
            shutil.rmtree(home, ignore_errors=True)
    figure.settings = {
        "piwf": server_settings(4),
        "client": f"one Client, {sizes.growth_requests} sequential requests per repetition",
        "database": "completed two-node runs cloned from a real run (see tests/bench/seed.py)",
    }
    return figure


class TreeSampler:
    """Samples the server's RSS and each child's peak RSS every ``interval_s``."""

    def __init__(self, server: PiwfServer, interval_s: float = 0.02) -> None:
        self.server = psutil.Process(server.pid)
        self.interval_s = interval_s
        self.server_peak = 0
        self.children: dict[int, tuple[str, int]] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.server_peak = max(self.server_peak, rss(self.server))
            try:
                children = self.server.children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                try:
                    command = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                if "runner" in command:
                    kind = "runner"
                elif "resolver" in command or "spawn_main" in command:
                    kind = "resolver"
                else:
                    continue  # e.g. multiprocessing's resource tracker
                peak = max(self.children.get(child.pid, (kind, 0))[1], rss(child))
                self.children[child.pid] = (kind, peak)

    def __enter__(self) -> TreeSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.thread.join()


def figure_memory(context: Context) -> Figure:
    sizes = context.sizes
    n = sizes.memory_runs
    figure = Figure(
        7,
        f"memory: RSS idle and while {n} two-node runs go through (MiB)",
        ["process", "RSS median [min-max]"],
    )
    values: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        values.setdefault(name, []).append(value / MIB)

    for _ in range(sizes.reps):
        with scratch_dir() as workdir:
            workflow = two_node_workflow(workdir)
            with PiwfServer(workdir / "h") as server, server.client() as client:
                completed(client, client.start_run(workflow, input={"v": 0}).run_id)
                record("piwf server, idle", rss(psutil.Process(server.pid)))
                with TreeSampler(server) as sampler:
                    for run_id in submit_runs(client, workflow, n, sizes.submit_threads):
                        completed(client, run_id)
                record("piwf server, peak under load", sampler.server_peak)
                record("piwf server, idle after the load", rss(psutil.Process(server.pid)))
                for kind in ("runner", "resolver"):
                    peaks = [peak for k, peak in sampler.children.values() if k == kind]
                    if peaks:
                        record(f"piwf {kind} child, peak (median over children)", _median(peaks))
        if "dbos" in context.systems:
            with scratch_dir() as workdir:
                result = peers.run_dbos("throughput", workdir, n=n)
            record("DBOS process (app + queue workers), idle", result["rss_idle"])
            record("DBOS process (app + queue workers), peak under load", result["rss_peak"])
        if "huey" in context.systems:
            with scratch_dir() as workdir:
                result = peers.run_huey("throughput", workdir, n=n)
            record("Huey consumer + 4 worker processes, idle", result["rss_idle"])
            record("Huey consumer + 4 worker processes, peak under load", result["rss_peak"])
    for name, found in values.items():
        spread = Spread.of(found)
        figure.add([name, spread.show(digits=1)], name, {"mib": spread.to_json()})
    figure.settings = {
        "piwf": server_settings(4),
        "load": f"{n} runs submitted by {sizes.submit_threads} threads; RSS sampled every 20 ms",
        **{k: v for k, v in peers.settings().items() if k.lower() in context.systems},
    }
    figure.notes.append("RSS counts shared pages (the interpreter, shared libraries) per process")
    return figure


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (ordered[middle - 1] + ordered[middle]) / 2
