"""Errors of reaching, starting and serving the server: its process, its connections, a relay,
a call a closed client ended and an idle watch (the ``ServerError`` branch and its neighbours in
:mod:`piwf.errors`)."""

from __future__ import annotations

from piwf.errors.base import PiwfError


class RelayError(PiwfError):
    """``piwf relay`` cannot listen (the address is in use, not permitted) or serve."""

    code = "relayError"


class ClientClosedError(PiwfError):
    """:meth:`piwf.client.Client.close` ran while this call waited for its answer, so the call
    ended instead of being sent again; for a command, the message names the idempotency key
    under which a retry adopts its outcome. A call made after ``close()`` connects again."""

    code = "clientClosed"


class WatchIdleError(PiwfError, TimeoutError):
    """A client watch saw no change for its ``idle_timeout_s`` and ended; watch again to go on."""

    code = "watchIdle"


class ServerError(PiwfError):
    """A problem starting, reaching or running the server."""

    code = "serverError"


class ServerRunningError(ServerError):
    """Another live piwf server owns this state home; it was left alone."""

    code = "serverRunning"


class ServerStartError(ServerError):
    """The server could not start; the message gives the reason."""

    code = "serverStart"


class TooManyConnectionsError(ServerError):
    """The server refused a connection: all of its connections are busy, none could be shed."""

    code = "tooManyConnections"


class ServerUnavailableError(ServerError):
    """No server could be reached or started for this state home."""

    code = "serverUnavailable"


class IncompatibleServerError(ServerUnavailableError):
    """The server runs another piwf package version; this client does not talk to it."""

    code = "incompatibleServer"


class ServerNotRunningError(ServerUnavailableError):
    """No server listens for the state home and the client was told not to start one."""
