"""How long the server's open check (``PRAGMA quick_check``, table by table) takes.

``python -m tests.bench.quick_check [--mb 64,256,1024]`` builds a piwf state database of each
size in a temporary directory (the space in blobs of 256 KiB, as run outputs are kept), then
prints per size: the whole check with no budget, a writer open with the default budget and an
open with the check off. The file was just written, so the page cache is warm: a cold cache
reads at the disk's speed instead. Nothing here is asserted; it only prints figures.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from piwf.state import StateDatabase, blobs, open_check

BLOB_BYTES = 256 * 1024
PER_TRANSACTION = 64


def build(path: Path, megabytes: int) -> None:
    with StateDatabase(path) as db:
        count = megabytes * 1024 * 1024 // BLOB_BYTES
        for start in range(0, count, PER_TRANSACTION):
            with db.write() as tx:
                for _ in range(min(PER_TRANSACTION, count - start)):
                    blobs.put_text(tx, secrets.token_hex(BLOB_BYTES // 2))
        db.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def timed(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return time.perf_counter() - started


def measure(megabytes: int, directory: Path) -> dict[str, float]:
    home = directory / f"h{megabytes}"
    home.mkdir(mode=0o700)
    path = home / "state.sqlite"
    build(path, megabytes)
    size_mb = path.stat().st_size / 1e6
    with StateDatabase(path) as db:
        full = timed(lambda: open_check.bounded_quick_check(db.connection, path, 3600))
    checked = timed(lambda: StateDatabase(path).close())
    unchecked = timed(lambda: StateDatabase(path, quick_check_s=0).close())
    return {"size_mb": size_mb, "full_s": full, "open_s": checked, "open_unchecked_s": unchecked}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.quick_check")
    parser.add_argument("--mb", default="64,256,1024", help="comma-separated sizes in MiB")
    sizes = [int(part) for part in parser.parse_args().mb.split(",")]
    directory = Path(tempfile.mkdtemp(prefix="pwqc", dir="/tmp"))
    budget = open_check.QUICK_CHECK_BUDGET_S
    try:
        print(f"| file MB | whole check s | MB/s | open, {budget:g} s budget | open, no check |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for megabytes in sizes:
            row = measure(megabytes, directory)
            rate = row["size_mb"] / row["full_s"]
            print(
                f"| {row['size_mb']:.0f} | {row['full_s']:.3f} | {rate:.0f} "
                f"| {row['open_s']:.3f} | {row['open_unchecked_s']:.3f} |"
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
