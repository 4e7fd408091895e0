"""piwf: a local, crash-safe workflow server for Python.

The public API lives here; everything else is internal and may change. ``Client`` is imported
on first use, so ``import piwf`` stays light for child processes that never talk to a server.
"""

from typing import TYPE_CHECKING, Any

from piwf._version import __version__
from piwf.errors import (
    BackupFailedError,
    CanonicalJsonError,
    ClaimLostCommandError,
    ClaimLostError,
    CommandError,
    ConflictError,
    ContentMismatchError,
    IncompatibleServerError,
    IncompatibleStateError,
    InternalServerError,
    NotFoundError,
    PiwfError,
    ReadOnlyStateError,
    RejectedError,
    RunCommandError,
    ServerError,
    ServerNotRunningError,
    ServerRunningError,
    ServerStartError,
    ServerUnavailableError,
    SessionAuthorityCommandError,
    StateBusyError,
    StateCorruptCommandError,
    StateError,
    StateFullCommandError,
    StateIoCommandError,
    SubmissionRejectedCommandError,
    UnavailableError,
    UnsafeStateHomeError,
    ValidationPendingCommandError,
    WorkflowDefinitionError,
    WorkflowError,
    WorkflowLoadError,
)

if TYPE_CHECKING:
    from piwf.client import Client

__all__ = [
    "BackupFailedError",
    "CanonicalJsonError",
    "ClaimLostCommandError",
    "ClaimLostError",
    "Client",
    "CommandError",
    "ConflictError",
    "ContentMismatchError",
    "IncompatibleServerError",
    "IncompatibleStateError",
    "InternalServerError",
    "NotFoundError",
    "PiwfError",
    "ReadOnlyStateError",
    "RejectedError",
    "RunCommandError",
    "ServerError",
    "ServerNotRunningError",
    "ServerRunningError",
    "ServerStartError",
    "ServerUnavailableError",
    "SessionAuthorityCommandError",
    "StateBusyError",
    "StateCorruptCommandError",
    "StateError",
    "StateFullCommandError",
    "StateIoCommandError",
    "SubmissionRejectedCommandError",
    "UnavailableError",
    "UnsafeStateHomeError",
    "ValidationPendingCommandError",
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
