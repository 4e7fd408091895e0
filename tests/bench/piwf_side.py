"""piwf under benchmark: a real server process in a private state home, and generated workflows.

The server is started the way users start it (``python -m piwf server run``, which is what
``piwf server start`` runs in the background) with its default tunables except ``--max-workers``
and the idle exit (off). Clients are the public :class:`piwf.client.Client`. Every process a
benchmark starts is killed afterwards: the server's process group, and every process whose
``PIWF_HOME`` is the benchmark's home (runner and resolver children live in their own groups).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from piwf.client import Client
from tests.bench.common import REPOSITORY, BenchError, kill_group, poll

READY_TIMEOUT_S = 60.0
#: The server settings the figures use (everything else is piwf's default).
SERVER_ENV = {"PIWF_IDLE_EXIT_S": "0"}


def server_environment(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``PIWF_*`` tunable of the caller's shell, with
    ``PIWF_HOME`` and :data:`SERVER_ENV` set: the figures run on piwf's defaults."""
    kept = {key: value for key, value in os.environ.items() if not key.startswith("PIWF_")}
    return {**kept, "PIWF_HOME": str(home), **SERVER_ENV, **(extra or {})}


def server_settings(max_workers: int) -> dict[str, Any]:
    """What the tables print about the piwf server."""
    from piwf.server.settings import ServerSettings

    defaults = ServerSettings()
    return {
        "maxWorkers": max_workers,
        "claimPollS": defaults.claim_poll_s,
        "runLeaseMs": defaults.run_lease_ms,
        "database": "WAL, synchronous=FULL (piwf's only mode)",
        "scheduling": "event-driven on start/exit, plus the claim poll as a backstop",
    }


@dataclass
class PiwfServer:
    """One ``piwf server run`` process for ``home``; use as a context manager."""

    home: Path
    max_workers: int = 4
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    ready: dict[str, Any] = field(default_factory=dict)
    started_s: float = 0.0

    def __enter__(self) -> PiwfServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    @property
    def pid(self) -> int:
        if self.process is None:
            raise BenchError("the server is not running")
        return self.process.pid

    def start(self) -> float:
        """Start the server, wait for its ready line and return how long that took (s)."""
        read_end, write_end = os.pipe()
        began = time.perf_counter()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "piwf",
                "server",
                "run",
                "--ready-fd",
                str(write_end),
                "--max-workers",
                str(self.max_workers),
            ],
            pass_fds=(write_end,),
            env=server_environment(self.home, self.env),
            cwd=REPOSITORY,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(write_end)
        try:
            line = read_line(read_end, READY_TIMEOUT_S)
        finally:
            os.close(read_end)
        self.started_s = time.perf_counter() - began
        self.ready = json.loads(line) if line else {}
        if self.ready.get("ok") is not True:
            raise BenchError(f"the piwf server did not start: {self.ready or 'no ready line'}")
        return self.started_s

    def client(self) -> Client:
        return Client(self.home, autostart=False, request_timeout_s=120.0)

    def kill9(self) -> None:
        """SIGKILL the server process alone (its runner children see their pipes close)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server cleanly (SIGTERM) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_group(self.process.pid)
                self.process.wait(timeout=10)

    def cleanup(self) -> None:
        """Kill the server's group and every process of this home; reap the server."""
        if self.process is not None:
            kill_group(self.process.pid)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        kill_home_processes(self.home)


