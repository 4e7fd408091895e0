"""The client side of piwf: everything that talks to a server, and the two offline commands.

::

    from piwf.client import Client

==================  ==========================================================================
module              contents
==================  ==========================================================================
``client``          :class:`Client`: connection reuse, retries with one idempotency key, the
                    outcome-to-error mapping (:data:`OUTCOME_ERRORS`, :data:`CODE_ERRORS`)
``runs``            the run reads and waits of :class:`Client`
``logs``            a run's node attempt logs (``run.logs``): pages, complete, followed
``sessions``        :meth:`Client.session`: the coordinator of an origin session
``capture``         :meth:`Client.read_capture`: a run's session capture, read back whole
``resources``       the ``resource.*`` methods of :class:`Client`
``content``         assembling and verifying values the server sent by content reference
``connection``      socket path checks (lstat, no symlinks), ``hello``, the reader thread
``launcher``        start a detached server and wait for its ready line
``offline``         verify an inactive database file (``piwf state verify BACKUP``)
``restore``         restore a verified backup with the server stopped (``piwf state restore``)
==================  ==========================================================================

The client never opens the live database. ``offline`` and ``restore`` are the one exception
DESIGN.md allows: they open an inactive file (a backup or its copy), never the live one, and
nothing else here imports :mod:`piwf.state`.
"""

from typing import TYPE_CHECKING, Any

from piwf.client.client import (
    CODE_ERRORS,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_RETRY_TIMEOUT_S,
    DEFAULT_STOP_WAIT_S,
    OUTCOME_ERRORS,
    RETRY_BASE_S,
    RETRY_MAX_ATTEMPTS,
    RETRY_MAX_WAIT_S,
    Client,
)
from piwf.client.runs import workflow_reference
from piwf.client.session_capture import CapturedTurn

if TYPE_CHECKING:
    from piwf.protocol.session_capture_payloads import CapturedEntry, CapturedEvent

__all__ = [
    "CODE_ERRORS",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_RETRY_TIMEOUT_S",
    "DEFAULT_STOP_WAIT_S",
    "OUTCOME_ERRORS",
    "RETRY_BASE_S",
    "RETRY_MAX_ATTEMPTS",
    "RETRY_MAX_WAIT_S",
    "CapturedEntry",
    "CapturedEvent",
    "CapturedTurn",
    "Client",
    "workflow_reference",
]


def __getattr__(name: str) -> Any:
    # The capture models come from their protocol module on first use: importing the client
    # (every CLI command does) need not build them.
    if name in ("CapturedEntry", "CapturedEvent"):
        from piwf.protocol import session_capture_payloads

        return getattr(session_capture_payloads, name)
    raise AttributeError(f"module 'piwf.client' has no attribute {name!r}")
