"""One repetition of a Huey scenario in its own process: start a real consumer
(``huey_consumer -k process -w 4``) on a fresh SQLite file, drive it, stop it.

Run as ``python -m tests.bench.peers.huey_driver SPEC_JSON``; prints one JSON line::

    spec    {"scenario": "throughput" | "latency", "db": PATH, "n": N, "workers": 4,
             "poll_s": 0.1, "result_poll_s": 0.01, "samples": M}
    result  {"seconds": ..., "latencies": [...], "rss_peak": ..., "settings": {...}}

The consumer polls its queue every ``poll_s`` seconds (``-d poll_s -m poll_s``: no backoff);
this driver polls for the final result every ``result_poll_s`` seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

REPOSITORY = Path(__file__).resolve().parents[3]


def consumer_command(spec: dict[str, Any]) -> list[str]:
    """The consumer's argv: ``workers`` worker processes, a fixed polling interval."""
    poll = str(spec["poll_s"])
    return [
        sys.executable,
        "-m",
        "huey.bin.huey_consumer",
        "tests.bench.peers.huey_app.huey",
        "--worker-type=process",
        f"--workers={int(spec['workers'])}",
        f"--delay={poll}",
        f"--max-delay={poll}",
        "--backoff=1.0",
        "--no-periodic",
        "--quiet",
    ]


def tree_rss(pid: int) -> int:
    """RSS of a process and its children, 0 for processes that are gone."""
    total = 0
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


class TreeSampler:
    """Peak RSS of a process tree, sampled every ``interval_s`` on a daemon thread."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.peak = max(self.peak, tree_rss(self.pid))

    def __enter__(self) -> TreeSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.thread.join()


def wait_result(result: Any, poll_s: float, timeout_s: float = 120.0) -> Any:
    """Poll a Huey result every ``poll_s`` seconds until it is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = result.get(blocking=False)
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("huey result did not arrive")
        time.sleep(poll_s)  # a bounded poll interval of the benchmark driver


def final(group: Any) -> Any:
    """The result handle of a pipeline's last task (indexing a group would block on it)."""
    return list(group)[-1]


def main() -> int:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    os.environ["PIWF_BENCH_HUEY_DB"] = spec["db"]
    from tests.bench.peers.huey_app import first_task, huey, second_task

    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    consumer = subprocess.Popen(
        consumer_command(spec),
        cwd=REPOSITORY,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    poll_s = float(spec["result_poll_s"])
    try:
        # Warm-up: the consumer answers once its workers run (and creates nothing else).
        began = time.perf_counter()
        assert wait_result(final(huey.enqueue(first_task.s(0).then(second_task))), poll_s) == 2
        warmup_s = time.perf_counter() - began
        rss_idle = tree_rss(consumer.pid)
        result: dict[str, Any] = {"warmup_s": warmup_s, "rss_idle": rss_idle}
        if spec["scenario"] == "throughput":
            n = int(spec["n"])
            with TreeSampler(consumer.pid) as sampler:
                began = time.perf_counter()
                groups = [huey.enqueue(first_task.s(i).then(second_task)) for i in range(n)]
                values = [wait_result(final(group), poll_s) for group in groups]
                result["seconds"] = time.perf_counter() - began
            assert values == [(i + 1) * 2 for i in range(n)]
            result["runs"] = n
            result["rss_peak"] = sampler.peak
        elif spec["scenario"] == "latency":
            latencies = []
            for i in range(int(spec["samples"])):
                began = time.perf_counter()
                group = huey.enqueue(first_task.s(i).then(second_task))
                assert wait_result(final(group), poll_s) == (i + 1) * 2
                latencies.append(time.perf_counter() - began)
            result["latencies"] = latencies
        else:
            raise ValueError(f"unknown scenario {spec['scenario']!r}")
    finally:
        try:
            os.killpg(consumer.pid, signal.SIGINT)
            consumer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(consumer.pid, signal.SIGKILL)
            consumer.wait(timeout=10)
        except ProcessLookupError:
            pass
    result["settings"] = {
        "version": metadata.version("huey"),
        "journal_mode": "wal",
        "synchronous": "FULL (fsync=True)",
        "consumer": " ".join(consumer_command(spec)[3:]),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