def read_line(descriptor: int, timeout_s: float) -> bytes:
    """Read up to the first newline (or end of file) within ``timeout_s``."""
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BenchError("the piwf server did not report readiness in time")
        readable, _, _ = select.select([descriptor], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(descriptor, 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def kill_home_processes(home: Path) -> None:
    """SIGKILL the process group of every process whose ``PIWF_HOME`` is ``home``."""
    me = os.getpid()
    for process in psutil.process_iter(["pid"]):
        if process.pid == me:
            continue
        try:
            if process.environ().get("PIWF_HOME") != str(home):
                continue
            group = os.getpgid(process.pid)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
        if group != os.getpgid(0):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        with suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)


def rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


# -- generated workflows ----------------------------------------------------------------------


def write_workflow(directory: Path, name: str, source: str) -> Path:
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def two_node_workflow(directory: Path) -> Path:
    """Two compute nodes: ``first`` adds one to the input, ``second`` doubles it."""
    return write_workflow(
        directory,
        "bench_two",
        """
        from piwf.workflow import compute, define_workflow

        workflow = define_workflow(
            name="bench-two",
            start_at="first",
            nodes={
                "first": compute(lambda ctx: {"v": ctx.input["v"] + 1}),
                "second": compute(lambda ctx: {"v": ctx.outputs["first"]["v"] * 2}),
            },
            edges=[{"from": "first", "to": "second"}],
        )
        """,
    )


def chain_workflow(directory: Path, nodes: int) -> Path:
    """``nodes`` compute nodes in a line, each returning a tiny output."""
    return write_workflow(
        directory,
        f"bench_chain_{nodes}",
        f"""
        from piwf.workflow import compute, define_workflow

        COUNT = {nodes}

        def step(ctx):
            return {{"node": ctx.node}}

        workflow = define_workflow(
            name="bench-chain-{nodes}",
            start_at="n0",
            max_steps=COUNT,
            nodes={{f"n{{i}}": compute(step) for i in range(COUNT)}},
            edges=[{{"from": f"n{{i}}", "to": f"n{{i + 1}}"}} for i in range(COUNT - 1)],
        )
        """,
    )


def held_workflow(directory: Path, markers: Path, gate: Path, *, spin: bool) -> Path:
    """``first`` (trivial) then ``hold``: write a marker ``<run id>.<attempt>`` and wait until
    ``gate`` exists (120 s at most), either sleeping in short steps or burning CPU (``spin``)."""
    if spin:
        wait = """
            while not gate.exists() and time.monotonic() < deadline:
                total = 0
                for i in range(20_000):
                    total += i * i
        """
    else:
        wait = """
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        """
    name = "bench_spin" if spin else "bench_hold"
    return write_workflow(
        directory,
        name,
        f"""
        import pathlib
        import time

        from piwf.workflow import compute, define_workflow

        MARKERS = pathlib.Path({str(markers)!r})
        GATE = pathlib.Path({str(gate)!r})

        def hold(ctx):
            (MARKERS / f"{{ctx.run_id}}.{{ctx.attempt}}").touch()
            gate = GATE
            deadline = time.monotonic() + 120
{textwrap.indent(textwrap.dedent(wait).strip(), " " * 12)}
            return {{"held": True}}

        workflow = define_workflow(
            name="{name.replace("_", "-")}",
            start_at="first",
            nodes={{"first": compute(lambda ctx: {{"v": 1}}), "hold": compute(hold)}},
            edges=[{{"from": "first", "to": "hold"}}],
        )
        """,
    )


def wait_entered(markers: Path, count: int, timeout_s: float = 120.0) -> None:
    """Wait until ``count`` runs have entered their held node."""
    poll(lambda: len(markers_of(markers)) >= count, timeout_s, f"{count} runs in their node")


def wait_attempt(markers: Path, run_ids: list[str], attempt: int, timeout_s: float) -> None:
    """Wait until every run in ``run_ids`` entered its held node with ``attempt`` or later."""
    poll(
        lambda: all(markers_of(markers).get(run_id, 0) >= attempt for run_id in run_ids),
        timeout_s,
        f"the runs to enter their node again (attempt {attempt})",
        interval_s=0.002,
    )


def markers_of(markers: Path) -> dict[str, int]:
    """The highest attempt each run has entered ``hold`` with, by run id."""
    seen: dict[str, int] = {}
    for path in markers.iterdir():
        run_id, _, attempt = path.name.rpartition(".")
        seen[run_id] = max(seen.get(run_id, 0), int(attempt))
    return seen
