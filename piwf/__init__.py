"""piwf: a local, crash-safe workflow server for Python.

The public API lives here; everything else is internal and may change.
"""

from piwf._version import __version__
from piwf.errors import (
    CanonicalJsonError,
    ClaimLostError,
    IncompatibleStateError,
    PiwfError,
    ReadOnlyStateError,
    RunCommandError,
    StateBusyError,
    StateError,
    UnsafeStateHomeError,
    WorkflowDefinitionError,
    WorkflowError,
    WorkflowLoadError,
)

__all__ = [
    "CanonicalJsonError",
    "ClaimLostError",
    "IncompatibleStateError",
    "PiwfError",
    "ReadOnlyStateError",
    "RunCommandError",
    "StateBusyError",
    "StateError",
    "UnsafeStateHomeError",
    "WorkflowDefinitionError",
    "WorkflowError",
    "WorkflowLoadError",
    "__version__",
]
