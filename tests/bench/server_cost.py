"""What a node boundary and a whole run cost the piwf server, for comparing two commits.

``python -m tests.bench.server_cost [--runs N] [--chain K]`` starts a server on piwf's defaults
with 4 workers and prints, from one process:

- the marginal wall time per node: a K-node compute chain against a 20-node one (the fastest
  of three runs of each), and the server's CPU per node over the three long chains;
- throughput: N two-node runs submitted at once (as figure 1's submit loop), runs/s and the
  server's CPU per run.

The server's CPU is its own ``utime + stime`` (psutil); the children's is what the fork server
has reaped (its ``children_user + children_system``: every runner and resolver it forked and
waited for, so only children that have ended count). Run it in two
checkouts one after the other, and again, to compare them: figures minutes apart on the same
machine differ more than most changes do. Not a figure: a tool for docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

from tests.bench.common import poll, scratch_dir
from tests.bench.fig_runs import completed
from tests.bench.piwf_side import PiwfServer, chain_workflow, two_node_workflow

_SHORT_CHAIN = 20
_REPEATS = 3


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _fork_server(server: psutil.Process) -> psutil.Process:
    """The server's fork server (its command line names ``multiprocessing.forkserver``)."""
    for child in server.children():
        if any("multiprocessing.forkserver" in part for part in child.cmdline()):
            return child
    raise SystemExit("the server has no fork server: run this with the forkserver start method")


def _reaped_cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.children_user + times.children_system)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.server_cost")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--chain", type=int, default=200)
    args = parser.parse_args(argv)
    with scratch_dir() as workdir:
        two = two_node_workflow(workdir)
        short, long = chain_workflow(workdir, _SHORT_CHAIN), chain_workflow(workdir, args.chain)
        with PiwfServer(workdir / "h", max_workers=4) as server, server.client() as client:
            process = psutil.Process(server.pid)

            def one_run(workflow: Path) -> float:
                began = time.perf_counter()
                completed(client, client.start_run(workflow, input={"v": 0}).run_id)
                return time.perf_counter() - began

            one_run(short), one_run(long)  # warm-up: the definition cache, a spare runner
            short_s = min(one_run(short) for _ in range(_REPEATS))
            before = _cpu_s(process)
            long_s = min(one_run(long) for _ in range(_REPEATS))
            chain_cpu_s = _cpu_s(process) - before
            nodes = args.chain - _SHORT_CHAIN
            one_run(two)
            fork_server = _fork_server(process)
            before, began = _cpu_s(process), time.perf_counter()
            children_before = _reaped_cpu_s(fork_server)
            run_ids = [client.start_run(two, input={"v": i}).run_id for i in range(args.runs)]
            for run_id in run_ids:
                completed(client, run_id)
            elapsed = time.perf_counter() - began
            runs_cpu_s = _cpu_s(process) - before
            # The last runners exit after their runs complete: wait until every one is reaped
            # (what stays is at most one spare runner per slot).
            poll(lambda: len(fork_server.children()) <= 4, 10, "the last runners' exits")
            children_cpu_s = _reaped_cpu_s(fork_server) - children_before
    per_node_ms = 1000 * (long_s - short_s) / nodes
    print(f"per node ({args.chain}- against {_SHORT_CHAIN}-node chain): {per_node_ms:.3f} ms")
    print(f"server CPU per node: {1000 * chain_cpu_s / (_REPEATS * args.chain):.3f} ms")
    print(f"throughput ({args.runs} two-node runs, 4 workers): {args.runs / elapsed:.1f} runs/s")
    print(f"server CPU per run: {1000 * runs_cpu_s / args.runs:.2f} ms")
    print(f"children's CPU per run (reaped): {1000 * children_cpu_s / args.runs:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
