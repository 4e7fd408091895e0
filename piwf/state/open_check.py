"""The bounded integrity check a writer runs when it opens an existing state file.

::

    for each table (with its indexes), by name:
        deadline passed?  -> stop: False (the rest is caught by the reads that touch it)
        PRAGMA quick_check(table)
            problems      -> StateCorruptError naming the first one
    all checked           -> True

One table's check is one long SQLite VM step that a progress handler cannot stop (SQLite 3.40
calls it once), so a timer thread calls ``sqlite3_interrupt`` at the deadline; that call is safe
from any thread, and a lock keeps it off any later statement. docs/RELIABILITY.md has the
measured rate (``python -m tests.bench.quick_check``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

from piwf.errors import StateCorruptError
from piwf.state.failures import CORRUPT_ADVICE, SQLITE_CORRUPT, SQLITE_NOTADB, sqlite_result

log = logging.getLogger("piwf.state")

#: How long a writer open may spend on the check by default (``PIWF_QUICK_CHECK_S``).
QUICK_CHECK_BUDGET_S = 2.0

_TABLES_QUERY = "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name"


def bounded_quick_check(connection: sqlite3.Connection, path: Path, budget_s: float) -> bool:
    """Run ``PRAGMA quick_check`` table by table for at most ``budget_s`` seconds.

    Returns True when every table (with its indexes) was checked and False when the budget ran
    out first (the unchecked rest is caught by the reads that touch it). Raises
    :class:`StateCorruptError` naming the first problem found.

    The deadline is checked before each table; inside one large table a timer thread calls
    ``sqlite3_interrupt`` (safe from any thread) at the deadline, because the check is one long
    VM step that a progress handler cannot stop. A lock keeps that call off later statements.
    """
    deadline = time.monotonic() + budget_s
    lock = threading.Lock()
    checking = True

    def interrupt() -> None:
        with lock:
            if checking:
                connection.interrupt()

    timer = threading.Timer(budget_s, interrupt)
    timer.daemon = True
    timer.start()
    try:
        for (table,) in connection.execute(_TABLES_QUERY).fetchall():
            if time.monotonic() >= deadline:
                return _check_stopped(path, budget_s)
            rows = connection.execute(f"PRAGMA quick_check({_quoted(table)})").fetchall()
            problems = [str(row[0]) for row in rows if row[0] != "ok"]
            if problems:
                raise _corrupt(path, problems[0][:200])
    except sqlite3.OperationalError as error:
        if "interrupted" in str(error):
            return _check_stopped(path, budget_s)
        raise _corrupt(path, _name_of(error)) from None
    except sqlite3.DatabaseError as error:
        raise _corrupt(path, _name_of(error)) from None
    finally:
        with lock:
            checking = False
        timer.cancel()
        timer.join()
    return True


def _check_stopped(path: Path, budget_s: float) -> bool:
    log.info("quick check of %s stopped at its %.1f s budget (a large file)", path.name, budget_s)
    return False


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def damage_error(path: Path, error: sqlite3.DatabaseError) -> StateCorruptError | None:
    """The :class:`StateCorruptError` for ``path`` when ``error`` says the file is damaged
    (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``), else None (locked, missing table, ...)."""
    found = sqlite_result(error)
    if found is None or found[0] not in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return None
    damaged = _corrupt(path, found[1])
    damaged.sqlite_message = str(error)[:200]  # SQLite's fixed text, never a value
    return damaged


def _corrupt(path: Path, detail: str) -> StateCorruptError:
    return StateCorruptError(
        f"the piwf state database {path.name} is damaged ({detail}); " + CORRUPT_ADVICE
    )


def _name_of(error: sqlite3.Error) -> str:
    """SQLite's result name (``SQLITE_CORRUPT``), also on Pythons whose errors carry no code."""
    found = sqlite_result(error)
    return type(error).__name__ if found is None else found[1]
