"""Seeded random-kill runs: a seed fixes a schedule of kills during one workload.

Each seed draws, from :class:`random.Random(seed)`, three rounds. A round arms the server to
die at a fault point and hit, and may also arm runner children to die at a child point (through
``PIWF_CHILD_FAULTS``) and SIGKILL the first runner child seen. Round after round the server
starts armed, the client resends the workload with the same idempotency keys (recording its
history), and the round ends when the server dies or everything settled. A final round without
faults must converge (liveness); then the safety checks of the crash matrix hold, the client
history included. The seed reproduces its schedule, on any interpreter:

    pytest -m soak tests/server/test_random_kill.py -k "long_tier and seed_7"

The short tier runs with every test run: five seeds on each Python, a different five on each
Python of the tox matrix (3.10 seeds 0-4, 3.11 5-9, 3.12 10-14, 3.13 15-19), so one run of the
matrix covers twenty seeds. ``pytest -m soak tests/server/test_random_kill.py`` runs the long
tier, seeds 0-199.
"""

from __future__ import annotations

import contextlib
import random
import select
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from piwf import faults
from piwf.state import StateDatabase
from tests.server.harness import (
    ServerFactory,
    ServerProcess,
    raw_client,
    runner_processes,
    wait_for,
)
from tests.server.history import History
from tests.server.test_crash_matrix import (
    CHILD_POINTS,
    FAST,
    check_effect_attempts,
    converged,
    verify,
    workload,
)
from tests.server.test_execution import hold_until_gate, query, start, wait_run, write_workflow

#: This interpreter's five seeds of the short tier (see the module docstring).
_SHARE = {(3, 10): 0, (3, 11): 1, (3, 12): 2, (3, 13): 3}.get(sys.version_info[:2], 1)
SHORT_TIER = range(5 * _SHARE, 5 * _SHARE + 5)
LONG_TIER = range(200)

STARTUP_ONLY = {"server.after_epoch", "server.before_listen", "recovery.after_each_fix"}
#: Reached once per server, as it stops: the crash matrix kills it there.
STOPPING_ONLY = {"server.before_release"}
POINTS = sorted(
    faults.POINTS - STARTUP_ONLY - STOPPING_ONLY - CHILD_POINTS - {"resolver.before_reply"}
)


@dataclass(frozen=True)
class Round:
    """One round's kills: the server's point and hit, an optional child point, a runner kill."""

    point: str
    hit: int
    child_fault: str | None
    kill_runner: bool

    def environment(self) -> dict[str, str]:
        armed = {**FAST, "PIWF_FAULTS": f"{self.point}@{self.hit}=kill"}
        if self.child_fault is not None:
            armed["PIWF_CHILD_FAULTS"] = self.child_fault
        return armed


def schedule(seed: int) -> list[Round]:
    """The kills of one seed, drawn from ``random.Random(seed)`` alone."""
    rng = random.Random(seed)
    rounds = []
    for _ in range(3):
        point, hit = rng.choice(POINTS), rng.randint(1, 6)
        child = rng.choice(sorted(CHILD_POINTS)) if rng.random() < 0.3 else None
        child_fault = None if child is None else f"{child}@{rng.randint(1, 3)}=kill"
        rounds.append(Round(point, hit, child_fault, rng.random() < 0.5))
    return rounds


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
        return converged(server)
    except (OSError, ConnectionError):
        return False  # it is dying under the observer; look again


def run_seed(servers: ServerFactory, tmp_path: Path, seed: int) -> None:
    sink = tmp_path / "sink"
    commands, history = workload(tmp_path, sink), History()
    for kills in schedule(seed):
        armed = servers.start(env=kills.environment())
        if armed.ready.get("ok") is not True:
            continue
        history.run(armed, commands)
        if kills.kill_runner:
            kill_a_runner(armed.home)
        wait_for(
            lambda server=armed: died_or_settled(server),
            timeout_s=60,
            what=f"seed {seed}: {kills}",
        )
        if armed.alive():
            armed.terminate()
    survivor = servers.start(env=FAST)
    assert survivor.ready["ok"] is True, survivor.ready
    history.run(survivor, commands)
    wait_for(lambda: converged(survivor), timeout_s=60, what=f"seed {seed}: convergence")
    assert verify(survivor) == {"valid": True, "violations": []}, f"seed {seed}"
    check_effect_attempts(survivor, sink)
    history.check(survivor, commands)
    with StateDatabase(survivor.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 3, f"seed {seed}"
    survivor.terminate()
    wait_for(lambda: not runner_processes(survivor.home), timeout_s=15, what="no runner left")


@pytest.mark.parametrize("seed", SHORT_TIER, ids=[f"seed_{n}" for n in SHORT_TIER])
def test_random_kills_short_tier(servers: ServerFactory, tmp_path: Path, seed: int) -> None:
    run_seed(servers, tmp_path, seed)


@pytest.mark.soak
@pytest.mark.parametrize("seed", LONG_TIER, ids=[f"seed_{n}" for n in LONG_TIER])
def test_random_kills_long_tier(servers: ServerFactory, tmp_path: Path, seed: int) -> None:
    run_seed(servers, tmp_path, seed)


def test_a_seed_reproduces_its_schedule() -> None:
    assert schedule(7) == schedule(7)
    assert len({tuple(schedule(seed)) for seed in range(20)}) > 15
    for first in range(0, 20, 5):  # every interpreter's share of the short tier
        rounds = [kills for seed in range(first, first + 5) for kills in schedule(seed)]
        assert any(kills.kill_runner for kills in rounds), f"seeds {first}+ SIGKILL runners"
        assert any(kills.child_fault for kills in rounds), f"seeds {first}+ arm child points"
    assert set(SHORT_TIER) <= set(LONG_TIER), "a short-tier seed is reproduced by the long tier"


def test_the_runner_of_this_home_is_found_and_killed(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """``kill_a_runner`` finds the live runner through the database and SIGKILLs it."""
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = write_workflow(
        tmp_path,
        "held",
        f"""
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def hold(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return 1

        workflow = define_workflow(
            name="held", start_at="hold", nodes={{"hold": compute(hold)}}, edges=[]
        )
        """,
    )
    server = servers.start(env=FAST)
    with raw_client(server) as client:
        run_id = start(client, workflow, None, "held")
        wait_for(entered.exists, timeout_s=30, what="the node to start")
        (victim,) = runner_processes(server.home)
        kill_a_runner(server.home)
        victim.wait(timeout=10)  # gone (its parent reaps it)
        gate.touch()
        assert wait_run(client, run_id)["status"] == "completed"
    runners = query(server, "SELECT status FROM run_runners ORDER BY started_at")
    assert runners[0] == ("crashed",)
