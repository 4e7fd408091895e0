"""The decisions that look only at a run's unsettled effects read only those.

A runner's recovery, and the refusals of a restart, a fork or a resume, decide on the effects
still pending, applying or ambiguous. A run whose loop reserved thousands of effects must not
make each of them read the whole history: the cost is counted in SQLite virtual-machine
instructions (deterministic), for a run with a few settled effects and one with many.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from piwf.clock import FakeClock
from piwf.lifecycle import Applied, Conflict
from piwf.server.runs import refusals
from piwf.state import StateDatabase, Transaction
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.enums import ActorType, EffectOwnerScope, EffectRecovery, RunnerStatus
from piwf.state.execution import runs
from piwf.state.execution.core import unsettled_effects_refusal
from piwf.state.records import Actor

from .test_execution_support import LEASE_MS, SERVER, SERVER_ID, create, launch, runner_of, two_step

BENCH = Actor(ActorType.RUNNER, "test")
FEW, MANY = 5, 1_500


@contextmanager
def counted(db: StateDatabase) -> Iterator[list[int]]:
    """Count (in hundreds) the VM instructions the writer connection runs inside the block."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    db.connection.set_progress_handler(tick, 100)
    try:
        yield steps
    finally:
        db.connection.set_progress_handler(None, 0)


def effects_of(db: StateDatabase, run_id: str, settled: int, last: str) -> None:
    """``settled`` applied effects of the run, then one left ``last`` (applying or ambiguous)."""
    source = f"run:{run_id}"
    with db.write() as tx:
        for number in range(settled + 1):
            reserved = fx.reserve_effect(
                tx,
                source_resource_id=source,
                source_revision=1,
                effect_type="svc.apply",
                idempotency_key=f"apply-{number}",
                payload={"n": number},
                recovery=EffectRecovery.MANUAL,
                owner_scope=EffectOwnerScope.RUN,
                actor=BENCH,
            )
            assert not isinstance(reserved, Conflict), reserved
            effect_id = reserved.value.effect_id
            fx.begin_attempt(tx, effect_id, owner_id="t", lease_generation=1, actor=BENCH)
            if number < settled:
                fx.settle_effect(tx, effect_id, attempt_number=1, outcome="applied", actor=BENCH)
            elif last == "ambiguous":
                fx.recover_uncertain(tx, effect_id, actor=BENCH)


def recovery_cost(home: Path, clock: FakeClock, settled: int) -> int:
    """The cost of recovering a crashed runner whose run has ``settled`` settled effects and
    one applying (manual, so it becomes ambiguous and parks the run); the runner was orphaned
    (its server died), so its recovery looks at the effects whatever its progress."""
    db = StateDatabase(home / f"recover-{settled}.sqlite", clock=clock)
    try:
        create(db, two_step())
        launched = launch(db)
        effects_of(db, launched.run_id, settled, "applying")
        epoch = runner_of(db, launched).runner_epoch
        with db.write() as tx:
            ex.record_runner_exit(tx, epoch, RunnerStatus.ORPHANED, exit_code=1)
        with counted(db) as steps, db.write() as tx:
            result = ex.recover_after_runner_exit(
                tx,
                launched.run_id,
                runner_epoch=epoch,
                actor=SERVER,
                owner_id=SERVER_ID,
                lease_ms=LEASE_MS,
                claim=launched.claim,
            )
        assert isinstance(result, Applied), result
        assert result.value.decision is ex.RecoveryDecision.EFFECT_AMBIGUOUS
        return steps[0]
    finally:
        db.close()


def refusal_cost(
    home: Path, clock: FakeClock, settled: int, refuse: Callable[[Transaction, runs.RunRow], str]
) -> int:
    """The cost of ``refuse`` on a run with ``settled`` settled effects and one ambiguous."""
    db = StateDatabase(home / f"refuse-{settled}.sqlite", clock=clock)
    try:
        run_id = create(db, two_step())
        effects_of(db, run_id, settled, "ambiguous")
        with counted(db) as steps, db.write() as tx:
            run = runs.load_run(tx, run_id)
            assert run is not None
            text = refuse(tx, run)
        assert "effect-" in text and "ambiguous" in text, text
        return steps[0]
    finally:
        db.close()


def test_a_runner_recovery_reads_only_the_unsettled_effects(
    tmp_path: Path, clock: FakeClock
) -> None:
    few, many = recovery_cost(tmp_path, clock, FEW), recovery_cost(tmp_path, clock, MANY)
    assert many < few * 2, (few, many)


def test_the_restart_and_resume_refusals_read_only_the_unsettled_effects(
    tmp_path: Path, clock: FakeClock
) -> None:
    def restart(tx: Transaction, run: runs.RunRow) -> str:
        text = unsettled_effects_refusal(tx, run, then="restart it")
        assert text is not None
        return text

    def resume(tx: Transaction, run: runs.RunRow) -> str:
        return str(refusals.ambiguous_refuses_resume(tx, run))

    for refuse in (restart, resume):
        few = refusal_cost(tmp_path / refuse.__name__, clock, FEW, refuse)
        many = refusal_cost(tmp_path / refuse.__name__, clock, MANY, refuse)
        assert many < few * 2, (refuse.__name__, few, many)
