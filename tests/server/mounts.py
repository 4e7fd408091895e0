"""Small tmpfs mounts for tests that need a full or a read-only file system (root only).

A mount is made in a fresh directory under /tmp and always unmounted in a ``finally`` (lazily
if a process still holds it). Where the test runs without root, or the kernel refuses the
mount (a container without ``CAP_SYS_ADMIN``), the test is skipped with that reason; CI runs
as root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(size: str, *, read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (``mount -o size=``) and yield its directory."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("mount(8) is not installed")
    directory = Path(tempfile.mkdtemp(prefix="pwmnt", dir="/tmp"))
    options = f"size={size},mode=0700" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if mounted.returncode != 0:
        directory.rmdir()
        pytest.skip(f"mount refused a tmpfs: {mounted.stderr.strip()[:200]}")
    try:
        yield directory
    finally:
        unmounted = subprocess.run(
            ["umount", str(directory)], capture_output=True, timeout=30, check=False
        )
        if unmounted.returncode != 0:  # still busy: detach now, freed when the last user ends
            subprocess.run(["umount", "-l", str(directory)], timeout=30, check=False)
        with contextlib.suppress(OSError):
            directory.rmdir()
