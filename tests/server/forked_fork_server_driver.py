"""Driver of tests/server/test_forked_fork_server.py: a stand-in for ``piwf server run`` that
holds what a server could hold at the fork (a marker module, an open and mapped file, a Python
SIGTERM handler), starts its fork server and resource tracker within ``fork_helpers_from_here``,
starts one child through the fork server, and prints one JSON document of what the child holds
and which processes the helpers are.

Run as ``python -m tests.server.forked_fork_server_driver HELD_FILE`` from the repository."""

from __future__ import annotations

import json
import mmap
import multiprocessing
import signal
import sys
import types
from multiprocessing import forkserver, resource_tracker
from multiprocessing.connection import Connection

from piwf.server.children.forked_fork_server import fork_helpers_from_here


def report(channel: Connection) -> None:
    """The child: which of the driver's modules it sees."""
    channel.send_bytes(
        json.dumps(
            {
                "marker": "forked_fork_server_marker" in sys.modules,
                "serverModules": sorted(
                    name for name in sys.modules if name.startswith(("piwf.server", "piwf.cli"))
                ),
            }
        ).encode()
    )


def main() -> None:
    held = open(sys.argv[1], "w+b")  # noqa: SIM115 - held open across the fork on purpose
    held.write(b"held")
    held.flush()
    # A mapping outlives the descriptors a forked helper closes: it shows the helper is a fork.
    mapped = mmap.mmap(held.fileno(), 0)
    sys.modules["forked_fork_server_marker"] = types.ModuleType("forked_fork_server_marker")
    signal.signal(signal.SIGTERM, lambda *_: None)
    forkserver.set_forkserver_preload(["piwf.runner.children_session"])
    with fork_helpers_from_here():
        forkserver.ensure_running()
    context = multiprocessing.get_context("forkserver")
    ours, theirs = context.Pipe()
    child = context.Process(target=report, args=(theirs,))
    child.start()
    theirs.close()
    seen = json.loads(ours.recv_bytes())
    child.join(30)
    pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    tracker = resource_tracker._resource_tracker
    found = {
        "forkServer": pid,
        "tracker": tracker._pid,  # type: ignore[attr-defined]
        "trackerAnswers": tracker._check_alive(),  # type: ignore[attr-defined]
        "driver": multiprocessing.current_process().pid,
    }
    print(json.dumps({**found, **seen}))
    sys.stdout.flush()
    sys.stdin.read()  # hold the fork server until the test has looked at it
    mapped.close()
    held.close()


if __name__ == "__main__":
    main()
