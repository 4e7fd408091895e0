"""How a client connection moves frames: the :class:`Transport` seam and its Unix-socket side.

:class:`~piwf.client.connection.ServerConnection` (the hello check, the reader thread, request
routing) works on frames, not on a socket, so the same connection runs over either carrier::

    ServerConnection ── Transport ─┬─ SocketTransport      the server's Unix socket: a byte
                                   │                        stream cut into LF frames here
                                   └─ WebSocketTransport   a piwf relay (client/websocket.py):
                                                            one frame per binary message

A transport hands over whole frame bodies (no trailing LF) that passed the byte-level frame
rules, and sends frames as :func:`piwf.protocol.encode_message` made them (LF included); what a
frame says is the connection's business. Which transport a :class:`~piwf.client.Client` gets is
its :class:`Connector`'s choice (``client/connectors.py``, ``client/websocket.py``).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Final, Protocol

from piwf.protocol.framing import FrameDecoder

_RECV_BYTES: Final = 64 * 1024


class PeerClosedError(Exception):
    """The other end closed the connection; the message says who and, when known, why."""


class Transport(Protocol):
    """One open connection that carries client-protocol frames both ways.

    ``send_frame`` may be called from one thread while another waits in ``receive``;
    ``shutdown`` may be called from any thread and wakes a waiting ``receive``.
    """

    def set_timeout(self, timeout_s: float | None) -> None:
        """Bound each later ``receive`` (and, where the carrier can, each send) in seconds."""

    def send_frame(self, frame: bytes) -> None:
        """Send one frame (canonical JSON and its LF); raises :class:`OSError` on failure."""

    def receive(self) -> list[bytes]:
        """Return the next frames (possibly none yet, when a read completed no frame).

        Raises :class:`TimeoutError` when nothing arrived within the timeout,
        :class:`PeerClosedError` when the peer closed, :class:`OSError` on a transport failure
        and :class:`~piwf.protocol.errors.FrameError` when the peer broke the frame rules.
        """
        ...

    def shutdown(self) -> None:
        """Stop both directions now (idempotent); a waiting ``receive`` returns or raises."""

    def close(self) -> None:
        """Release the connection (after :meth:`shutdown`, or instead of it)."""


class Connector(Protocol):
    """Where a :class:`~piwf.client.Client` connects, and how."""

    @property
    def where(self) -> str:
        """What is connected to, for messages (``the piwf server at PATH``)."""
        ...

    def silent_hint(self) -> str:
        """What to do about a server that accepts connections but says nothing (appended to
        the error, after ``; ``), or ``""`` when there is nothing to add."""
        ...

    def connect(self, *, autostart: bool, timeout_s: float) -> Transport:
        """Open a new transport to the server (starting one if ``autostart`` and allowed).

        Raises :class:`~piwf.client.sockets.TransportError` for a failure worth a retry and
        a :class:`~piwf.errors.ServerError` (or :class:`~piwf.errors.MissingExtraError`) for
        one that is not.
        """
        ...


class SocketTransport:
    """A :class:`Transport` over a connected stream socket: newline frames, bounded by
    :class:`~piwf.protocol.FrameDecoder` (1 MiB, the rules of docs/PROTOCOL.md §1)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._decoder = FrameDecoder()

    def set_timeout(self, timeout_s: float | None) -> None:
        self._sock.settimeout(timeout_s)

    def send_frame(self, frame: bytes) -> None:
        self._sock.sendall(frame)

    def receive(self) -> list[bytes]:
        data = self._sock.recv(_RECV_BYTES)
        if not data:
            self._decoder.finish()
            raise PeerClosedError("the server closed the connection")
        return self._decoder.feed(data)

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()
