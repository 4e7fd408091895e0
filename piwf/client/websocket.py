"""The client's side of a piwf relay: one WebSocket that carries the client protocol.

``Client(remote="ws://127.0.0.1:8765")`` (and ``piwf view --remote``) talks to the server of
the machine where ``piwf relay`` runs, through the end of an SSH tunnel (docs/REMOTE.md). The
mapping is fixed: one client-protocol frame is one binary WebSocket message holding the frame's
canonical JSON without its LF, in both directions; the first message is the server's ``hello``.
The same byte rules and the 1 MiB limit apply (:func:`~piwf.protocol.check_frame`).

The ``websockets`` package is the optional ``piwf[relay]`` extra, imported only when a remote
client connects; without it :class:`~piwf.errors.MissingExtraError` names the install line.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from typing import TYPE_CHECKING, Final

from piwf.client.loopback import TUNNEL_HINT, NotLoopbackError, loopback_addresses
from piwf.client.sockets import TransportError
from piwf.client.transport import PeerClosedError
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import (
    InvalidArgumentError,
    MissingExtraError,
    ServerNotRunningError,
    ServerUnavailableError,
)
from piwf.protocol import check_frame

if TYPE_CHECKING:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import ClientConnection

MISSING_WEBSOCKETS: Final = (
    "a remote client (piwf view --remote, Client(remote=...)) needs the relay extra: "
    "pip install 'piwf[relay]'"
)
#: How long closing waits for the relay's side of the closing handshake.
CLOSE_TIMEOUT_S: Final = 2.0
_REFUSAL_CHARS: Final = 300
#: The form of a relay URL, as refusals name it.
REMOTE_URL_FORM: Final = "ws://127.0.0.1:PORT"


def check_remote_url(url: object) -> str:
    """Return ``url`` when it names a relay this client may use, else raise
    :class:`~piwf.errors.InvalidArgumentError` (a ``ValueError``) saying why.

    Accepted: a ``str`` ``ws://HOST:PORT`` (an optional ``/`` path) where HOST is loopback
    (:func:`~piwf.client.loopback.loopback_addresses`); the SSH tunnel carries it further.
    """
    if not isinstance(url, str):
        raise InvalidArgumentError(f"a relay is reached by a {REMOTE_URL_FORM} URL (a str)")
    if any(ord(character) < 0x21 or ord(character) == 0x7F for character in url):
        # urlsplit drops tabs and line breaks silently; a URL with them is a paste gone wrong.
        raise InvalidArgumentError(
            f"the relay URL contains a space or control character: give {REMOTE_URL_FORM}"
        )
    shown = _shown_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidArgumentError(f"{shown} is not a ws://HOST:PORT URL") from None
    if parts.scheme != "ws":
        raise InvalidArgumentError(
            f"{shown} is not a ws:// URL (the relay listens on loopback only, in plain ws; "
            "the SSH tunnel encrypts)"
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidArgumentError(
            f"{shown} carries a user name or password; the relay takes none (SSH authenticates"
            " the tunnel): give ws://HOST:PORT"
        )
    if port is None or port == 0 or parts.hostname is None:
        raise InvalidArgumentError(f"{shown} is not a ws://HOST:PORT URL")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidArgumentError(f"{shown} has a path, query or fragment; the relay takes none")
    try:
        loopback_addresses(parts.hostname)
    except NotLoopbackError as error:
        raise InvalidArgumentError(
            f"{error}; the relay is loopback-only, so {TUNNEL_HINT}"
        ) from None
    return url


def _shown_url(url: str) -> str:
    """``url`` quoted as a refusal may show it: a user name, password, path, query or fragment
    (where a token could sit) replaced by ``...``, and at most 200 characters."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "the relay URL"
    host = parts.netloc.rpartition("@")
    netloc = f"...@{host[2]}" if host[1] else parts.netloc
    path = "/..." if parts.path not in ("", "/") else parts.path
    query = "..." if parts.query else ""
    fragment = "..." if parts.fragment else ""
    shown = urllib.parse.urlunsplit((parts.scheme, netloc, path, query, fragment))
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return repr(shown)


