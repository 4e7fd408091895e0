"""Shared pieces of the benchmark suite: statistics, tables, polling, temp dirs, the machine.

Nothing here measures anything; the figures in :mod:`tests.bench.figures` do.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

REPOSITORY = Path(__file__).resolve().parents[2]
#: Polling interval of benchmark drivers waiting for a condition (never a synchronisation sleep).
POLL_S = 0.005

_T = TypeVar("_T")


class BenchError(RuntimeError):
    """A benchmark could not produce its figure (a peer missing, a run failed, a timeout)."""


def poll(
    condition: Callable[[], _T], timeout_s: float, what: str, interval_s: float = POLL_S
) -> _T:
    """Return the first truthy value of ``condition``; raise :class:`BenchError` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)  # a bounded poll interval of the driver


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Spread:
    """The median of several repetitions with their min and max."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise BenchError("no repetitions produced a value")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def to_json(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}

    def show(self, scale: float = 1.0, digits: int = 1) -> str:
        """``median [min-max]`` scaled (e.g. 1000 for seconds shown as ms)."""
        m, lo, hi = (v * scale for v in (self.median, self.low, self.high))
        return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


@dataclass
class Figure:
    """One figure: a table (columns and rows of text), its raw numbers and its settings."""

    number: int
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, row: Sequence[str], key: str, values: dict[str, Any]) -> None:
        """Append a table row and the numbers behind it under ``key``."""
        self.rows.append(list(row))
        self.numbers[key] = values

    def to_json(self) -> dict[str, Any]:
        return {
            "figure": self.number,
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "numbers": self.numbers,
            "settings": self.settings,
            "notes": self.notes,
            "seconds": self.seconds,
        }

    def render(self) -> str:
        """The figure as a Markdown table with its title, settings and notes."""
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        lines = [f"## Figure {self.number}: {self.title}", ""]

        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

        lines.append(line(self.columns))
        lines.append("| " + " | ".join("-" * w for w in widths) + " |")
        lines.extend(line(row) for row in self.rows)
        if self.settings:
            lines.append("")
            lines.extend(f"- {key}: {_setting(value)}" for key, value in self.settings.items())
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"


def _setting(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key}={item}" for key, item in value.items())
    return str(value)


def has_numbers(value: Any) -> bool:
    """Whether ``value`` holds at least one finite number, and no NaN anywhere."""
    found = False

    def visit(item: Any) -> bool:
        nonlocal found
        if isinstance(item, bool):
            return True
        if isinstance(item, (int, float)):
            if isinstance(item, float) and not math.isfinite(item):
                return False
            found = True
            return True
        if isinstance(item, dict):
            return all(visit(v) for v in item.values())
        if isinstance(item, (list, tuple)):
            return all(visit(v) for v in item)
        return True

    return visit(value) and found


@contextmanager
def scratch_dir(prefix: str = "pwb") -> Iterator[Path]:
    """A private directory under /tmp (short, so socket paths fit in ``sun_path``)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def spawn_driver(command: Sequence[str]) -> subprocess.Popen[str]:
    """Start a driver subprocess in its own process group, from the repository root."""
    return subprocess.Popen(
        list(command),
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )


def collect_json(process: subprocess.Popen[str], timeout_s: float) -> Any:
    """Wait for a driver and parse the JSON of its last stdout line; kill its group after."""
    name = " ".join(str(part) for part in process.args[2:4])  # type: ignore[index]
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.communicate()
        raise BenchError(f"{name} did not finish within {timeout_s:g} s") from None
    finally:
        kill_group(process.pid)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        tail = "\n".join(err.splitlines()[-15:])
        raise BenchError(f"{name} failed ({process.returncode}):\n{tail}")
    return json.loads(lines[-1])


def run_json(command: Sequence[str], timeout_s: float) -> Any:
    """Run one driver subprocess to the end and return its JSON result."""
    return collect_json(spawn_driver(command), timeout_s)


def kill_group(pid: int) -> None:
    """SIGKILL a process group led by ``pid`` if any of it is left."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """The machine description stored with every result file."""
    cpu_model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cores": os.cpu_count(),
        "usableCores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu_model,
        "python": sys.version.split()[0],
        "pythonImplementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "loadAverageAtStart": load,
        "versions": {
            name: package_version(name) for name in ("piwf", "dbos", "huey", "sqlalchemy")
        },
    }
