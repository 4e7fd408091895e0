"""What reading a source's unsettled effects, and its newest ones, costs as its history grows.

``python -m tests.bench.open_effects [--effects 10000] [--repeat 20]`` writes one source
aggregate with ``--effects`` settled effects and two pending ones into a scratch database, then
times (median of ``--repeat`` reads, each in its own read transaction) the two ways to find the
unsettled ones:

    every effect, then a filter      fx.list_effects + a status test (before issue 18's
                                     eighteenth part: a channel's dispatch on every run change)
    the status index                 fx.list_unsettled_effects

and the two ways to list its newest 50 with how many there are (what ``resource get`` shows):

    every effect, then the last 50   fx.list_effects, sliced (before the nineteenth part)
    the newest 50 and a count        fx.list_shown_effects + fx.count_effects

Not a figure: a tool for the analysis in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from piwf.lifecycle import Conflict, EffectStatus
from piwf.state import StateDatabase, Transaction
from piwf.state import effects as fx
from piwf.state.enums import ActorType, EffectOwnerScope, EffectRecovery, ResourceType
from piwf.state.records import Actor, ensure_resource
from tests.bench.common import BenchError, scratch_dir

ACTOR = Actor(ActorType.RUNNER, "bench")
#: Effects written per transaction while the history is built.
BATCH = 500
#: How many effects ``resource get`` shows.
NEWEST = 50
UNSETTLED = (EffectStatus.PENDING, EffectStatus.APPLYING, EffectStatus.AMBIGUOUS)


def build_history(db: StateDatabase, settled: int) -> str:
    """A source with ``settled`` applied effects and two pending ones; return its id."""
    with db.write() as tx:
        source = ensure_resource(tx, ResourceType.RUN, "run-bench")
    total = settled + 2
    for start in range(0, total, BATCH):
        with db.write() as tx:
            for number in range(start, min(start + BATCH, total)):
                _effect(tx, source, number, settle=number < settled)
    return source


def _effect(tx: Transaction, source: str, number: int, *, settle: bool) -> None:
    reserved = fx.reserve_effect(
        tx,
        source_resource_id=source,
        source_revision=1,
        effect_type="bench.send",
        idempotency_key=f"send-{number}",
        payload={"n": number},
        recovery=EffectRecovery.MANUAL,
        owner_scope=EffectOwnerScope.CHANNEL,
        actor=ACTOR,
    )
    if isinstance(reserved, Conflict):
        raise BenchError(f"effect {number} could not be reserved: {reserved.evidence}")
    effect_id = reserved.value.effect_id
    if settle:
        fx.begin_attempt(tx, effect_id, owner_id="bench", lease_generation=1, actor=ACTOR)
        fx.settle_effect(tx, effect_id, attempt_number=1, outcome="applied", actor=ACTOR)


def median_ms(
    db: StateDatabase, read: Callable[[Transaction], list[fx.Effect]], repeat: int
) -> tuple[float, int]:
    """The median time of ``read`` (ms) and how many effects it found."""
    times, found = [], 0
    for _ in range(repeat):
        with db.read() as tx:
            began = time.perf_counter()
            found = len(read(tx))
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.open_effects")
    parser.add_argument("--effects", type=int, default=10_000, help="settled effects to write")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    with scratch_dir() as work, StateDatabase(Path(work) / "state.sqlite") as db:
        source = build_history(db, args.effects)
        ways: list[tuple[str, Callable[[Transaction], list[fx.Effect]]]] = [
            (
                "every effect, then a filter",
                lambda tx: [e for e in fx.list_effects(tx, source) if e.status in UNSETTLED],
            ),
            ("the status index", lambda tx: fx.list_unsettled_effects(tx, source)),
        ]
        print(f"unsettled effects of a source with {args.effects:,} settled ones (median ms):")
        for name, read in ways:
            took, found = median_ms(db, read, args.repeat)
            print(f"  {name:30s} {took:9.3f}   ({found} found)")

        def newest_with_count(tx: Transaction) -> list[fx.Effect]:
            shown = fx.list_shown_effects(tx, source, NEWEST)
            fx.count_effects(tx, source)
            return shown

        newest: list[tuple[str, Callable[[Transaction], list[fx.Effect]]]] = [
            ("every effect, then the last 50", lambda tx: fx.list_effects(tx, source)[-NEWEST:]),
            ("the newest 50 and a count", newest_with_count),
        ]
        print(f"the newest {NEWEST} effects of that source and how many it has (median ms):")
        for name, read in newest:
            took, found = median_ms(db, read, args.repeat)
            print(f"  {name:30s} {took:9.3f}   ({found} shown)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
