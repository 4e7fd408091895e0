"""What ``piwf state prune`` costs the server's loop in a home with many finished run trees.

``python -m tests.bench.prune_scale [--trees N] [--apply]``

A home with ``N`` completed run trees (cloned from one real run, :mod:`tests.bench.seed`; each
a tree of one run) gets a real server. Then, with a second client calling ``server.status``
every 50 ms throughout:

- ``state prune --dry-run`` through the real CLI, cutoff now (every tree has expired): the
  command's wall time and the longest ``server.status`` beside it;
- in this process, on the same file: how long judging every tree takes
  (:func:`piwf.state.retention.select_trees`) and how many SQL statements it runs;
- with ``--apply``, on a fresh copy of the seeded home: ``state prune --backup DEST --apply``,
  timed the same way.

Nothing here judges the numbers; run it on the code before and after a change and compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from piwf.state import StateDatabase, retention
from tests.bench.common import percentile
from tests.bench.seed import build_template, seed_database
from tests.server.harness import RawClient, ServerFactory, wait_for

POLL_INTERVAL_S = 0.05


class _Poller(threading.Thread):
    """A client calling ``server.status`` every :data:`POLL_INTERVAL_S`, keeping latencies."""

    def __init__(self, socket_path: Path) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(socket_path, "poller")
        self.client.sock.settimeout(600)
        self.samples: list[float] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                began = time.perf_counter()
                response = self.client.request("server.status")
                self.samples.append(time.perf_counter() - began)
                if response.outcome != "accepted":
                    raise SystemExit(f"server.status answered {response.outcome}")
                self.stopped.wait(POLL_INTERVAL_S)  # the polling interval itself
        finally:
            self.client.close()


def _cli(home: Path, *args: str) -> tuple[float, dict[str, Any]]:
    environment = {**os.environ, "PIWF_HOME": str(home)}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "piwf", "state", "prune", *args, "--json"],
        env=environment,
        capture_output=True,
        check=False,
        timeout=600,
    )
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode()[-500:]
        raise SystemExit(f"state prune exited {done.returncode}: {output}")
    return elapsed, json.loads(done.stdout)


def _beside_poller(home: Path, *args: str) -> dict[str, float]:
    """Run one ``state prune`` against a fresh server in ``home`` with the poller beside it."""
    factory = ServerFactory(home)
    try:
        server = factory.start(env={"PIWF_IDLE_EXIT_S": "0"})
        if server.ready.get("ok") is not True:
            raise SystemExit(f"the server did not start: {server.ready}")
        poller = _Poller(server.socket_path)
        poller.start()
        wait_for(lambda: len(poller.samples) >= 5, 30, "the poller's first answers")
        quiet = list(poller.samples)
        began = len(poller.samples)
        try:
            elapsed, report = _cli(home, *args)
        finally:
            poller.stopped.set()
            poller.join(timeout=60)
        during = poller.samples[began:]
        return {
            "command_s": elapsed,
            "trees": float(report["treeCount"]),
            "protected": float(report["protectedCount"]),
            "status_quiet_p50_ms": 1000 * percentile(quiet, 50),
            "status_during_max_ms": 1000 * max(during, default=0.0),
            "status_during_calls": float(len(during)),
        }
    finally:
        factory.cleanup()


def _judge_in_process(database: Path, before: int) -> dict[str, float]:
    """Time :func:`retention.select_trees` on ``database`` and count its statements."""
    statements = [0]
    with StateDatabase(database, mode="read-only") as db, db.read() as tx:
        db.connection.set_trace_callback(lambda _sql: statements.__setitem__(0, statements[0] + 1))
        began = time.perf_counter()
        verdicts = retention.select_trees(tx, tx.now, before)
        elapsed = time.perf_counter() - began
        db.connection.set_trace_callback(None)
    return {
        "select_trees_s": elapsed,
        "trees_judged": float(len(verdicts)),
        "statements": float(statements[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=int, default=2000)
    parser.add_argument("--apply", action="store_true", help="also time an applied prune")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pwp", dir="/tmp") as root:
        (Path(root) / "t").mkdir()
        template = build_template(Path(root) / "t")
        home = Path(root) / "h"
        seeded = seed_database(template, home / "state.sqlite", terminal=options.trees, resumable=0)
        print(f"seeded {seeded.terminal_runs} trees in {seeded.seconds:.1f} s")
        pristine = Path(root) / "pristine.sqlite"
        shutil.copyfile(home / "state.sqlite", pristine)
        before = time.time_ns() // 1_000_000
        _show("dry-run", _beside_poller(home, "--before", str(before), "--dry-run"))
        _show("judging in process", _judge_in_process(home / "state.sqlite", before))
        if options.apply:
            fresh = Path(root) / "h2"
            fresh.mkdir(mode=0o700)
            shutil.copyfile(pristine, fresh / "state.sqlite")
            (fresh / "state.sqlite").chmod(0o600)
            backup = Path(root) / "backup.sqlite"
            _show(
                "apply",
                _beside_poller(fresh, "--before", str(before), "--backup", str(backup), "--apply"),
            )


def _show(name: str, values: dict[str, float]) -> None:
    print(
        f"{name}: " + ", ".join(f"{key} {value:.3f}" for key, value in values.items()), flush=True
    )


if __name__ == "__main__":
    main()
