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
``database``        the ``state.*`` methods of :class:`Client`: status, verify, backup, prune
``content``         assembling and verifying values the server sent by content reference
``connection``      socket path checks (lstat, no symlinks), ``hello``, the reader thread
``launcher``        start a detached server and wait for its ready line
``offline``         verify an inactive database file (``piwf state verify BACKUP``)
``restore``         restore a verified backup with the server stopped (``piwf state restore``)
==================  ==========================================================================

The client never opens the live database. ``offline`` and ``restore`` are the one exception
DESIGN.md allows: they open an inactive file (a backup or its copy), never the live one, and
nothing else here imports :mod:`piwf.state`.

The package's names load on first use (``piwf.client.Client`` imports the client and the
protocol's models then), so importing a module of the package, such as :mod:`.sockets` or
:mod:`.quick_read`, loads only that module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: The module each exported name comes from.
_MODULE_OF: dict[str, str] = {
    **dict.fromkeys(
        [name for name in __all__ if name.isupper() or name == "Client"], "piwf.client.client"
    ),
    "workflow_reference": "piwf.client.runs",
    "CapturedTurn": "piwf.client.session_capture",
    "CapturedEntry": "piwf.protocol.session_capture_payloads",
    "CapturedEvent": "piwf.protocol.session_capture_payloads",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'piwf.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
