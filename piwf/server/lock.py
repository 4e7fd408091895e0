"""The single-instance lock: an ``flock`` on ``server/server.lock`` held for the server's life.

The kernel drops the lock when the process dies, however it dies, so holding it proves no other
live server uses this state home. The file records the holder's pid and start identity for
error messages; it is never deleted, so two servers can never lock two different inodes.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from piwf.config import FILE_MODE
from piwf.errors import ServerRunningError


class InstanceLock:
    """An exclusive, non-blocking ``flock`` on one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._descriptor: int | None = None

    def acquire(self, identity: str) -> None:
        """Take the lock and record ``identity``; raise :class:`ServerRunningError` if held."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(self.path, flags, FILE_MODE)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(descriptor)
            os.close(descriptor)
            raise ServerRunningError(
                f"a piwf server{holder} is already running for this state home; use it, or"
                " stop it first (piwf server stop)"
            ) from None
        os.ftruncate(descriptor, 0)
        record = json.dumps({"pid": os.getpid(), "startIdentity": identity}).encode()
        os.pwrite(descriptor, record, 0)
        os.fsync(descriptor)
        self._descriptor = descriptor

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases the ``flock``)."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def _read_holder(descriptor: int) -> str:
    try:
        data = os.pread(descriptor, 4096, 0)
        pid = json.loads(data.decode()).get("pid")
    except (OSError, ValueError, AttributeError):
        return ""
    return f" (pid {pid})" if isinstance(pid, int) else ""
