"""Who coordinates each origin session: one connection and epoch per session, in memory.

``session.attach`` makes the asking connection the session's coordinator with a new epoch; a
connection that held it before is fenced (its epoch stops being active: its branch reports,
submissions and answers are refused) but stays open. The epoch ends when its connection
closes. Nothing here is durable: a coordinator epoch belongs to one live connection, so a
server restart (which ends every connection) starts every session uncoordinated, and the
coordinator's first act on a new connection is to attach and report its branch again.

Epochs are ``<server epoch>.<n>``: never reused by this server, and a stale one from an older
server process can never equal a live one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from piwf.protocol.client_v1 import Request
from piwf.protocol.session_payloads import SessionAttachPayload, SessionAttachReceipt
from piwf.server.connections import ClientConnection
from piwf.server.loop import Reply
from piwf.server.replies import ok, payload_of

#: The operations answered here, with the asking connection.
COORDINATOR_OPERATIONS = frozenset({"session.attach"})


@dataclass(frozen=True)
class Coordinator:
    """The active coordinator of one session."""

    connection: ClientConnection
    epoch: str


class Coordinators:
    """The active coordinator of every session this server process knows."""

    def __init__(self, server_epoch: int) -> None:
        self.server_epoch = server_epoch
        self._numbers = itertools.count(1)
        self._active: dict[str, Coordinator] = {}

    def handle(self, connection: ClientConnection, request: Request, reply: Reply) -> None:
        """``session.attach``: the asking connection becomes the coordinator."""
        payload = payload_of(request, SessionAttachPayload)
        previous = self._active.get(payload.session_id)
        epoch = f"{self.server_epoch}.{next(self._numbers)}"
        self._active[payload.session_id] = Coordinator(connection, epoch)
        replaced = previous is not None and previous.connection is not connection
        receipt = SessionAttachReceipt(
            session_id=payload.session_id, coordinator_epoch=epoch, replaced=replaced
        )
        reply(ok(request, receipt))

    def is_active(self, session_id: str, epoch: str | None) -> bool:
        """True when ``epoch`` is the session's active coordinator epoch."""
        active = self._active.get(session_id)
        return active is not None and epoch is not None and active.epoch == epoch

    def coordinated(self, session_id: str) -> bool:
        """True when some connection coordinates the session now."""
        return session_id in self._active

    def drained(self, connection: ClientConnection) -> None:
        """Nothing waits on a drain here."""

    def closed(self, connection: ClientConnection) -> None:
        """``connection`` closed: the epochs it held end."""
        for session_id, active in list(self._active.items()):
            if active.connection is connection:
                del self._active[session_id]
