"""``piwf server stop``'s quick path: the stop asked with the frame codec alone.

Stopping is most often the last command of a session or of a script's clean-up, and most of
what the full :class:`~piwf.client.Client` costs there is importing the protocol's models.
:func:`stop_quickly` answers the two ordinary cases without them:

- nothing listens on the state home's socket: no server runs (the full client with
  ``autostart=False`` decides exactly so, and retries nothing);
- a server of this piwf version answers: it is asked ``server.stop`` (a durable command, with
  an idempotency key of its own), answers ``accepted`` (or ``unavailable``: it is stopping
  already), and closes the connection within the wait.

Everything else gives up and returns None, and the caller asks through the full client, which
reports errors as it always does: a socket path that fails its checks, another version's
hello, any other outcome, a frame it does not expect, a timeout. Asking the stop twice is
safe: a server that is stopping answers the second ask ``unavailable`` and is waited for.
"""

from __future__ import annotations

import enum
import time
import uuid
from pathlib import Path
from typing import Final

from piwf.client.quick_read import exchange, is_compatible_hello, next_message
from piwf.client.sockets import NotListeningError, TransportError, connect_socket
from piwf.client.transport import PeerClosedError, SocketTransport
from piwf.config import ServerPaths, socket_path_problem
from piwf.errors import PiwfError

#: How long connecting, the hello and the answer may take before the full client asks.
QUICK_TIMEOUT_S: Final = 5.0
#: How long the server then has to close the connection: the full client's default wait
#: (``piwf.client.DEFAULT_STOP_WAIT_S``, not imported here: that module loads the models).
STOP_WAIT_S: Final = 10.0
#: What ends a quick stop without a verdict; the full client then asks (and reports) instead.
_GIVE_UP = (OSError, NotListeningError, PeerClosedError, PiwfError, TransportError)
#: The outcomes after which the server stops: it accepted, or it was stopping already.
_STOPPING = frozenset({"accepted", "unavailable"})


class QuickStop(enum.Enum):
    """What :func:`stop_quickly` found."""

    NOT_RUNNING = "notRunning"
    STOPPED = "stopped"


def stop_quickly(
    home: Path, *, client_id: str, timeout_s: float, wait_s: float
) -> QuickStop | None:
    """Stop ``home``'s server as ``client_id``, or find that none runs; None when anything is
    not ordinary (see the module docstring). Connecting, the hello and the answer share
    ``timeout_s``; the server then has ``wait_s`` more to close the connection. Never starts a
    server and raises nothing."""
    path = ServerPaths(home).socket
    if socket_path_problem(path) is not None:
        return None
    deadline = time.monotonic() + timeout_s
    try:
        transport = SocketTransport(connect_socket(path, timeout_s))
    except NotListeningError:
        return QuickStop.NOT_RUNNING
    except _GIVE_UP:
        return None
    sent = False
    try:
        if not is_compatible_hello(next_message(transport, deadline)):
            return None
        sent = True  # from here on the request may have reached the server
        message = exchange(
            transport,
            deadline,
            {
                "clientId": client_id,
                "idempotencyKey": f"server.stop-{uuid.uuid4().hex}",
                "operation": "server.stop",
                "payload": {},
            },
        )
        if message is None or message.get("outcome") not in _STOPPING:
            return None
        return QuickStop.STOPPED if _closed_within(transport, wait_s) else None
    except PeerClosedError:
        # Gone before it answered: what was asked, unless another server listens by now.
        return QuickStop.STOPPED if sent and nothing_listens(home, timeout_s) else None
    except _GIVE_UP:
        return None
    finally:
        transport.shutdown()
        transport.close()


def _closed_within(transport: SocketTransport, wait_s: float) -> bool:
    """Whether the server closes the connection within ``wait_s`` (frames it sends meanwhile
    are read and dropped)."""
    deadline = time.monotonic() + wait_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        transport.set_timeout(remaining)
        try:
            transport.receive()
        except TimeoutError:
            return False
        except (PeerClosedError, ConnectionResetError):
            return True


def nothing_listens(home: Path, timeout_s: float = QUICK_TIMEOUT_S) -> bool:
    """Whether nothing listens on ``home``'s socket: no server runs, as the full client with
    ``autostart=False`` would find it (and retry nothing). False when a server accepts, and
    whenever the socket cannot be checked (the full client then asks, and reports)."""
    path = ServerPaths(home).socket
    if socket_path_problem(path) is not None:
        return False
    try:
        connect_socket(path, timeout_s).close()
    except NotListeningError:
        return True
    except _GIVE_UP:
        return False
    return False
