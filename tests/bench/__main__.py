"""Run the benchmark figures: ``python -m tests.bench [--smoke] [--figures 1,3] [--out FILE]``.

``tox -e bench`` runs every figure at full size; ``tox -e bench-smoke`` runs every figure at
tiny sizes and fails when one produced no numbers (it never judges how fast anything is). Each
figure prints a Markdown table; the results, with the machine description, go to one JSON
file (``--out``, else ``$PIWF_BENCH_OUT``, else ``bench-results/bench-<size>-<time>.json``).
See docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.bench import peers
from tests.bench.common import REPOSITORY, Figure, has_numbers, machine
from tests.bench.fig_cli import figure_cli
from tests.bench.fig_control import figure_control_plane, figure_growth, figure_memory
from tests.bench.fig_mixed import figure_mixed_pool
from tests.bench.fig_recovery import figure_recovery
from tests.bench.fig_runs import Context, figure_latency, figure_per_node, figure_throughput
from tests.bench.sizes import FULL, SMOKE

FIGURES: dict[int, Callable[[Context], Figure]] = {
    1: figure_throughput,
    2: figure_latency,
    3: figure_per_node,
    4: figure_control_plane,
    5: figure_recovery,
    6: figure_growth,
    7: figure_memory,
    8: figure_mixed_pool,
    9: figure_cli,
}
SYSTEMS = ("piwf", "dbos", "huey")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; check figures exist")
    parser.add_argument(
        "--figures",
        default=",".join(str(n) for n in FIGURES),
        help="comma-separated figure numbers (default: all)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated systems to measure; piwf is always measured",
    )
    parser.add_argument("--out", type=Path, default=None, help="results JSON file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    sizes = SMOKE if args.smoke else FULL
    numbers = [int(part) for part in args.figures.split(",") if part.strip()]
    unknown = [n for n in numbers if n not in FIGURES]
    systems = frozenset({"piwf", *(s.strip() for s in args.systems.split(",") if s.strip())})
    if unknown or not systems <= set(SYSTEMS):
        print(f"unknown figures {unknown} or systems {sorted(systems)}", file=sys.stderr)
        return 2
    missing = [name for name in systems - {"piwf"} if not peers.available(name)]
    if missing:
        print(
            f"peer packages not installed: {', '.join(missing)}; run `tox -e bench` (or "
            "`tox -e bench-smoke`), which installs them, or pass --systems piwf",
            file=sys.stderr,
        )
        return 2
    out = args.out or Path(os.environ.get("PIWF_BENCH_OUT") or _default_out(sizes.name))
    context = Context(sizes, systems)
    results: dict[str, object] = {
        "suite": sizes.name,
        "machine": machine(),
        "sizes": sizes.__dict__,
        "systems": sorted(systems),
        "figures": [],
    }
    failed: list[str] = []
    began = time.perf_counter()
    for number in numbers:
        started = time.perf_counter()
        try:
            figure = FIGURES[number](context)
        except Exception:
            failed.append(f"figure {number} raised:\n{traceback.format_exc()}")
            print(f"## Figure {number}: FAILED\n", flush=True)
            continue
        figure.seconds = time.perf_counter() - started
        print(figure.render(), flush=True)
        if not figure.rows or not has_numbers(figure.numbers):
            failed.append(f"figure {number} produced no numbers")
        results["figures"].append(figure.to_json())  # type: ignore[attr-defined]
    results["seconds"] = time.perf_counter() - began
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"results: {out} ({results['seconds']:.0f} s)")
    for failure in failed:
        print(failure, file=sys.stderr)
    produced = len(numbers) - len(failed)
    print(f"{produced} passed, {len(failed)} failed")
    return 1 if failed else 0


def _default_out(name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return REPOSITORY / "bench-results" / f"bench-{name}-{stamp}.json"


if __name__ == "__main__":
    sys.exit(main())
