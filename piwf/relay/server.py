"""``piwf relay``: the loopback WebSocket listener and the admission of each connection.

::

    remote piwf view ── SSH tunnel ── 127.0.0.1:PORT ── Relay ── a pair per WebSocket ── server.sock
                                      (loopback only)     │       (bridge.carry)
                                                          └ admission, in the opening handshake:
                                                            no Origin header (no browser), the
                                                            peer socket's uid is ours (peer.py),
                                                            then the server connection opens

A WebSocket is accepted only once its own connection to the server socket is open, so a refusal
is an HTTP answer the client can read (403: not this user or a browser; 503: no server). The
relay opens no database and reads no message; it runs until SIGINT or SIGTERM, then closes every
pair (``1001``, "the piwf relay is stopping") and returns.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Final

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from piwf.client.sockets import NotListeningError, UnsafeSocketError
from piwf.config import MAX_FRAME_BYTES, ServerPaths
from piwf.errors import RelayError
from piwf.relay.bridge import RELAY_STOPPING, Upstream, carry, close_quietly, open_upstream
from piwf.relay.peer import peer_uid

#: The opening handshake's deadline; a server connection opened for a handshake that never
#: completes is closed this much later at the latest.
OPEN_TIMEOUT_S: Final = 10.0
_SILENT = logging.getLogger("piwf.relay.websockets")
# websockets logs frames (payload excerpts) at debug level: this relay logs nothing of it.
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False
_SILENT.setLevel(logging.CRITICAL + 1)

Notice = Callable[[str], None]


class Relay:
    """Relays WebSocket connections on ``address``:``port`` to the server of ``home``.

    ``notice`` receives one safe line per refused connection (a uid, never a payload).
    """

    def __init__(self, home: Path, address: str, port: int, notice: Notice) -> None:
        self.socket_path = ServerPaths(home).socket
        self.address = address
        self.port = port
        self._notice = notice
        self._uid = os.geteuid()
        self._pending: dict[ServerConnection, Upstream] = {}
        self._active: set[ServerConnection] = set()

    async def run(self, ready: Callable[[list[str]], None]) -> None:
        """Listen, call ``ready`` with the ``ws://`` URLs listened on, serve until a signal.

        Raises :class:`~piwf.errors.RelayError` when it cannot listen.
        """
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            try:
                server = await self._listen()
            except OSError as error:
                where = _url((self.address, self.port))
                cause = error.strerror or str(error)
                if error.errno == errno.EADDRINUSE:
                    free = f"[{self.address}]" if ":" in self.address else self.address
                    cause = (
                        f"port {self.port} is in use (another relay?); stop what listens there "
                        f"or choose another port ({free}:0 picks a free one), and "
                        "forward the SSH tunnel to that port"
                    )
                raise RelayError(f"piwf relay cannot listen on {where}: {cause}") from None
            async with server:
                ready([_url(sock.getsockname()) for sock in server.sockets])
                await stop.wait()
                server.close(close_connections=False)
                await asyncio.gather(*(close_quietly(ws, RELAY_STOPPING) for ws in self._active))
                for connection in list(self._pending):
                    self._drop_pending(connection)
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)

    async def _listen(self) -> Server:
        server: Server = await serve(
            self._carry,
            self.address,
            self.port,
            process_request=self._admit,
            process_response=self._settle,
            origins=[None],
            compression=None,
            # A body is at most the frame limit less its LF; a longer message is refused by
            # the library (close 1009) before it is buffered whole or reaches the server.
            max_size=MAX_FRAME_BYTES - 1,
            open_timeout=OPEN_TIMEOUT_S,
            server_header=None,
            logger=_SILENT,
        )
        return server

    async def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        """Admit a handshake or answer why not; on admission the server connection is open."""
        if request.headers.get("Origin") is not None:
            return _refusal(connection, HTTPStatus.FORBIDDEN, "the piwf relay serves no browser")
        owner = peer_uid(connection.remote_address[:2], connection.local_address[:2])
        if owner != self._uid:
            who = "an unknown user" if owner is None else f"uid {owner}"
            self._notice(f"piwf relay: refused a connection from {who}")
            return _refusal(
                connection,
                HTTPStatus.FORBIDDEN,
                f"the piwf relay serves only its own user (uid {self._uid}), not {who}",
            )
        try:
            upstream = await open_upstream(self.socket_path)
        except NotListeningError:
            return _refusal(
                connection,
                HTTPStatus.SERVICE_UNAVAILABLE,
                "no piwf server is running on the relay's machine; start it there: "
                "piwf server start",
            )
        except (UnsafeSocketError, OSError) as error:
            return _refusal(
                connection, HTTPStatus.SERVICE_UNAVAILABLE, f"the relay cannot reach it: {error}"
            )
        self._pending[connection] = upstream
        asyncio.get_running_loop().call_later(OPEN_TIMEOUT_S + 1, self._drop_pending, connection)
        return None

    def _settle(self, connection: ServerConnection, _request: Request, response: Response) -> None:
        if response.status_code != HTTPStatus.SWITCHING_PROTOCOLS:
            self._drop_pending(connection)

    def _drop_pending(self, connection: ServerConnection) -> None:
        upstream = self._pending.pop(connection, None)
        if upstream is not None:
            upstream.close()

    async def _carry(self, websocket: ServerConnection) -> None:
        upstream = self._pending.pop(websocket, None)
        if upstream is None:  # the handshake outlived OPEN_TIMEOUT_S + 1 s: start again
            await websocket.close(1011, "the relay's server connection timed out")
            return
        self._active.add(websocket)
        try:
            await carry(websocket, upstream)
        except Exception as error:  # a relay bug ends this pair only; its class, never data
            self._notice(f"piwf relay: a connection failed ({type(error).__name__})")
            upstream.close()
        finally:
            self._active.discard(websocket)


def _refusal(connection: ServerConnection, status: HTTPStatus, text: str) -> Response:
    return connection.respond(status, text + "\n")


def _url(address: tuple[object, ...]) -> str:
    host, port = str(address[0]), int(str(address[1]))
    return f"ws://[{host}]:{port}" if ":" in host else f"ws://{host}:{port}"


def serve_relay(
    home: Path,
    address: str,
    port: int,
    *,
    ready: Callable[[list[str]], None],
    notice: Notice,
) -> None:
    """Run a :class:`Relay` on ``address`` (one loopback IP) until SIGINT or SIGTERM."""
    asyncio.run(Relay(home, address, port, notice).run(ready))
