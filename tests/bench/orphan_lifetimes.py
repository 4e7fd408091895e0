"""How long a SIGKILLed server's children outlive it: one figure per start path and node kind.

For each start path (forked: ``PIWF_START_METHOD=forkserver``, or the zygote of older
versions; spawned: ``PIWF_START_METHOD=spawn``, or ``PIWF_ZYGOTE=0``) and each node kind
(``sleep``: blocked in ``time.sleep``; ``busy``: a pure Python loop), it starts a real server in
a temporary home, starts a one-node run, waits until the node runs, takes the server's whole
process tree with psutil, SIGKILLs the server and measures how long until every process of that
tree is gone (ended or a zombie), up to a cap; a tree still alive at the cap is killed and
reported as ``>cap``. It prints one Markdown table. It uses only what every piwf version has
(``piwf server run``, the client protocol, the test harness), so it measures a checkout of an
older commit too::

    python -m tests.bench.orphan_lifetimes [--repeat 3] [--cap 40]
    cd OLD_CHECKOUT && PYTHONPATH=. python NEW_CHECKOUT/tests/bench/orphan_lifetimes.py

Timing here is a figure, never a test assertion (``tests/server/test_orphans.py`` asserts the
bound itself).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

import piwf
from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for

FAST = {"PIWF_IDLE_EXIT_S": "0", "PIWF_CLAIM_POLL_S": "0.05", "PIWF_RUN_RENEW_S": "0.2"}
HELLO = Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py"
NODES = {
    "sleep": "time.sleep(LIFETIME)",
    "busy": "deadline = time.monotonic() + LIFETIME\nwhile time.monotonic() < deadline:\n    pass",
}
#: Each version reads the variable it knows and ignores the other.
PATHS = {
    "forked": {"PIWF_START_METHOD": "forkserver", "PIWF_ZYGOTE": "1"},
    "spawned": {"PIWF_START_METHOD": "spawn", "PIWF_ZYGOTE": "0"},
}


def workflow_source(kind: str, entered: Path, lifetime_s: float) -> str:
    body = NODES[kind].replace("LIFETIME", repr(lifetime_s))
    return (
        textwrap.dedent(
            f"""
        import pathlib, time
        from piwf.workflow import compute, define_workflow

        def hold(ctx):
            pathlib.Path({str(entered)!r}).touch()
        """
        )
        + textwrap.indent(body, "    ")
        + textwrap.dedent(
            """
            return 1

        workflow = define_workflow(
            name="held", start_at="hold", nodes={"hold": compute(hold)}, edges=[]
        )
        """
        )
    )


def start_run(server: ServerProcess, workflow: Path, key: str) -> None:
    with raw_client(server, f"bench-{key}") as client:
        response = client.request("run.start", {"workflow": str(workflow), "input": {}}, key=key)
        assert response.outcome == "accepted", response


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def one_lifetime(path: str, kind: str, cap_s: float) -> float | None:
    """Seconds from the server's SIGKILL until its tree is gone; None past ``cap_s``."""
    root = Path(tempfile.mkdtemp(prefix="pwol", dir="/tmp"))
    factory = ServerFactory(root / "h")
    tree: list[psutil.Process] = []
    try:
        server = factory.start(env={**FAST, **PATHS[path]})
        assert server.ready.get("ok") is True, server.ready
        if path == "forked":
            # A zygote (older versions) comes up with the first run; a fork server at start.
            start_run(server, HELLO, "warm")
            wait_for(lambda: _fork_helper(server), timeout_s=30, what="the fork helper")
        entered = root / "entered"
        workflow = root / "held.py"
        workflow.write_text(workflow_source(kind, entered, cap_s + 20))
        start_run(server, workflow, "held")
        wait_for(entered.exists, timeout_s=30, what="the node to run")
        tree = psutil.Process(server.process.pid).children(recursive=True)
        killed_at = time.monotonic()
        server.process.kill()
        deadline = killed_at + cap_s
        while time.monotonic() < deadline:
            if all(gone(process) for process in tree):
                return time.monotonic() - killed_at
            time.sleep(0.005)  # a bounded poll interval of the measurement
        return None
    finally:
        for process in tree:
            with contextlib.suppress(psutil.Error):
                process.kill()
        factory.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def _fork_helper(server: ServerProcess) -> bool:
    """Whether the server can fork children: its fork server runs, or (older versions) its
    zygote reported ready."""
    log = server.home / "server" / "server.log"
    if log.exists() and "zygote ready" in log.read_text():
        return True
    for child in psutil.Process(server.process.pid).children():
        with contextlib.suppress(psutil.Error):
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                return True
    return False


def describe(samples: list[float | None], cap_s: float) -> str:
    measured = [sample for sample in samples if sample is not None]
    capped = len(samples) - len(measured)
    if not measured:
        return f">{cap_s:g} s (all {capped})"
    text = (
        f"median {statistics.median(measured):.3f} s"
        f" (min {min(measured):.3f}, max {max(measured):.3f}, n={len(measured)})"
    )
    return text + (f"; {capped} >{cap_s:g} s" if capped else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.orphan_lifetimes")
    parser.add_argument("--repeat", type=int, default=3, help="kills per case")
    parser.add_argument("--cap", type=float, default=40.0, help="seconds to wait at most")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    # Children start in other directories: a relative PYTHONPATH would load another piwf there.
    search = os.environ.get("PYTHONPATH")
    if search:
        absolute = (str(Path(entry).resolve()) for entry in search.split(os.pathsep) if entry)
        os.environ["PYTHONPATH"] = os.pathsep.join(absolute)
    print(f"piwf {piwf.__version__} from {Path(piwf.__file__).resolve().parent.parent.name}/")
    print("\n| start path | node | children outlived the SIGKILLed server by |")
    print("| --- | --- | --- |")
    for path in PATHS:
        for kind in NODES:
            samples = [one_lifetime(path, kind, args.cap) for _ in range(args.repeat)]
            print(f"| {path} | {kind} | {describe(samples, args.cap)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
