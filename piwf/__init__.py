"""piwf: a local, crash-safe workflow server for Python.

The public API lives here; everything else is internal and may change. ``Client`` is imported
on first use, so ``import piwf`` stays light for child processes that never talk to a server.
"""

from typing import TYPE_CHECKING, Any

from piwf._version import __version__
from piwf.errors import (
    AgentCommandError,
    BackupFailedError,
    CanonicalJsonError,
    ClaimLostCommandError,
    ClaimLostError,
    ClientClosedError,
    CommandError,
    ConflictError,
    ContentMismatchError,
    IncompatibleServerError,
    IncompatibleStateError,
    InternalServerError,
    InvalidArgumentError,
    MissingExtraError,
    NotFoundError,
    PiwfError,
    ReadOnlyStateError,
    RejectedError,
    RequestTooLargeError,
    RunCommandError,
    ServerError,
    ServerNotRunningError,
    ServerRunningError,
    ServerStartError,
    ServerUnavailableError,
    SessionAuthorityCommandError,
    SessionError,
    StateBusyError,
    StateCorruptCommandError,
    StateError,
    StateFullCommandError,
    StateIoCommandError,
    SubmissionRejectedCommandError,
    UnavailableError,
    UnsafeStateHomeError,
    ValidationPendingCommandError,
    WatchIdleError,
    WorkflowDefinitionError,
    WorkflowError,
    WorkflowLoadError,
)

if TYPE_CHECKING:
    from piwf.client import Client

__all__ = [
    "AgentCommandError",
    "BackupFailedError",
    "CanonicalJsonError",
    "ClaimLostCommandError",
    "ClaimLostError",
    "Client",
    "ClientClosedError",
    "CommandError",
    "ConflictError",
    "ContentMismatchError",
    "IncompatibleServerError",
    "IncompatibleStateError",
    "InternalServerError",
    "InvalidArgumentError",
    "MissingExtraError",
    "NotFoundError",
    "PiwfError",
    "ReadOnlyStateError",
    "RejectedError",
    "RequestTooLargeError",
    "RunCommandError",
    "ServerError",
    "ServerNotRunningError",
    "ServerRunningError",
    "ServerStartError",
    "ServerUnavailableError",
    "SessionAuthorityCommandError",
    "SessionError",
    "StateBusyError",
    "StateCorruptCommandError",
    "StateError",
    "StateFullCommandError",
    "StateIoCommandError",
    "SubmissionRejectedCommandError",
    "UnavailableError",
    "UnsafeStateHomeError",
    "ValidationPendingCommandError",
    "WatchIdleError",
    "WorkflowDefinitionError",
    "WorkflowError",
    "WorkflowLoadError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from piwf.client import Client

        return Client
    raise AttributeError(f"module 'piwf' has no attribute {name!r}")
