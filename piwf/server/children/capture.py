"""Bounded capture of what children (and the standard library's helper processes) print.

One :class:`OutputCapture` owns a ``0600`` log file and reads any number of pipe read ends
from the server's selector without blocking. At most ``cap`` bytes reach the file; the first
byte past the cap calls ``on_flood`` once (the supervisor kills a flooding child) and the rest
is read and dropped, so a writer can neither fill the disk nor stall on a full pipe while the
loop runs. A full disk costs the bytes that did not fit, nothing more.
"""

from __future__ import annotations

import contextlib
import os
import selectors
from collections.abc import Callable
from pathlib import Path

from piwf.config import FILE_MODE
from piwf.server.failures import log_failure
from piwf.server.loop import EventLoop
from piwf.state.failures import state_error_of_os

READ_BYTES = 65536


class OutputCapture:
    """The captured output of one process (or group of processes) in one log file."""

    def __init__(
        self,
        loop: EventLoop,
        log_path: Path,
        cap: int,
        *,
        label: str,
        on_flood: Callable[[], None] = lambda: None,
        fresh: bool = False,
    ) -> None:
        """``fresh``: start the log empty (else captured output is appended to it)."""
        self.loop = loop
        self.log_path = log_path
        self.cap = cap
        self.label = label
        self.on_flood = on_flood
        self.captured = 0
        self.flooded = False
        self.streams: list[int] = []
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        descriptor = os.open(log_path, flags | (os.O_TRUNC if fresh else 0), FILE_MODE)
        os.close(descriptor)

    def watch(self, descriptor: int) -> None:
        """Read ``descriptor`` (a pipe's read end, owned by this capture from now on)."""
        os.set_blocking(descriptor, False)
        self.streams.append(descriptor)
        self.loop.selector.register(descriptor, selectors.EVENT_READ, self._reader(descriptor))

    def close(self) -> None:
        """Stop reading and close every stream."""
        for descriptor in self.streams:
            with contextlib.suppress(KeyError, ValueError):
                self.loop.selector.unregister(descriptor)
            with contextlib.suppress(OSError):
                os.close(descriptor)
        self.streams = []

    def _reader(self, descriptor: int) -> Callable[[int], None]:
        def read(_mask: int) -> None:
            try:
                data = os.read(descriptor, READ_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if data:
                self._capture(data)
                return
            with contextlib.suppress(KeyError, ValueError):
                self.loop.selector.unregister(descriptor)

        return read

    def _capture(self, data: bytes) -> None:
        room = self.cap - self.captured
        if room > 0:
            try:
                with open(self.log_path, "ab") as log:
                    log.write(data[:room])
            except OSError as error:
                log_failure(
                    f"capturing the output of {self.label}",
                    state_error_of_os(error, "writing captured output"),
                )
        self.captured += len(data)
        if self.captured > self.cap and not self.flooded:
            self.flooded = True
            self.on_flood()
