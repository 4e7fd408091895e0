"""The services that answer operations bound to the asking connection, as one.

The listener hands an operation that needs its connection (a subscription, a session attach)
to :class:`ConnectionServices`, which passes it to the one service owning that operation, and
tells every service when a connection drained or closed.
"""

from __future__ import annotations

from collections.abc import Mapping

from piwf.protocol.client_v1 import Request
from piwf.server.connections import ClientConnection
from piwf.server.loop import ConnectionSubscriptions, Reply


class ConnectionServices:
    """Routes connection-bound operations to their service; fans drains and closes out."""

    def __init__(self, services: Mapping[frozenset[str], ConnectionSubscriptions]) -> None:
        self.by_operation = {
            operation: service
            for operations, service in services.items()
            for operation in operations
        }
        self.services = list(services.values())

    @property
    def operations(self) -> frozenset[str]:
        """Every operation some service answers."""
        return frozenset(self.by_operation)

    def handle(self, connection: ClientConnection, request: Request, reply: Reply) -> None:
        """Answer one connection-bound operation (the listener checked it is one)."""
        self.by_operation[request.operation].handle(connection, request, reply)

    def drained(self, connection: ClientConnection) -> None:
        for service in self.services:
            service.drained(connection)

    def closed(self, connection: ClientConnection) -> None:
        for service in self.services:
            service.closed(connection)
