"""``python -m tests.server.start_driver SCENARIO METHOD LOG_DIR``: one supervisor on its own loop,
starting resolver children while their fork server is stopped or killed, as ``test_start_methods``
needs to see it from inside the server. It prints what it saw as one JSON line.

Scenarios (``stopped`` and ``killed`` need ``forkserver``)::

    stopped   the fork server is stopped (SIGSTOP) while a child is started and the loop turns;
              then it resumes and the child answers its request
    killed    the fork server is stopped, a child is asked for, the fork server is killed; then
              the next child is started
    stop      a child is stopped (``stop``) before its pid is known (with ``forkserver``: its
              fork server stopped meanwhile), then the fork server resumes
    kill      the same with ``kill``

Every wait turns the loop until a condition holds, under one deadline.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from piwf import canonical
from piwf.processes import ChildKind, boot_id, start_identity
from piwf.server.children.link import ChildLink
from piwf.server.children.start_methods import StartMethod
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.loop import EventLoop

HELLO = Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py"
DEADLINE_S = 60.0
_FORKSERVER = "from multiprocessing.forkserver import main"
_REQUEST = canonical.encode({"workflow": str(HELLO), "projectPath": None, "stateHome": "/"})


class Driver:
    """The supervisor, its loop, and what its children's callbacks saw."""

    def __init__(self, method: StartMethod, log_dir: Path) -> None:
        #: When this driver began (wall clock, as create times are).
        self.born = time.time() - 1
        self.loop = EventLoop()
        self.loop.install_signal_handlers()  # as the server does: signals wake its select
        self.supervisor = Supervisor(self.loop, log_dir, method=method)
        self.supervisor.prepare()
        self.deadline = time.monotonic() + DEADLINE_S
        #: ``started:NAME`` / ``exit:NAME``, in the order the callbacks ran.
        self.events: list[str] = []
        #: What each child looked like when its start was reported.
        self.seen: dict[str, dict[str, Any]] = {}
        self.replies: dict[str, list[bytes]] = {}
        self.processes: dict[str, psutil.Process | None] = {}

    def start(self, name: str, *, ask: bool = True) -> ChildHandle:
        """Start a resolver child; ``ask`` sends its request at once (before its pid)."""
        handle = self.supervisor.start(
            ChildSpec(name, ChildKind.RESOLVER, None, self._exited, self._started)
        )
        if ask:
            replies = self.replies.setdefault(name, [])
            ChildLink(self.loop, handle, replies.extend, lambda _why: None).watch()
            handle.channel.send(_REQUEST)
        return handle

    def turn_until(self, condition: Callable[[], object], what: str) -> None:
        while not condition():
            if time.monotonic() > self.deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            self.loop.run_once()

    def fork_server(self) -> psutil.Process:
        """This process's live fork server (waits for it to be running)."""
        found: list[psutil.Process] = []

        def look() -> bool:
            found[:] = [
                child
                for child in psutil.Process().children()
                if child.status() != psutil.STATUS_ZOMBIE
                and _FORKSERVER in " ".join(child.cmdline())
            ]
            return len(found) == 1

        self.turn_until(look, "the fork server")
        return found[0]

    def close(self) -> None:
        self.supervisor.stop_all()
        self.loop.close()

    def _started(self, handle: ChildHandle) -> None:
        self.events.append(f"started:{handle.name}")
        assert handle.pid is not None
        try:
            process: psutil.Process | None = psutil.Process(handle.pid)
            parent = process.ppid()
        except psutil.NoSuchProcess:
            # Killed and reaped in the loop turn before its start was reported (a stop or kill
            # asked for at once): it has ended, and the supervisor then keeps no identity.
            process, parent = None, None
        self.processes[handle.name] = process
        self.seen[handle.name] = {
            "identityIsTheChilds": self._identity_is_the_childs(handle, process),
            "parent": parent,
        }

    def _identity_is_the_childs(self, handle: ChildHandle, process: psutil.Process | None) -> bool:
        """Whether the identity the supervisor took is the child's.

        A child killed at once may be reaped before (or while) this looks: then the identity
        is checked against the create time psutil read when it found the process, or, when the
        process was gone already, for its pid, its boot and a create time within this driver's
        life (the supervisor may have taken it just before the kill, or dropped it)."""
        assert handle.pid is not None
        if process is not None:
            identity = start_identity(handle.pid)
            if identity is None:  # reaped since psutil found it
                identity = f"{handle.pid}:{process.create_time():.3f}:{boot_id()}"
            return handle.identity == identity
        if handle.identity is None:
            return True
        pid, created, boot = handle.identity.split(":", 2)
        return (
            pid == str(handle.pid)
            and boot == boot_id()
            and self.born <= float(created) <= time.time() + 1
        )

    def _exited(self, handle: ChildHandle) -> None:
        self.events.append(f"exit:{handle.name}")
        self.seen.setdefault(handle.name, {}).update(
            exitCode=handle.returncode,
            startFailure=handle.start_failure,
            registered=handle.name in self.supervisor.children,
            answered=bool(self.replies.get(handle.name)),
        )


