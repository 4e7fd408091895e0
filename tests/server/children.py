"""Shared pieces of the tests of children: servers per start method, and finding the standard
library's helper processes (the fork server, the resource tracker) of a server by what they
are, a child of that server running the module's ``main``; and running a stand-in for the
server (a driver program of the tests)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil

from tests.server.harness import ServerFactory, ServerProcess, wait_for

FAST = {"PIWF_IDLE_EXIT_S": "0", "PIWF_CLAIM_POLL_S": "0.05", "PIWF_RUN_RENEW_S": "0.2"}
METHODS = ("forkserver", "spawn")
HELLO = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py")

_FORKSERVER = "from multiprocessing.forkserver import main"
_RESOURCE_TRACKER = "from multiprocessing.resource_tracker import main"


def start_server(
    servers: ServerFactory, method: str, env: dict[str, str] | None = None
) -> ServerProcess:
    """A server whose children start with ``method`` (``PIWF_START_METHOD``); with
    ``forkserver``, once its fork server runs the fork server's code (it is launched before the
    server reports ready, but without waiting for its ``exec``)."""
    server = servers.start(env={**FAST, "PIWF_START_METHOD": method, **(env or {})})
    assert server.ready["ok"] is True, server.ready
    if method == "forkserver":
        wait_for(lambda: len(fork_servers(server)) == 1, what="the server's fork server")
    return server


def helpers_of(pid: int, command: str) -> list[psutil.Process]:
    """Live children of ``pid`` whose command line runs ``command``."""
    found = []
    with suppress(psutil.Error):
        for child in psutil.Process(pid).children():
            with suppress(psutil.Error):
                # Joined: a fork server forked from the server has its command line as a title,
                # which reads back split at its spaces.
                if child.status() != psutil.STATUS_ZOMBIE and command in " ".join(child.cmdline()):
                    found.append(child)
    return found


def fork_servers(server: ServerProcess) -> list[psutil.Process]:
    """The server's live fork servers (one, with ``forkserver``; none with ``spawn``)."""
    return helpers_of(server.process.pid, _FORKSERVER)


def resource_trackers(server: ServerProcess) -> list[psutil.Process]:
    """The server's live ``multiprocessing`` resource trackers."""
    return helpers_of(server.process.pid, _RESOURCE_TRACKER)


def gone(process: psutil.Process) -> bool:
    """Ended, a zombie, or its pid now names another process."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


REPOSITORY = str(Path(__file__).resolve().parents[2])


@contextmanager
def driver_process(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A stand-in for the server (a Python program of the tests) run from the repository, in
    a session of its own, with text pipes to its stdin and from its stdout; killed with its
    whole group afterwards."""
    driver = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": REPOSITORY},
        start_new_session=True,
    )
    try:
        yield driver
    finally:
        with suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        for stream in (driver.stdin, driver.stdout):
            if stream is not None:
                stream.close()
