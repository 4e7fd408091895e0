"""Process identity: a pid plus its start time and the boot id, never a bare pid.

A pid is reused by the kernel; ``pid:create_time:boot_id`` is not, so a registry keyed by it
never signals an unrelated process that inherited a dead child's pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """Return the kernel boot id (empty where the platform has none)."""
    try:
        return _BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        return ""


def start_identity(pid: int) -> str | None:
    """Return the start identity of a live process, or None when it does not exist."""
    try:
        created = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return f"{pid}:{created:.3f}:{boot_id()}"


def own_identity() -> str:
    """Return this process's start identity."""
    identity = start_identity(os.getpid())
    assert identity is not None
    return identity


def is_alive(identity: str) -> bool:
    """Whether the exact process recorded as ``identity`` still runs."""
    pid_text, _, _ = identity.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    current = start_identity(pid)
    if current is None:
        return False
    if current != identity:
        return False
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def kill_orphan_groups(pids: list[int], timeout_s: float = 2.0) -> None:
    """SIGKILL each process group, then wait (bounded, for all at once) until each is gone.

    An orphan of a dead server is no child of this one: only its new parent reaps it, so a
    zombie counts as gone (it can no longer act). Waiting one by one would cost a restart the
    reaping delay of every orphan in turn.
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    pending = set(pids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    pending.discard(pid)
            except psutil.NoSuchProcess:
                pending.discard(pid)
        if pending:
            time.sleep(0.01)  # a bounded poll of processes we cannot wait on
