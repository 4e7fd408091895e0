"""Where the time of one piwf run goes, read from the server's own timestamps.

``python -m tests.bench.timeline [--runs N] [--nodes K] [--env NAME=VALUE ...]`` starts a server
(on piwf's defaults, plus each ``--env``, e.g. ``PIWF_START_METHOD=spawn``), runs N sequential
runs of a K-node compute chain (K=2: the two-node workflow of figures 1 and 2) and prints the
median of each phase, taken from the rows the server committed (epoch milliseconds) plus the
client's own clock for the two ends::

    request sent ─▶ run.start answered        client: resolver child + run commit
    runs.created_at ─▶ run_runners.started_at  scheduling: claim + launch record
    started_at ─▶ ready_at                     runner child: interpreter, imports, sources
    ready_at ─▶ first node started              command sent, begin run
    first node started ─▶ last node finished   the nodes (K of them)
    last node finished ─▶ runs.finished_at     finish transaction
    finished_at ─▶ run.wait answered           client: the wait's answer
    finished_at ─▶ runner row finished_at      child exit and reaping (not on the client path)

Not a figure: a tool for the analysis in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from piwf.state import StateDatabase
from tests.bench.common import poll, scratch_dir
from tests.bench.fig_runs import completed
from tests.bench.piwf_side import PiwfServer, chain_workflow

_PHASES = """
SELECT r.created_at, r.finished_at, u.started_at, u.ready_at, u.finished_at,
       (SELECT min(started_at) FROM node_attempts a WHERE a.run_id = r.run_id),
       (SELECT max(finished_at) FROM node_attempts a WHERE a.run_id = r.run_id)
FROM runs r JOIN run_runners u ON u.run_id = r.run_id
WHERE r.run_id = ?
"""


def _live_runners(home: Path) -> int:
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        return int(
            tx.scalar(
                "SELECT count(*) FROM run_runners WHERE status IN ('starting', 'ready', 'running')"
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.timeline")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="a server variable"
    )
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    phases: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        phases.setdefault(name, []).append(value)

    with scratch_dir() as workdir:
        workflow = chain_workflow(workdir, args.nodes)
        with PiwfServer(workdir / "h", env=env) as server, server.client() as client:
            completed(client, client.start_run(workflow).run_id)
            measured: list[tuple[str, float, float, float]] = []
            for _ in range(args.runs):
                sent = time.time() * 1000
                run_id = client.start_run(workflow).run_id
                answered = time.time() * 1000
                completed(client, run_id)
                measured.append((run_id, sent, answered, time.time() * 1000))
            poll(lambda: not _live_runners(server.home), 60, "the last runner's exit")
            with StateDatabase(server.home / "state.sqlite", mode="read-only") as db:
                with db.read() as tx:
                    for run_id, sent, answered, waited in measured:
                        row = tx.one(_PHASES, (run_id,))
                        assert row is not None
                        created, finished, launched, ready, exited, first, last = row
                        add("request -> run.start answered (resolver + commit)", answered - sent)
                        add("created -> runner launched (scheduling)", launched - created)
                        add("launched -> ready (child start, imports, sources)", ready - launched)
                        add("ready -> first node started", first - ready)
                        add(f"{args.nodes} nodes (first start -> last finish)", last - first)
                        add("last node -> run finished (commit)", finished - last)
                        add("run finished -> run.wait answered", waited - finished)
                        add("run finished -> runner exit recorded", exited - finished)
                        add("request -> run.wait answered (total)", waited - sent)
    width = max(len(name) for name in phases)
    settings = "".join(f" {name}={value}" for name, value in env.items())
    print(f"median over {args.runs} runs of a {args.nodes}-node chain (ms){settings}:")
    for name, values in phases.items():
        print(f"  {name.ljust(width)}  {statistics.median(values):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
