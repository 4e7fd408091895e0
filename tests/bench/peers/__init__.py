"""The peers piwf is measured against, each driven in its own subprocess.

Both are installed only in the ``bench`` tox environments; nothing here imports them, so the
suite can still run piwf's own figures without them (``--systems piwf``).

========  =====================================================================================
DBOS      ``dbos`` 3.x, SQLite system database, ``DBOS.register_queue("bench",
          worker_concurrency=4, polling_interval_sec=PEER_POLL_S)``; results read with
          ``handle.get_result(polling_interval_sec=RESULT_POLL_S)``. One fresh process and
          database per repetition (launch, measure, destroy).
Huey      ``huey`` 3.x, ``SqliteHuey(fsync=True, journal_mode="wal")``; a real consumer
          subprocess ``huey_consumer -k process -w 4`` polling every PEER_POLL_S (no backoff);
          results polled every RESULT_POLL_S. One fresh consumer and database per repetition.
========  =====================================================================================
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from tests.bench.common import run_json

#: The queue polling interval both peers are given (DBOS's default is 1 s; Huey's is 0.1 s
#: growing to 10 s when idle, which is turned off here).
PEER_POLL_S = 0.1
#: How often a peer's client looks for a finished result (piwf's client is told by the server).
RESULT_POLL_S = 0.01
WORKERS = 4
DRIVER_TIMEOUT_S = 900.0


def available(name: str) -> bool:
    """Whether the peer's package is importable in this environment."""
    return importlib.util.find_spec(name) is not None


def run_dbos(scenario: str, workdir: Path, **spec: Any) -> dict[str, Any]:
    """One DBOS repetition (fresh process, fresh system database under ``workdir``)."""
    return _driver("dbos_driver", scenario, workdir / "dbos.sqlite", spec)


def run_huey(scenario: str, workdir: Path, **spec: Any) -> dict[str, Any]:
    """One Huey repetition (fresh consumer, fresh database under ``workdir``)."""
    return _driver("huey_driver", scenario, workdir / "huey.sqlite", spec)


def _driver(module: str, scenario: str, database: Path, spec: dict[str, Any]) -> dict[str, Any]:
    import json

    full = {
        "scenario": scenario,
        "db": str(database),
        "workers": WORKERS,
        "poll_s": PEER_POLL_S,
        "result_poll_s": RESULT_POLL_S,
        "n": 0,
        "samples": 1,
        **spec,
    }
    command = [sys.executable, "-m", f"tests.bench.peers.{module}", json.dumps(full)]
    result: dict[str, Any] = run_json(command, DRIVER_TIMEOUT_S)
    return result


def settings() -> dict[str, str]:
    """What the tables print about the peers' configuration."""
    return {
        "DBOS": (
            f"SQLite system database; Queue worker_concurrency={WORKERS}, "
            f"polling_interval_sec={PEER_POLL_S} (DBOS default 1.0); results polled every "
            f"{RESULT_POLL_S} s; journal and synchronous are DBOS's defaults (rollback journal, "
            "synchronous=FULL)"
        ),
        "Huey": (
            f"SqliteHuey WAL + fsync=True (synchronous=FULL); consumer -k process -w {WORKERS}, "
            f"queue polled every {PEER_POLL_S} s without backoff; results polled every "
            f"{RESULT_POLL_S} s"
        ),
    }
