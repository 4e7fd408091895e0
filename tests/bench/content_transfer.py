"""Large values by content reference: what one part read costs, and whether the server stays
responsive while a client pulls a large value.

``python -m tests.bench.content_transfer [--mib 50] [--seconds 3]`` prints two tables:

1. **Part reads** of one ``--mib`` blob in 512 KiB parts, each in its own read transaction, the
   way ``view.content`` reads them: through an incremental blob handle (``blobopen``, Python
   3.11+) and through the ``substr()`` fallback of Python 3.10 (per-part p50/p99/max, total).
2. **During a transfer**: a real server completes a run whose output is ``--mib`` MiB; then
   ``piwf run show RUN --json`` (the installed script, a subprocess) reads it while a second
   client polls ``server.status`` back to back. Prints the status p50/p99/max during the
   transfer, the same with no transfer for ``--seconds`` (the baseline), the round trip of the
   ``run.get`` that advertises the reference (no part read), the time of the run show, and the
   time the run itself took (the runner's upload, for context).

Nothing here asserts a speed; docs/PROTOCOL.md quotes the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from piwf import canonical
from piwf.client import Client
from piwf.config import CONTENT_PART_BYTES
from piwf.state import StateDatabase, blobs
from piwf.state.enums import MediaType
from tests.bench.common import REPOSITORY, percentile, scratch_dir
from tests.bench.piwf_side import PiwfServer, server_environment

PIWF = Path(sys.executable).parent / "piwf"

BIG_OUTPUT = REPOSITORY / "fixtures" / "workflows" / "big_output.py"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def spread(samples: list[float]) -> str:
    return (
        f"{ms(percentile(samples, 50))} | {ms(percentile(samples, 99))} | "
        f"{ms(max(samples))} | {len(samples)}"
    )


def part_reads(directory: Path, mib: int) -> None:
    """Table 1: every part of one blob through each reader, one read transaction per part."""
    data = os.urandom(mib * 1024 * 1024 // 2).hex().encode("ascii")
    with StateDatabase(directory / "state.sqlite") as db:
        with db.write() as tx:
            digest = blobs.put_bytes(tx, data, MediaType.TEXT)
        readers: dict[str, Callable[..., bytes]] = {"substr() (3.10 fallback)": _substr}
        if sys.version_info >= (3, 11):
            readers["blobopen (3.11+)"] = blobs._read_range_incremental
        print(f"\nPart reads of a {mib} MiB blob in 512 KiB parts (ms per part)\n")
        print("| reader | p50 | p99 | max | parts | total ms |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, reader in readers.items():
            samples: list[float] = []
            assembled = bytearray()
            for offset in range(0, len(data), CONTENT_PART_BYTES):
                began = time.perf_counter()
                with db.read() as tx:
                    blob = blobs.peek(tx, digest, inline_limit=-1)
                    assert blob is not None
                    length = min(CONTENT_PART_BYTES, blob.length - offset)
                    assembled += reader(tx, blob.rowid, offset, length)
                samples.append(time.perf_counter() - began)
            if bytes(assembled) != data:
                raise SystemExit(f"{name} read other bytes")
            print(f"| {name} | {spread(samples)} | {sum(samples) * 1000:.0f} |")


def _substr(tx: object, rowid: int, offset: int, length: int) -> bytes:
    return blobs._read_range_substr(tx, rowid, offset, length)  # type: ignore[arg-type]


def poll_status(home: Path, stop: threading.Event, samples: list[float]) -> None:
    """Send ``server.status`` back to back until ``stop``; record each round trip."""
    with Client(home, autostart=False) as client:
        client.server_status()  # connected and warm before measuring
        while not stop.is_set():
            began = time.perf_counter()
            client.server_status()
            samples.append(time.perf_counter() - began)


def during_transfer(directory: Path, mib: int, seconds: float) -> None:
    """Table 2: status latency while ``piwf run show --json`` pulls a ``mib`` MiB output."""
    n = mib * 1024 * 1024 // 9  # nine bytes per item: a ``mib`` MiB output
    workflow = BIG_OUTPUT
    home = directory / "h"
    with PiwfServer(home) as server, server.client() as client:
        began = time.perf_counter()
        run = client.start_run(workflow, input={"n": n})
        done = client.wait_run(run.run_id, timeout_s=600, content_limit=0)
        run_s = time.perf_counter() - began
        if done.run.status != "completed" or done.output_ref is None:
            raise SystemExit(f"the run did not complete with a referenced output: {done.run}")

        first_response: list[float] = []
        for _ in range(20):
            began = time.perf_counter()
            client.get_run(run.run_id, content_limit=0)
            first_response.append(time.perf_counter() - began)

        baseline: list[float] = []
        stop = threading.Event()
        poller = threading.Thread(target=poll_status, args=(home, stop, baseline))
        poller.start()
        stop.wait(seconds)
        stop.set()
        poller.join()

        during: list[float] = []
        stop = threading.Event()
        poller = threading.Thread(target=poll_status, args=(home, stop, during))
        poller.start()
        began = time.perf_counter()
        try:
            shown = subprocess.run(
                [str(PIWF), "run", "show", run.run_id, "--json"],
                env=server_environment(home),
                capture_output=True,
                timeout=600,
                check=False,
            )
        finally:
            stop.set()
            poller.join()
        show_s = time.perf_counter() - began
        if shown.returncode != 0:
            raise SystemExit(f"run show failed: {shown.stderr.decode()[:500]}")
        output = canonical.parse(shown.stdout)
        assert isinstance(output, dict)
        expected = done.output_ref.sha256
        if hashlib.sha256(canonical.encode(output["output"])).hexdigest() != expected:
            raise SystemExit("run show printed another value")
    length = done.output_ref.length
    print(f"\nserver.status round trips (ms) while `piwf run show --json` reads {length:,} bytes\n")
    print("| while | p50 | p99 | max | samples |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| idle ({seconds:g} s) | {spread(baseline)} |")
    print(f"| run show transfers | {spread(during)} |")
    print(f"| `run.get` itself (references only, no part read) | {spread(first_response)} |")
    print(f"\n`piwf run show --json` of the {mib} MiB output: {show_s:.2f} s")
    print(f"the run itself (compute, 512 KiB uploads, commit): {run_s:.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.content_transfer")
    parser.add_argument("--mib", type=int, default=50, help="size of the value (MiB)")
    parser.add_argument("--seconds", type=float, default=3.0, help="idle baseline length")
    args = parser.parse_args(argv)
    print(f"Python {sys.version.split()[0]}, SQLite {__import__('sqlite3').sqlite_version}")
    with scratch_dir() as directory:
        part_reads(directory, args.mib)
    with scratch_dir() as directory:
        during_transfer(directory, args.mib, args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