@contextmanager
def stopped(process: psutil.Process | None) -> Iterator[None]:
    """``process`` stopped (SIGSTOP) inside the block, resumed after it (None: nothing)."""
    if process is None:
        yield
        return
    process.suspend()
    try:
        yield
    finally:
        if process.is_running():
            process.resume()


def ended(process: psutil.Process | None) -> bool:
    if process is None:  # gone before its start was reported
        return True
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def scenario_stopped(driver: Driver, report: dict[str, Any]) -> None:
    fork_server = driver.fork_server()
    with stopped(fork_server):
        handle = driver.start("a")
        report["pidAtReturn"] = handle.pid
        ticks: list[int] = []
        driver.loop.call_later(0.05, lambda: ticks.append(1))
        driver.turn_until(lambda: ticks, "the loop to run a timer while the fork server stops")
        report["pidWhileStopped"] = handle.pid
        report["eventsWhileStopped"] = list(driver.events)
    driver.turn_until(lambda: "exit:a" in driver.events, "the child to answer and exit")
    report["forkServer"] = fork_server.pid


def scenario_killed(driver: Driver, report: dict[str, Any]) -> None:
    fork_server = driver.fork_server()
    with stopped(fork_server):
        driver.start("a")
        fork_server.kill()
    driver.turn_until(lambda: "exit:a" in driver.events, "the failed start to be reported")
    report["childrenAfterFailure"] = sorted(driver.supervisor.children)
    driver.start("b")
    driver.turn_until(lambda: "exit:b" in driver.events, "the next child to answer and exit")
    report["forkServer"] = fork_server.pid


def scenario_stop_or_kill(driver: Driver, report: dict[str, Any], kill: bool) -> None:
    fork_server = (
        driver.fork_server() if driver.supervisor.method is StartMethod.FORKSERVER else None
    )
    with stopped(fork_server):
        handle = driver.start("a", ask=False)  # a resolver without a request waits for one
        report["pidAtRequest"] = handle.pid
        if kill:
            driver.supervisor.kill(handle)
        else:
            driver.supervisor.stop(handle, 1.0)
    driver.turn_until(lambda: "exit:a" in driver.events, "the stopped child's exit")
    report["childEnded"] = ended(driver.processes["a"]) if "a" in driver.processes else None


def main(scenario: str, method: str, log_dir: str) -> int:
    driver = Driver(StartMethod(method), Path(log_dir))
    report: dict[str, Any] = {}
    try:
        if scenario == "stopped":
            scenario_stopped(driver, report)
        elif scenario == "killed":
            scenario_killed(driver, report)
        else:
            scenario_stop_or_kill(driver, report, kill=scenario == "kill")
    finally:
        driver.close()
    report.update(events=driver.events, seen=driver.seen)
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
