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
   time the run itself took (the runner's upload, for context), and the time of
   ``Client.get_run`` reading the complete value in process.
3. **A runner reads it back**: a run makes a ``--mib`` MiB output, then stops at a checkpoint
   (its runner exits); answering it starts a new runner generation that reads the saved steps,
   the large output by ``content.read`` in 512 KiB parts. Prints the time from the answer to
   the run's completion and how many parts the runner read.

``--tables 1,3`` selects tables. Nothing here asserts a speed; docs/PROTOCOL.md quotes the figures.
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
from tests.bench.common import REPOSITORY, percentile, poll, scratch_dir
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
        began = time.perf_counter()
        got = client.get_run(run.run_id)
        get_s = time.perf_counter() - began
        if hashlib.sha256(canonical.encode(got.output)).hexdigest() != done.output_ref.sha256:
            raise SystemExit("Client.get_run returned another value")
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
    print(f"`Client.get_run` of it, complete and verified (in process): {get_s:.2f} s")
    print(f"the run itself (compute, 512 KiB uploads, commit): {run_s:.2f} s")


#: A large output, a checkpoint its runner exits at, then a node that reads the output back.
READ_BACK = """
from piwf.workflow import checkpoint, compute, define_workflow


def make(ctx):
    n = ctx.input["n"]
    return {"blob": "".join(f"{i:08d}|" for i in range(n)), "n": n}


workflow = define_workflow(
    name="read_back",
    start_at="make",
    nodes={
        "make": compute(make),
        "hold": checkpoint(summary="hold", run=lambda ctx: {"n": ctx.input["n"]}),
        "measure": compute(lambda ctx: {"length": len(ctx.outputs["make"]["blob"])}),
    },
    edges=[{"from": "make", "to": "hold"}, {"from": "hold", "to": "measure"}],
)
"""


def runner_reads_back(directory: Path, mib: int) -> None:
    """Table 3: a new runner generation reads a ``mib`` MiB output back in parts."""
    n = mib * 1024 * 1024 // 9
    workflow = directory / "read_back.py"
    workflow.write_text(READ_BACK)
    home = directory / "h"
    with PiwfServer(home) as server, server.client() as client:
        run = client.start_run(workflow, input={"n": n})
        (request,) = poll(
            lambda: client.list_requests(run.run_id, content_limit=0),
            timeout_s=600,
            what="the run's checkpoint",
        )
        began = time.perf_counter()
        client.answer(request.request_id, {"ok": True})
        done = client.wait_run(run.run_id, timeout_s=3600, content_limit=0)
        resume_s = time.perf_counter() - began
        if done.run.status != "completed":
            raise SystemExit(f"the resumed run did not complete: {done.run}")
        if done.output != {"length": n * 9}:
            raise SystemExit(f"the resumed run read another value: {done.output}")
    parts = -(-(n * 9 + 30) // CONTENT_PART_BYTES)
    print(f"\nA new runner reads back a {mib} MiB output ({parts} parts of 512 KiB)\n")
    print(f"answer to completion (launch, read, verify, finish): {resume_s:.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.content_transfer")
    parser.add_argument("--mib", type=int, default=50, help="size of the value (MiB)")
    parser.add_argument("--seconds", type=float, default=3.0, help="idle baseline length")
    parser.add_argument("--tables", default="1,2,3", help="which tables, e.g. 2,3")
    args = parser.parse_args(argv)
    tables = {int(table) for table in args.tables.split(",")}
    print(f"Python {sys.version.split()[0]}, SQLite {__import__('sqlite3').sqlite_version}")
    if 1 in tables:
        with scratch_dir() as directory:
            part_reads(directory, args.mib)
    if 2 in tables:
        with scratch_dir() as directory:
            during_transfer(directory, args.mib, args.seconds)
    if 3 in tables:
        with scratch_dir() as directory:
            runner_reads_back(directory, args.mib)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
