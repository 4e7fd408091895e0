"""Figure 5: recovery. Start-up on a large database, and a busy server killed with SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.common import BenchError, Figure, Spread, kill_group, poll, scratch_dir
from tests.bench.fig_runs import Context, completed
from tests.bench.piwf_side import (
    PiwfServer,
    held_workflow,
    kill_home_processes,
    server_environment,
    server_settings,
    wait_attempt,
    wait_entered,
)
from tests.bench.seed import Template, build_template, seed_database

RECOVERY_TIMEOUT_S = 120.0
CLI_ROW = "`piwf server start` -> first command answered"
READY_ROW = "`piwf server run` -> ready line"
ANSWER_ROW = "`piwf server run` -> first command answered"


def piwf_command() -> list[str]:
    """The installed ``piwf`` script of this interpreter (``python -m piwf`` without one)."""
    script = Path(sys.executable).parent / "piwf"
    return [str(script)] if script.exists() else [sys.executable, "-m", "piwf"]


class StartGaveUpError(BenchError):
    """``piwf server start`` gave up on a server that did not report ready in its time."""


def cli_start_to_first_answer(home: Path) -> float:
    """Seconds from running ``piwf server start`` to the first answered ``server.status``."""
    from piwf.client import Client

    began = time.perf_counter()
    result = subprocess.run(
        [*piwf_command(), "server", "start", "--max-workers", "4", "--json"],
        env=server_environment(home),
        capture_output=True,
        text=True,
        timeout=RECOVERY_TIMEOUT_S,
        check=False,
    )
    returned = time.perf_counter() - began
    if result.returncode != 0:
        log = home / "server" / "server.log"
        tail = "\n".join(log.read_text().splitlines()[-10:]) if log.exists() else "(no log)"
        raise StartGaveUpError(
            f"piwf server start failed after {returned:.1f} s: {result.stdout}{result.stderr}"
            f"\nserver log:\n{tail}"
        )
    if not json.loads(result.stdout).get("started"):
        raise BenchError("piwf server start found a server already running")
    with Client(home, autostart=False) as client:
        client.server_status()
    return time.perf_counter() - began


def server_start_to_first_answer(home: Path) -> tuple[float, float]:
    """(ready line, first ``server.status`` answered), seconds from spawning ``piwf server run``
    (the command ``piwf server start`` runs in the background, without its 10 s limit)."""
    server = PiwfServer(home)
    try:
        began = time.perf_counter()
        server.start()
        ready = time.perf_counter() - began
        with server.client() as client:
            client.server_status()
            answered = time.perf_counter() - began
    finally:
        server.cleanup()
    return ready, answered


def stop_home(home: Path) -> None:
    from piwf.client import Client
    from piwf.errors import PiwfError

    try:
        with Client(home, autostart=False, retry_timeout_s=2) as client:
            client.stop_server(wait_s=10)
    except PiwfError:
        pass
    kill_home_processes(home)


def startup(figure: Figure, context: Context, template: Template, workdir: Path) -> None:
    sizes = context.sizes
    seeded = workdir / "seeded" / "state.sqlite"
    report = seed_database(
        template, seeded, terminal=sizes.terminal_runs, resumable=sizes.resumable_runs
    )
    figure.notes.append(
        f"seeded {sizes.terminal_runs:,} completed + {sizes.resumable_runs} resumable runs in "
        f"{report.seconds:.1f} s ({report.database_bytes / 2**20:.0f} MiB); resumable = left "
        "mid-flight by a SIGKILLed server (claimed, runner row live, second node open)"
    )
    template.gate.touch()  # resumed runs finish instead of holding their slots
    # A fresh copy of the seeded file per start: each start recovers the same 100 runs.
    cases = {
        "empty home (database created)": None,
        f"{sizes.terminal_runs:,} terminal + {sizes.resumable_runs} resumable runs": seeded,
    }
    for name, source in cases.items():
        found: dict[str, list[float]] = {}
        gave_up = 0
        for rep in range(sizes.reps):
            for kind in ("cli", "server"):
                home = workdir / f"s{rep}{kind}"
                if source is not None:
                    home.mkdir(mode=0o700)
                    shutil.copyfile(source, home / "state.sqlite")
                    (home / "state.sqlite").chmod(0o600)
                try:
                    if kind == "cli":
                        try:
                            found.setdefault(CLI_ROW, []).append(cli_start_to_first_answer(home))
                        except StartGaveUpError as error:
                            gave_up += 1
                            figure.notes.append(f"{name}: {error}")
                        if source is not None and rep == 0:
                            _verify(home)
                    else:
                        ready, answered = server_start_to_first_answer(home)
                        if source is not None and rep == 0:
                            figure.notes.append(f"server log of one seeded start:\n{_log(home)}")
                        found.setdefault(READY_ROW, []).append(ready)
                        found.setdefault(ANSWER_ROW, []).append(answered)
                finally:
                    stop_home(home)
                    shutil.rmtree(home, ignore_errors=True)
        if gave_up:
            figure.notes.append(
                f"{name}: `piwf server start` gave up {gave_up} of {sizes.reps} times "
                "(the launcher waits 10 s for the ready line, then kills the server)"
            )
        for label, values in found.items():
            spread = Spread.of(values)
            figure.add(
                [f"start: {name}", label, spread.show(1000, 0)],
                f"start {name} {label}",
                {"seconds": spread.to_json()},
            )


def _log(home: Path) -> str:
    log = home / "server" / "server.log"
    lines = log.read_text().splitlines()[-6:] if log.exists() else ["(no log)"]
    return "\n".join(f"    {line}" for line in lines)


def _verify(home: Path) -> None:
    from piwf.client import Client

    with Client(home, autostart=False) as client:
        verdict = client.state_verify()
    if not verdict.valid:
        raise BenchError(f"the seeded database is not valid: {verdict.violations[:3]}")


def kill_and_recover(figure: Figure, context: Context) -> None:
    ready: list[float] = []
    running: list[float] = []
    for _ in range(context.sizes.reps):
        with scratch_dir() as workdir:
            markers = workdir / "markers"
            markers.mkdir()
            gate = workdir / "gate"
            held = held_workflow(workdir, markers, gate, spin=False)
            home = workdir / "h"
            first = PiwfServer(home)
            second = PiwfServer(home)
            try:
                first.start()
                with first.client() as client:
                    run_ids = [client.start_run(held).run_id for _ in range(4)]
                wait_entered(markers, 4)
                began = time.perf_counter()
                first.kill9()
                second.start()
                ready.append(time.perf_counter() - began)
                wait_attempt(markers, run_ids, 2, RECOVERY_TIMEOUT_S)
                running.append(time.perf_counter() - began)
                gate.touch()
                with second.client() as client:
                    for run_id in run_ids:
                        completed(client, run_id)
            finally:
                second.cleanup()
                first.cleanup()
                if first.process is not None:
                    kill_group(first.process.pid)
    for label, values in (
        ("new server answers (restart is immediate)", ready),
        ("all 4 interrupted runs executing again", running),
    ):
        spread = Spread.of(values)
        figure.add(
            ["kill -9 of a server running 4 runs", label, spread.show(1000, 0)],
            f"kill9 {label}",
            {"seconds": spread.to_json()},
        )


def orphan_reap_seconds() -> float:
    """Seconds until a SIGKILLed orphan (its parent already gone) disappears on this machine:
    how fast PID 1 reaps it. Recovery waits for each orphaned runner it kills to disappear."""
    shell = subprocess.run(
        ["/bin/sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(shell.stdout.strip())
    began = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    poll(lambda: not _exists(pid), 30, "the orphan to be reaped", interval_s=0.002)
    return time.perf_counter() - began


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def figure_recovery(context: Context) -> Figure:
    figure = Figure(
        5, "recovery (ms from the event)", ["situation", "until", "ms median [min-max]"]
    )
    with scratch_dir() as workdir:
        template = build_template(workdir)
        startup(figure, context, template, workdir)
    kill_and_recover(figure, context)
    reaped = Spread.of([orphan_reap_seconds() for _ in range(context.sizes.reps)])
    figure.add(
        ["this machine: a killed orphan process", "reaped by PID 1", reaped.show(1000, 0)],
        "orphan reaped",
        {"seconds": reaped.to_json()},
    )
    figure.notes.append(
        "startup recovery kills each live runner of the dead server and waits (up to 5 s, one "
        "after the other) until that process is gone; the last row bounds that wait here"
    )
    figure.settings = {
        "piwf": server_settings(4),
        "start": "`piwf server start --json` as a subprocess (its own interpreter start "
        "included), or `python -m piwf server run` (what it runs in the background); then one "
        "Client sends server.status",
        "kill": "SIGKILL to the server process only; a new `piwf server run` is started at once; "
        "'executing again' = each run's node wrote its attempt-2 marker",
    }
    return figure
