"""One repetition of a DBOS scenario in its own process (DBOS is a library: its workers are
threads of the application process, so each repetition is a fresh process with a fresh SQLite
system database, launched and destroyed once).

Run as ``python -m tests.bench.peers.dbos_driver SPEC_JSON``; prints one JSON line::

    spec    {"scenario": "throughput" | "latency" | "chain", "db": PATH, "n": N,
             "workers": 4, "poll_s": 0.1, "result_poll_s": 0.01, "samples": M}
    result  {"seconds": ..., "latencies": [...], "rss": {...}, "settings": {...}}

"Two-node workflow" for DBOS: one ``@DBOS.workflow`` that calls two ``@DBOS.step`` functions;
each step's output is checkpointed in the system database before the next one starts.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
import threading
import time
from importlib import metadata
from typing import Any

import psutil
from dbos import DBOS, DBOSConfig, Queue


@DBOS.step()
def first_step(value: int) -> int:
    return value + 1


@DBOS.step()
def second_step(value: int) -> int:
    return value * 2


@DBOS.workflow()
def two_step_workflow(value: int) -> int:
    return second_step(first_step(value))


@DBOS.step()
def chain_step(value: int) -> int:
    return value + 1


@DBOS.workflow()
def chain_workflow(steps: int) -> int:
    value = 0
    for _ in range(steps):
        value = chain_step(value)
    return value


class RssSampler:
    """Peak RSS of this process, sampled every ``interval_s`` on a daemon thread."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.process = psutil.Process()
        self.interval_s = interval_s
        self.peak = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def warm_up(queue: Queue, spec: dict[str, Any]) -> None:
    """One queued and one direct workflow before anything is timed."""
    handle = queue.enqueue(two_step_workflow, 0)
    assert handle.get_result(polling_interval_sec=spec["result_poll_s"]) == 2
    assert DBOS.start_workflow(two_step_workflow, 0).get_result() == 2


def throughput(queue: Queue, spec: dict[str, Any]) -> dict[str, Any]:
    n = int(spec["n"])
    with RssSampler() as sampler:
        began = time.perf_counter()
        handles = [queue.enqueue(two_step_workflow, i) for i in range(n)]
        results = [h.get_result(polling_interval_sec=spec["result_poll_s"]) for h in handles]
        seconds = time.perf_counter() - began
    assert results == [(i + 1) * 2 for i in range(n)]
    return {"seconds": seconds, "runs": n, "rss_peak": sampler.peak}


def latency(queue: Queue, spec: dict[str, Any]) -> dict[str, Any]:
    queued: list[float] = []
    direct: list[float] = []
    for i in range(int(spec["samples"])):
        began = time.perf_counter()
        handle = queue.enqueue(two_step_workflow, i)
        assert handle.get_result(polling_interval_sec=spec["result_poll_s"]) == (i + 1) * 2
        queued.append(time.perf_counter() - began)
        began = time.perf_counter()
        assert DBOS.start_workflow(two_step_workflow, i).get_result() == (i + 1) * 2
        direct.append(time.perf_counter() - began)
    return {"queued": queued, "direct": direct}


def chain(spec: dict[str, Any]) -> dict[str, Any]:
    steps = int(spec["n"])
    timings: dict[str, list[float]] = {"two": [], "chain": []}
    for _ in range(int(spec["samples"])):
        for key, count in (("two", 2), ("chain", steps)):
            began = time.perf_counter()
            assert DBOS.start_workflow(chain_workflow, count).get_result() == count
            timings[key].append(time.perf_counter() - began)
    return timings


def main() -> int:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {
        "name": "piwf-bench",
        "system_database_url": f"sqlite:///{spec['db']}",
        "log_level": "WARNING",
    }
    idle_before = psutil.Process().memory_info().rss
    DBOS(config=config)
    began = time.perf_counter()
    DBOS.launch()
    launch_s = time.perf_counter() - began
    try:
        queue = DBOS.register_queue(
            "bench", worker_concurrency=int(spec["workers"]), polling_interval_sec=spec["poll_s"]
        )
        warm_up(queue, spec)
        idle = psutil.Process().memory_info().rss
        scenario = spec["scenario"]
        if scenario == "throughput":
            result = throughput(queue, spec)
        elif scenario == "latency":
            result = latency(queue, spec)
        elif scenario == "chain":
            result = chain(spec)
        else:
            raise ValueError(f"unknown scenario {scenario!r}")
    finally:
        DBOS.destroy(destroy_registry=False)
    with sqlite3.connect(spec["db"]) as connection:
        journal_mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
    result["launch_s"] = launch_s
    result["rss_idle"] = idle
    result["rss_before_launch"] = idle_before
    result["settings"] = {
        "version": metadata.version("dbos"),
        "journal_mode": journal_mode,
        "synchronous": "FULL (SQLite default; DBOS sets no synchronous pragma)",
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
