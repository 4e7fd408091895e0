"""The child of ``test_start_methods``' sentinel driver (imported by name in a forked child)."""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection, wait
from pathlib import Path


def serve(connection: Connection, eof_marker: str) -> None:
    """Answer each request with whether this process's parent sentinel is at end-of-file
    (``eof``/``open``); once it is, write ``eof`` to ``eof_marker`` and return."""
    parent = multiprocessing.parent_process()
    assert parent is not None and parent.sentinel is not None
    sentinel = parent.sentinel
    connection.send_bytes(b"ready")
    while True:
        ready = wait([sentinel, connection])
        if sentinel not in ready:
            try:
                connection.recv_bytes()
            except EOFError:  # the driver is gone: its sentinel end follows at once
                ready = wait([sentinel], 5)
            else:
                connection.send_bytes(b"eof" if wait([sentinel], 0) else b"open")
                continue
        if sentinel in ready:
            Path(eof_marker).write_text("eof")
            return
