"""What starting one child costs, per start method, measured on the supervisor itself.

``python -m tests.bench.child_start [--runs N]`` drives a :class:`Supervisor` on its own loop in
this process (no server, no database) and starts N resolver children per start method, each
asked to resolve ``fixtures/workflows/hello.py``. It prints the median of::

    start()              how long Supervisor.start blocks its loop (pipes, Process.start:
                         with forkserver, the request to the fork server, not its fork)
    start -> started     until on_started ran (the pid and start identity known, from the
                         loop while it serves)
    start -> reply       until the resolver's answer is read: the child's start (fork or a
                         fresh interpreter), its first act, loading and compiling the workflow
    reply -> exit seen   until the loop has finished the child (its sentinel, or SIGCHLD)

Not a figure of docs/PERFORMANCE.md: a tool for choosing and explaining the start method.
"""

from __future__ import annotations

import argparse
import selectors
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from piwf import canonical
from piwf.processes import ChildKind
from piwf.server.children.start_methods import StartMethod
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.loop import EventLoop

HELLO = Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py"
_DEADLINE_S = 60.0


def measure(method: StartMethod, runs: int, logs: Path) -> dict[str, list[float]]:
    """Start ``runs`` resolvers (plus one not counted, which warms the helpers) with ``method``."""
    loop = EventLoop()
    supervisor = Supervisor(loop, logs / method.value, method=method)
    supervisor.prepare()
    phases: dict[str, list[float]] = {
        "start()": [],
        "start -> started": [],
        "start -> reply": [],
        "reply -> exit": [],
    }
    request = canonical.encode({"workflow": str(HELLO), "projectPath": None, "stateHome": "/"})
    try:
        for index in range(runs + 1):
            ended: list[float] = []
            reported: list[float] = []

            def exited(_handle: ChildHandle, ended: list[float] = ended) -> None:
                ended.append(time.perf_counter())

            def started(_handle: ChildHandle, reported: list[float] = reported) -> None:
                reported.append(time.perf_counter())

            began = time.perf_counter()
            handle = supervisor.start(
                ChildSpec(f"bench-{index}", ChildKind.RESOLVER, None, exited, started)
            )
            returned = time.perf_counter()
            replies: list[bytes] = []
            loop.selector.register(
                handle.channel.fd,
                selectors.EVENT_READ,
                lambda _mask, h=handle, r=replies: r.extend(h.channel.read_messages()),
            )
            handle.channel.send(request)
            replied = _turn_until(loop, lambda r=replies: r)
            if not handle.exited:  # (its end unregisters it when the exit came in that turn)
                loop.selector.unregister(handle.channel.fd)
            _turn_until(loop, lambda e=ended: e)
            if index:
                phases["start()"].append(returned - began)
                phases["start -> started"].append(reported[0] - began)
                phases["start -> reply"].append(replied - began)
                phases["reply -> exit"].append(ended[0] - replied)
    finally:
        supervisor.stop_all()
        loop.close()
    return phases


def _turn_until(loop: EventLoop, condition: Callable[[], object]) -> float:
    """Turn ``loop`` until ``condition()`` is truthy; return when it was (perf counter)."""
    deadline = time.monotonic() + _DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("a child did not answer in time")
        loop.run_once()
    return time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.child_start")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="pwcs") as scratch:
        for method in StartMethod:
            phases = measure(method, args.runs, Path(scratch))
            print(f"{method.value}: median over {args.runs} resolver children (ms)")
            for name, values in phases.items():
                print(f"  {name.ljust(16)} {statistics.median(values) * 1000:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