class WebSocketTransport:
    """A :class:`~piwf.client.transport.Transport` over one relay WebSocket (sync API)."""

    def __init__(self, websocket: ClientConnection, url: str, held: contextlib.ExitStack) -> None:
        self._websocket = websocket
        self._url = url
        self._held = held
        self._timeout: float | None = None

    def set_timeout(self, timeout_s: float | None) -> None:
        self._timeout = timeout_s

    def send_frame(self, frame: bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        if not frame.endswith(b"\n"):
            raise ValueError("a frame ends with its LF")
        try:
            self._websocket.send(frame[:-1])
        except ConnectionClosed as closed:
            raise ConnectionError(self._closed(closed)) from None

    def receive(self) -> list[bytes]:
        from websockets.exceptions import ConnectionClosed

        try:
            message = self._websocket.recv(timeout=self._timeout)
        except ConnectionClosed as closed:
            raise PeerClosedError(self._closed(closed)) from None
        if isinstance(message, str):
            raise ConnectionError("the piwf relay sent a text message; frames travel as binary")
        check_frame(message)
        return [message]

    def shutdown(self) -> None:
        self._websocket.close()

    def close(self) -> None:
        self._held.close()

    def _closed(self, closed: ConnectionClosed) -> str:
        frame = closed.rcvd
        if frame is None:
            return f"the connection to the piwf relay at {self._url} was lost"
        reason = f": {frame.reason}" if frame.reason else ""
        return f"the piwf relay at {self._url} closed the connection{reason} ({frame.code})"


class RemoteConnector:
    """Connects to the piwf relay at ``url`` (checked by :func:`check_remote_url`)."""

    def __init__(self, url: str) -> None:
        self.url = check_remote_url(url)

    @property
    def where(self) -> str:
        return f"the piwf server behind the relay at {self.url}"

    def silent_hint(self) -> str:
        """Nothing: the server's process is on the relay's machine."""
        return ""

    def connect(self, *, autostart: bool, timeout_s: float) -> WebSocketTransport:
        """Open the WebSocket (``autostart`` is ignored: a relay never starts a server).

        Raises :class:`~piwf.errors.MissingExtraError` without ``websockets``,
        :class:`ServerNotRunningError` when the relay reaches no server,
        :class:`ServerUnavailableError` when nothing listens or the relay refuses, and
        :class:`~piwf.client.sockets.TransportError` on a timeout.
        """
        try:
            from websockets.exceptions import InvalidHandshake, InvalidStatus
            from websockets.sync.client import connect
        except ModuleNotFoundError as error:
            if (error.name or "").partition(".")[0] != "websockets":
                raise
            raise MissingExtraError(MISSING_WEBSOCKETS) from None
        held = contextlib.ExitStack()
        try:
            # Entered as a context manager, as websockets >= 17.1 wants (what connect returns
            # differs between versions; entering it yields the connection in each).
            websocket = held.enter_context(
                connect(
                    self.url,
                    open_timeout=timeout_s,
                    close_timeout=CLOSE_TIMEOUT_S,
                    max_size=MAX_FRAME_BYTES - 1,
                    compression=None,
                    proxy=None,
                )
            )
        except InvalidStatus as refused:
            response = refused.response
            text = response.body.decode("utf-8", "replace").strip()[:_REFUSAL_CHARS]
            error_type = ServerNotRunningError if response.status_code == 503 else None
            message = f"the piwf relay at {self.url} refused the connection: {text}"
            raise (error_type or ServerUnavailableError)(message) from None
        except TimeoutError:
            raise TransportError(f"the piwf relay at {self.url} did not answer in time") from None
        except (OSError, InvalidHandshake) as error:
            raise ServerUnavailableError(
                f"cannot reach a piwf relay at {self.url} ({error}); is `piwf relay` running "
                "there and the SSH tunnel up?"
            ) from None
        return WebSocketTransport(websocket, self.url, held)
