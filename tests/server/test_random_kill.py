"""Seeded random-kill runs: a seed fixes a schedule of kills during one workload.

Each seed draws, from :class:`random.Random(seed)`, three rounds: a fault point of the server,
the hit at which it kills, and whether a runner child is SIGKILLed too (the first one seen).
Round after round the server starts armed with the next kill, the workload is submitted again
with the same idempotency keys, and the round ends when the server dies or everything settled.
A final round without faults must converge (liveness), then the safety checks of the crash
matrix hold. The seed reproduces its schedule:

    pytest tests/server/test_random_kill.py -k "seed_7"

Ten seeds run with every test run; ``pytest -m soak tests/server/test_random_kill.py`` runs the
long tier of 200 seeds.
"""

from __future__ import annotations

import contextlib
import random
import select
import time
from pathlib import Path

import psutil
import pytest

from piwf import faults
from piwf.state import StateDatabase
from tests.server.harness import ServerFactory, ServerProcess, runner_processes, wait_for
from tests.server.test_crash_matrix import (
    FAST,
    SETTLED,
    effects_workflow,
    run_states,
    submit,
    verify,
)

STARTUP_ONLY = {"server.after_epoch", "server.before_listen", "recovery.after_each_fix"}
POINTS = sorted(faults.POINTS - STARTUP_ONLY - {"resolver.before_reply"})


def schedule(seed: int) -> list[tuple[str, int, bool]]:
    """The kills of one seed: per round a server (point, hit) and whether a runner dies too."""
    rng = random.Random(seed)
    return [(rng.choice(POINTS), rng.randint(1, 6), rng.random() < 0.5) for _ in range(3)]


def kill_a_runner(home: Path) -> None:
    """SIGKILL one live runner child, if one shows up soon (the workload may be past it)."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        for process in runner_processes(home):
            with contextlib.suppress(psutil.Error):
                process.kill()
                return
        select.select([], [], [], 0.01)


def died_or_settled(server: ServerProcess) -> bool:
    """Whether the armed server died, or the whole workload settled under it."""
    if not server.alive():
        return True
    try:
        states = run_states(server)
    except (OSError, ConnectionError):
        return False  # it is dying under the observer; look again
    return len(states) == 2 and set(states) <= SETTLED


def run_seed(servers: ServerFactory, tmp_path: Path, seed: int) -> None:
    sink = tmp_path / "sink"
    workflow = effects_workflow(tmp_path, sink)
    for point, hit, kill_runner in schedule(seed):
        armed = servers.start(env={**FAST, "PIWF_FAULTS": f"{point}@{hit}=kill"})
        if armed.ready.get("ok") is not True:
            continue
        submit(armed, workflow, tmp_path)
        if kill_runner:
            kill_a_runner(armed.home)
        wait_for(
            lambda server=armed: died_or_settled(server),
            timeout_s=60,
            what=f"seed {seed}: {point}@{hit}",
        )
        if armed.alive():
            armed.terminate()
    survivor = servers.start(env=FAST)
    assert survivor.ready["ok"] is True, survivor.ready
    submit(survivor, workflow, tmp_path)
    wait_for(
        lambda: len(run_states(survivor)) == 2 and set(run_states(survivor)) <= SETTLED,
        timeout_s=60,
        what=f"seed {seed}: convergence",
    )
    assert verify(survivor) == {"valid": True, "violations": []}, f"seed {seed}"
    attempts = sink.read_text().split() if sink.exists() else []
    assert attempts.count("post") <= 1, f"seed {seed}: a manual action ran twice"
    with StateDatabase(survivor.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 2, f"seed {seed}"
        assert tx.scalar("SELECT count(*) FROM server_commands") == 3, f"seed {seed}"
    survivor.terminate()
    wait_for(lambda: not runner_processes(survivor.home), timeout_s=15, what="no runner left")


@pytest.mark.parametrize("seed", range(10), ids=[f"seed_{n}" for n in range(10)])
def test_random_kills_short_tier(servers: ServerFactory, tmp_path: Path, seed: int) -> None:
    run_seed(servers, tmp_path, seed)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(10, 210), ids=[f"seed_{n}" for n in range(10, 210)])
def test_random_kills_long_tier(servers: ServerFactory, tmp_path: Path, seed: int) -> None:
    run_seed(servers, tmp_path, seed)


def test_a_seed_reproduces_its_schedule() -> None:
    assert schedule(7) == schedule(7)
    assert len({tuple(schedule(seed)) for seed in range(20)}) > 15
    assert any(kill for seed in range(10) for _, _, kill in schedule(seed))
