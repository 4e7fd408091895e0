"""Non-blocking use of a ``multiprocessing.connection`` pipe from the server loop.

Children use ``send_bytes``/``recv_bytes(maxlength)``; the server must never block on a child,
so it speaks the same framing here without blocking: a 4-byte big-endian signed length (or -1
followed by an 8-byte length for huge messages, which are refused), then the bytes. A message
over ``max_message`` bytes, or a closed pipe, is reported instead of buffered.
"""

from __future__ import annotations

import os
import struct
from multiprocessing.connection import Connection

_HEADER = struct.Struct("!i")


class PipeClosedError(Exception):
    """The child closed its end (or died)."""


class PipeOverflowError(Exception):
    """The child announced a message larger than allowed; the pipe is unusable now."""


class PipeChannel:
    """Buffered, non-blocking reads and writes of length-prefixed messages on one pipe."""

    def __init__(self, connection: Connection, max_message: int) -> None:
        self.connection = connection
        self.fd = connection.fileno()
        self.max_message = max_message
        os.set_blocking(self.fd, False)
        self._inbox = bytearray()
        self._outbox = bytearray()

    def read_messages(self) -> list[bytes]:
        """Read what is available and return complete messages.

        Raises :class:`PipeClosedError` at end of stream (after no complete message remains) and
        :class:`PipeOverflowError` for an oversized or malformed length header.
        """
        closed = False
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except (ConnectionResetError, BrokenPipeError):
                closed = True
                break
            if not chunk:
                closed = True
                break
            self._inbox += chunk
            if len(self._inbox) > self.max_message + _HEADER.size:
                break
        messages = self._split()
        if closed and not messages:
            raise PipeClosedError("the child closed its pipe")
        return messages

    def send(self, message: bytes) -> None:
        """Queue ``message`` and write as much as the pipe takes now."""
        if len(message) > self.max_message:
            raise PipeOverflowError("message exceeds the pipe limit")
        self._outbox += _HEADER.pack(len(message)) + message
        self.flush()

    def flush(self) -> None:
        """Write queued bytes without blocking; raise :class:`PipeClosedError` if the child left."""
        while self._outbox:
            try:
                written = os.write(self.fd, self._outbox)
            except BlockingIOError:
                return
            except (BrokenPipeError, ConnectionResetError):
                raise PipeClosedError("the child closed its pipe") from None
            del self._outbox[:written]

    @property
    def wants_write(self) -> bool:
        """Whether bytes are still waiting to be written."""
        return bool(self._outbox)

    def close(self) -> None:
        """Close the server's end."""
        self.connection.close()

    def _split(self) -> list[bytes]:
        messages: list[bytes] = []
        while len(self._inbox) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._inbox)
            if length < 0 or length > self.max_message:
                raise PipeOverflowError(f"the child announced a {length}-byte message")
            end = _HEADER.size + length
            if len(self._inbox) < end:
                break
            messages.append(bytes(self._inbox[_HEADER.size : end]))
            del self._inbox[:end]
        return messages
