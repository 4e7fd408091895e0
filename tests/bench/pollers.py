"""Closed-loop clients of one piwf server, run as a subprocess by figures 4 and 6.

``python -m tests.bench.pollers SPEC_JSON`` with ``{"home", "clients", "seconds", "startAt",
"operation"}``: each of ``clients`` threads connects its own :class:`piwf.client.Client`, waits
for the shared wall-clock ``startAt`` (so that every poller process starts together), then sends
``operation`` (``server.status`` or ``run.list``) back to back for ``seconds`` and records each
round trip. Prints ``{"latencies": [...]}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from piwf.client import Client


def poll_loop(client: Client, operation: str, start_at: float, seconds: float) -> list[float]:
    call = client.server_status if operation == "server.status" else client.list_runs
    call()  # connected and warm before the clock starts
    while time.time() < start_at:
        time.sleep(min(0.005, max(start_at - time.time(), 0)))  # bounded wait for the start
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    while True:
        began = time.perf_counter()
        if began >= stop:
            return latencies
        call()
        latencies.append(time.perf_counter() - began)


def main() -> int:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    results: list[list[float]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            with Client(Path(spec["home"]), autostart=False, request_timeout_s=60) as client:
                found = poll_loop(client, spec["operation"], spec["startAt"], spec["seconds"])
            with lock:
                results.append(found)
        except BaseException as error:  # reported, and the process fails
            with lock:
                errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(int(spec["clients"]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        print(f"poller failed: {errors[0]!r}", file=sys.stderr)
        return 1
    print(json.dumps({"latencies": [value for found in results for value in found]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
