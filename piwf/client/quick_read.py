"""One read over the state home's socket without the protocol's models: a CLI's quick path.

Most of what a short read command such as ``piwf run list`` costs is the interpreter and its
imports, and the full :class:`~piwf.client.Client` validates every frame with the protocol's
pydantic models, whose import and first build take about as long as everything else together.
:func:`read_quickly` asks the server with the frame codec alone, and returns the receipt of an
ordinary answer. For anything else it gives up and returns None: no server listening, a
socket path that fails its checks, a hello of another piwf version, any outcome but
``accepted``, a frame it does not expect, a timeout. The caller then asks again through the
full client, which starts a server, retries, validates and reports errors as it always does.
A read changes nothing, so asking twice is safe, and the quick path decides no error itself:
every case it does not know ends in the same client and the same message as before.

The receipt is the server's JSON, checked only as canonical JSON; the caller checks the
fields it uses (:mod:`piwf.cli.run_rows` does, and falls back the same way on any surprise).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from piwf import canonical
from piwf._version import __version__
from piwf.client.sockets import NotListeningError, TransportError, connect_socket
from piwf.client.transport import PeerClosedError, SocketTransport
from piwf.config import ServerPaths, socket_path_problem
from piwf.errors import PiwfError
from piwf.protocol.framing import encode_frame
from piwf.protocol.operations import READ_OPERATIONS, SCHEMA

#: What ends a quick read without an answer; the full client then asks (and reports) instead.
_GIVE_UP = (OSError, NotListeningError, PeerClosedError, PiwfError, TransportError)


def read_quickly(
    home: Path,
    operation: str,
    payload: Mapping[str, Any],
    *,
    client_id: str,
    timeout_s: float,
) -> dict[str, Any] | None:
    """Send the read ``operation`` with ``payload`` to ``home``'s running server, as
    ``client_id``, and return its ``accepted`` receipt; None when anything is not ordinary
    (see the module docstring). Connecting, the hello and the answer share ``timeout_s``.
    Never starts a server, never retries, and raises nothing but ``ValueError`` for an
    operation that is not a read.
    """
    if operation not in READ_OPERATIONS:
        raise ValueError(f"{operation} is not a read; only a read may be asked twice")
    path = ServerPaths(home).socket
    if socket_path_problem(path) is not None:
        return None
    deadline = time.monotonic() + timeout_s
    try:
        transport = SocketTransport(connect_socket(path, timeout_s))
    except _GIVE_UP:
        return None
    try:
        if not is_compatible_hello(next_message(transport, deadline)):
            return None
        message = exchange(
            transport,
            deadline,
            {"clientId": client_id, "operation": operation, "payload": dict(payload)},
        )
        receipt = None if message is None else message.get("receipt")
        if message is None or message.get("outcome") != "accepted" or not isinstance(receipt, dict):
            return None
        return receipt
    except _GIVE_UP:
        return None
    finally:
        transport.shutdown()
        transport.close()


def exchange(
    transport: SocketTransport, deadline: float, request: dict[str, Any]
) -> dict[str, Any] | None:
    """Send ``request`` (an envelope's ``clientId``, ``operation``, ``payload`` and, for a
    command, ``idempotencyKey``: the rest is added) and return the server's response to it;
    None when another frame comes first. Raises what :func:`next_message` and the transport
    raise."""
    request_id = f"quick-{uuid.uuid4().hex}"
    envelope = {**request, "requestId": request_id, "schema": SCHEMA, "type": "request"}
    transport.send_frame(encode_frame(envelope))
    while True:
        message = next_message(transport, deadline)
        if message is None or message.get("type") != "response":
            return None
        if message.get("requestId") == request_id:
            return message


def next_message(transport: SocketTransport, deadline: float) -> dict[str, Any] | None:
    """The next frame as a JSON object (None: not canonical JSON, or not an object); raises
    ``TimeoutError`` (an ``OSError``) once ``deadline`` passes."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no answer in time")
        transport.set_timeout(remaining)
        frames = transport.receive()
        if frames:
            break
    # One request is in flight, and a hello is the first frame: nothing else may come between.
    if len(frames) > 1:
        return None
    try:
        message = canonical.decode(frames[0])
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def is_compatible_hello(message: dict[str, Any] | None) -> bool:
    """Whether ``message`` is the hello of a server of this piwf version and protocol."""
    return (
        message is not None
        and message.get("type") == "hello"
        and message.get("schema") == SCHEMA
        and message.get("packageVersion") == __version__
    )
