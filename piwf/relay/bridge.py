"""One relay pair: a WebSocket and the server-socket connection opened for it, coupled.

Frames are carried unchanged; only their delimiting differs (docs/REMOTE.md, "The mapping")::

    WebSocket  ── binary message: frame body ──▶ check_frame ──▶ body + LF ──▶ server socket
    WebSocket  ◀── binary message: frame body ── FrameDecoder ◀── LF frames ── server socket

Nothing is parsed beyond the byte-level frame rules and nothing is logged. Whichever side ends
first ends the pair: the server socket is closed and the WebSocket gets a close frame whose code
and reason say why (:class:`Ending`). Backpressure is end to end: a frame is read from one side
only once the other side took the previous one, so a slow remote reader meets the server's own
output cap for its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from piwf.client.sockets import NotListeningError, check_socket_path
from piwf.protocol.errors import FrameError, FrameTooLargeError
from piwf.protocol.framing import NEWLINE, FrameDecoder, check_frame

_READ_BYTES: Final = 64 * 1024
#: RFC 6455 close codes the relay sends.
NORMAL_CLOSURE: Final = 1000
GOING_AWAY: Final = 1001
UNSUPPORTED_DATA: Final = 1003
POLICY_VIOLATION: Final = 1008
MESSAGE_TOO_BIG: Final = 1009
INTERNAL_ERROR: Final = 1011


@dataclass(frozen=True)
class Ending:
    """Why a pair ended: the close code and reason its WebSocket is given (reason <= 123 B)."""

    code: int
    reason: str


SERVER_CLOSED: Final = Ending(NORMAL_CLOSURE, "the piwf server closed the connection")
SERVER_BROKE_FRAMING: Final = Ending(INTERNAL_ERROR, "the piwf server broke the frame rules")
TEXT_MESSAGE: Final = Ending(UNSUPPORTED_DATA, "piwf.client.v1 frames travel as binary messages")
RELAY_STOPPING: Final = Ending(GOING_AWAY, "the piwf relay is stopping")


@dataclass
class Upstream:
    """The relay's connection to the server socket, opened for one WebSocket."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


async def open_upstream(socket_path: Path) -> Upstream:
    """Connect to the server socket, checked as every client checks it.

    Raises :class:`~piwf.client.sockets.NotListeningError` when no server listens,
    :class:`~piwf.client.sockets.UnsafeSocketError` for an unsafe path and
    :class:`OSError` for other failures.
    """
    check_socket_path(socket_path)
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
    except (FileNotFoundError, ConnectionRefusedError):
        raise NotListeningError from None
    return Upstream(reader, writer)


async def carry(websocket: ServerConnection, upstream: Upstream) -> None:
    """Carry frames both ways until one side ends, then close the other (always both)."""
    to_server = asyncio.ensure_future(_client_to_server(websocket, upstream.writer))
    to_client = asyncio.ensure_future(_server_to_client(upstream.reader, websocket))
    try:
        done, _ = await asyncio.wait({to_server, to_client}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        to_server.cancel()
        to_client.cancel()
        upstream.close()
    ending = next(iter(done)).result()
    if ending is not None:
        await websocket.close(ending.code, ending.reason)


async def _client_to_server(
    websocket: ServerConnection, writer: asyncio.StreamWriter
) -> Ending | None:
    """Forward each message as one frame; None when the WebSocket closed first."""
    try:
        async for message in websocket:
            if isinstance(message, str):
                return TEXT_MESSAGE
            try:
                check_frame(message)
            except FrameTooLargeError as error:
                return Ending(MESSAGE_TOO_BIG, str(error))
            except FrameError as error:
                return Ending(POLICY_VIOLATION, f"not a piwf.client.v1 frame: {error}")
            writer.write(message + NEWLINE)
            await writer.drain()
    except ConnectionClosed:
        return None
    except OSError:
        return SERVER_CLOSED
    return None


async def _server_to_client(
    reader: asyncio.StreamReader, websocket: ServerConnection
) -> Ending | None:
    """Forward each server frame as one binary message; None when the WebSocket went away."""
    decoder = FrameDecoder()
    try:
        while True:
            data = await reader.read(_READ_BYTES)
            if not data:
                decoder.finish()
                return SERVER_CLOSED
            for frame in decoder.feed(data):
                await websocket.send(frame)
    except FrameError:
        return SERVER_BROKE_FRAMING
    except ConnectionClosed:
        return None
    except OSError:
        return SERVER_CLOSED


async def close_quietly(websocket: ServerConnection, ending: Ending) -> None:
    """Close ``websocket`` with ``ending``; a connection already gone is fine."""
    with contextlib.suppress(ConnectionClosed, OSError):
        await websocket.close(ending.code, ending.reason)
