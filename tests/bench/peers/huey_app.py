"""The Huey application of the benchmarks: SQLite storage in WAL mode with ``fsync=True``
(``synchronous=FULL``, the same durability setting as piwf), results stored.

"Two-node workflow" for Huey: the pipeline ``first_task.s(value).then(second_task)``: the
consumer runs the first task, stores its result, enqueues the second with that result, runs it
and stores the final result. The database path comes from ``PIWF_BENCH_HUEY_DB``.
"""

from __future__ import annotations

import os

from huey import SqliteHuey

huey = SqliteHuey(
    "piwf-bench",
    filename=os.environ.get("PIWF_BENCH_HUEY_DB", "huey-bench.sqlite"),
    fsync=True,
    journal_mode="wal",
)


@huey.task()
def first_task(value: int) -> int:
    return value + 1


@huey.task()
def second_task(value: int) -> int:
    return value * 2
