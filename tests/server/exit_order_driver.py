"""``python -m tests.server.exit_order_driver METHOD LOG_DIR``: one supervisor on its own loop
starts one resolver child and lets it answer and exit while the loop does not turn (its answer
is watched only then), then turns the loop until the exit is reported. It prints how many of the
child's messages had been delivered by then, and its exit code, as one JSON line (used by
``test_start_methods``)."""

from __future__ import annotations

import json
import select
import sys
import time
from pathlib import Path

import psutil

from piwf import canonical
from piwf.processes import ChildKind
from piwf.server.children.link import ChildLink
from piwf.server.children.start_methods import StartMethod
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.loop import EventLoop

HELLO = Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py"
DEADLINE_S = 60.0


def ended(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie of this process, or reaped by its fork server)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def pid_of(handle: ChildHandle) -> int:
    """The child's pid without turning the loop: a forked child's comes on its sentinel, and
    reading the process's exit code reads it (the supervisor notices at its next turn)."""
    if handle.process.pid is None:
        select.select([handle.process.sentinel], [], [], DEADLINE_S)
        _ = handle.process.exitcode
    pid = handle.process.pid
    assert pid is not None
    return pid


def main(method: str, log_dir: str) -> int:
    loop = EventLoop()
    loop.install_signal_handlers()  # as the server does: signals wake its select
    supervisor = Supervisor(loop, Path(log_dir), method=StartMethod(method))
    supervisor.prepare()
    delivered: list[bytes] = []
    report: dict[str, int | None] = {}

    def exited(handle: ChildHandle) -> None:
        report.update(messagesBeforeExit=len(delivered), exitCode=handle.returncode)

    handle = supervisor.start(ChildSpec("order", ChildKind.RESOLVER, None, exited))
    handle.channel.send(
        canonical.encode({"workflow": str(HELLO), "projectPath": None, "stateHome": "/"})
    )
    deadline = time.monotonic() + DEADLINE_S
    pid = pid_of(handle)
    while not ended(pid) and time.monotonic() < deadline:
        select.select([], [], [], 0.01)  # the loop must not turn while the child ends
    # Its status is in the sentinel (and, spawned, its SIGCHLD has been recorded) before its
    # answer is watched at all, so the selector reports the answer last.
    select.select([handle.process.sentinel], [], [], DEADLINE_S)
    ChildLink(loop, handle, delivered.extend, lambda _why: None).watch()
    while not report and time.monotonic() < deadline:
        loop.run_once()
    supervisor.stop_all()
    loop.close()
    print(json.dumps(report, sort_keys=True))
    return 0 if report else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
