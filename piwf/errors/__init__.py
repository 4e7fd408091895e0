"""The piwf error tree.

Every error piwf raises on purpose derives from :class:`PiwfError` and carries a stable wire
``code``; the client maps codes back to classes, so the tree is part of the protocol::

    PiwfError
    ├── CanonicalJsonError          invalidJson        (reason: which rule was broken)
    ├── InvalidArgumentError        invalidArgument    (a call's argument: its name and what it
    │   │                                               allows; nothing was sent)
    │   └── RequestTooLargeError    requestTooLarge    (more than one request frame carries)
    ├── StateError
    │   ├── IncompatibleStateError  incompatibleState  (refused before any mutation)
    │   ├── UnsafeStateHomeError    unsafeStateHome    (permissions, owner or symlink)
    │   ├── ReadOnlyStateError      readOnly
    │   ├── StateUnavailableError   stateUnavailable   (cannot serve now: `unavailable`)
    │   │   ├── StateBusyError      stateBusy          (SQLite stayed locked past busy_timeout)
    │   │   ├── StateFullError      stateFull          (disk or quota full: free space, retry)
    │   │   ├── StateIoError        stateIo            (an I/O error: check the disk, retry)
    │   │   └── StateCorruptError   stateCorrupt       (a damaged file: stop, restore a backup)
    │   ├── StaleRevisionError      staleRevision      (expected revision did not match)
    │   ├── ClaimLostError          claimLost          (reason: one of CLAIM_LOST_REASONS)
    │   ├── BlobConflictError       blobConflict
    │   ├── BlobMissingError        blobMissing
    │   ├── BlobTypeError           blobType           (stored media type is not the one read)
    │   ├── BackupError             backupFailed       (the destination cannot take a backup)
    │   └── InvalidTransitionError  invalidTransition
    ├── WorkflowError
    │   ├── WorkflowDefinitionError workflowDefinition (a definition broke an authoring rule)
    │   ├── WorkflowLoadError       workflowLoad       (a workflow file could not be loaded)
    │   ├── RunCommandError         runCommand         (command and saved state do not fit)
    │   │   └── RunPausedError      runPaused          (answers wait until the run resumes)
    │   ├── AnswerRejectedError     answerRejected     (an answer does not fit its request)
    │   ├── NotDecisionRequestError notDecisionRequest (an agent step's request: submit to it)
    │   ├── SubmissionError                            (an agent submission was refused)
    │   │   ├── RequestNotOpenError     requestNotOpen     (answered, closed or a stale attempt)
    │   │   ├── NotAgentRequestError    notAgentRequest    (a checkpoint or decision: answer it)
    │   │   ├── ValidationPendingError  validationPending  (another candidate is validating)
    │   │   ├── RequestRunMismatchError requestRunMismatch (the frame names another run)
    │   │   ├── SubmissionKeyConflictError idempotencyConflict (the key names another output)
    │   │   └── SubmissionRejectedError submissionRejected (validate refused it; the error
    │   │                                                   says what to submit instead)
    │   ├── AgentCommandError       agentCommand       (not an argv list of non-empty strings)
    │   ├── MissingSubmissionError  missingSubmission  (an agent step's turns ended unfulfilled)
    │   ├── SessionError            sessionError       (a rule of interactive sessions)
    │   │   ├── SessionBusyError    sessionBusy        (an unfinished run holds the session)
    │   │   └── SessionAuthorityError sessionAuthority (not the session's active coordinator)
    │   └── SettingsChangeError     settingsRefused    (a live-settings patch was refused:
    │       │                                           malformed, not granted, or refused
    │       │                                           by the workflow's parse)
    │       └── SettingsConflictError settingsConflict (a newer change came first: read the
    │                                                   settings and patch again)
    ├── ProtocolError               protocolError      (piwf.protocol.errors: frames, messages)
    ├── ContentReadError            contentRead        (a client read of referenced content)
    │   ├── ContentReferenceError   contentReference   (a reference or range no read can serve)
    │   ├── ContentNotFoundError    contentNotFound    (not a stored value of that owner)
    │   └── ContentMismatchError    contentMismatch    (parts differ from their reference)
    ├── LogReadError                logRead            (a run.logs read that cannot be served)
    │   ├── NodeNotInRunError       nodeNotFound       (no such node in the run: names them)
    │   └── LogCursorError          logCursor          (a cursor no attempt log of the run
    │                                                   holds: start again without one)
    ├── InternalError               internalError      (a server bug; nothing was changed)
    ├── MissingExtraError           missingExtra       (a command needs an optional extra)
    ├── RelayError                  relayError         (piwf relay cannot listen or serve)
    ├── ClientClosedError           clientClosed       (Client.close() ended a call in flight)
    ├── WatchIdleError              watchIdle          (a watch idle past idle_timeout_s)
    ├── ServerError
    │   ├── ServerRunningError      serverRunning      (another live server owns this home)
    │   ├── ServerStartError        serverStart        (the server could not start; says why)
    │   ├── TooManyConnectionsError tooManyConnections (every connection slot is busy)
    │   └── ServerUnavailableError  serverUnavailable  (no server could be reached or started)
    │       ├── IncompatibleServerError  incompatibleServer  (another package version answers)
    │       └── ServerNotRunningError    serverUnavailable   (none runs; autostart was off)
    └── CommandError                                   (a command's outcome, on the client)
        ├── RejectedError           rejected
        │   ├── BackupFailedError   backupFailed       (fix the destination, then retry)
        │   ├── SubmissionRejectedCommandError  submissionRejected  (the stored validate error)
        │   ├── ValidationPendingCommandError   validationPending   (wait for the outcome)
        │   ├── SessionAuthorityCommandError    sessionAuthority    (not the active coordinator)
        │   └── InternalServerError internalError      (the server failed; nothing changed)
        ├── ConflictError           conflict
        ├── NotFoundError           notFound
        ├── UnavailableError        unavailable
        │   ├── StateFullCommandError     stateFull    (the server's disk is full; retry later)
        │   ├── StateIoCommandError       stateIo      (the server hit an I/O error)
        │   └── StateCorruptCommandError  stateCorrupt (the server's database is damaged)
        └── ClaimLostCommandError   claimLost          (the server's claim check failed)

On the server a failure is answered by its class: a :class:`StateUnavailableError` is
``unavailable`` with nothing stored (retry once the cause is gone), an :class:`InternalError` is
``rejected`` with nothing stored, and the client raises the ``CommandError`` subclass of the
outcome and code (``client.CODE_ERRORS``), else the class of the outcome.

Messages never contain claim tokens, token hashes, payloads, paths taken from a request or
environment values: they are shown to users and written to logs.

The classes live in one module per branch (``base``, ``state``, ``workflow``, ``reads``,
``connection``, ``commands``); import them from here, where each one's ``__module__`` says
``piwf.errors`` as it always has: a failure records its error's qualified name and a retry
policy's snapshot names the classes it retries on, so that name is stored state.
"""

from __future__ import annotations

# Not used here: class annotations resolve in the namespace of the module a class names, which
# is this one (typing.get_type_hints), and PiwfError's ``code`` is a ClassVar.
from typing import ClassVar  # noqa: F401

from piwf.errors.base import (
    CanonicalJsonError,
    InternalError,
    InvalidArgumentError,
    MissingExtraError,
    PiwfError,
    RequestTooLargeError,
)
from piwf.errors.commands import (
    BackupFailedError,
    ClaimLostCommandError,
    CommandError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    RejectedError,
    SessionAuthorityCommandError,
    StateCorruptCommandError,
    StateFullCommandError,
    StateIoCommandError,
    SubmissionRejectedCommandError,
    UnavailableError,
    ValidationPendingCommandError,
)
from piwf.errors.connection import (
    ClientClosedError,
    IncompatibleServerError,
    RelayError,
    ServerError,
    ServerNotRunningError,
    ServerRunningError,
    ServerStartError,
    ServerUnavailableError,
    TooManyConnectionsError,
    WatchIdleError,
)
from piwf.errors.reads import (
    ContentMismatchError,
    ContentNotFoundError,
    ContentReadError,
    ContentReferenceError,
    LogCursorError,
    LogReadError,
    NodeNotInRunError,
)
from piwf.errors.state import (
    CLAIM_LOST_REASONS,
    BackupError,
    BlobConflictError,
    BlobMissingError,
    BlobTypeError,
    ClaimLostError,
    ClaimLostReason,
    IncompatibleStateError,
    InvalidTransitionError,
    ReadOnlyStateError,
    StaleRevisionError,
    StateBusyError,
    StateCorruptError,
    StateError,
    StateFullError,
    StateIoError,
    StateUnavailableError,
    UnsafeStateHomeError,
)
from piwf.errors.workflow import (
    AgentCommandError,
    AnswerRejectedError,
    MissingSubmissionError,
    NotAgentRequestError,
    NotDecisionRequestError,
    RequestNotOpenError,
    RequestRunMismatchError,
    RunCommandError,
    RunPausedError,
    SessionAuthorityError,
    SessionBusyError,
    SessionError,
    SettingsChangeError,
    SettingsConflictError,
    SubmissionError,
    SubmissionKeyConflictError,
    SubmissionRejectedError,
    ValidationPendingError,
    WorkflowDefinitionError,
    WorkflowError,
    WorkflowLoadError,
)

__all__ = [
    "CLAIM_LOST_REASONS",
    "AgentCommandError",
    "AnswerRejectedError",
    "BackupError",
    "BackupFailedError",
    "BlobConflictError",
    "BlobMissingError",
    "BlobTypeError",
    "CanonicalJsonError",
    "ClaimLostCommandError",
    "ClaimLostError",
    "ClaimLostReason",
    "ClientClosedError",
    "CommandError",
    "ConflictError",
    "ContentMismatchError",
    "ContentNotFoundError",
    "ContentReadError",
    "ContentReferenceError",
    "IncompatibleServerError",
    "IncompatibleStateError",
    "InternalError",
    "InternalServerError",
    "InvalidArgumentError",
    "InvalidTransitionError",
    "LogCursorError",
    "LogReadError",
    "MissingExtraError",
    "MissingSubmissionError",
    "NodeNotInRunError",
    "NotAgentRequestError",
    "NotDecisionRequestError",
    "NotFoundError",
    "PiwfError",
    "ReadOnlyStateError",
    "RejectedError",
    "RelayError",
    "RequestNotOpenError",
    "RequestRunMismatchError",
    "RequestTooLargeError",
    "RunCommandError",
    "RunPausedError",
    "ServerError",
    "ServerNotRunningError",
    "ServerRunningError",
    "ServerStartError",
    "ServerUnavailableError",
    "SessionAuthorityCommandError",
    "SessionAuthorityError",
    "SessionBusyError",
    "SessionError",
    "SettingsChangeError",
    "SettingsConflictError",
    "StaleRevisionError",
    "StateBusyError",
    "StateCorruptCommandError",
    "StateCorruptError",
    "StateError",
    "StateFullCommandError",
    "StateFullError",
    "StateIoCommandError",
    "StateIoError",
    "StateUnavailableError",
    "SubmissionError",
    "SubmissionKeyConflictError",
    "SubmissionRejectedCommandError",
    "SubmissionRejectedError",
    "TooManyConnectionsError",
    "UnavailableError",
    "UnsafeStateHomeError",
    "ValidationPendingCommandError",
    "ValidationPendingError",
    "WatchIdleError",
    "WorkflowDefinitionError",
    "WorkflowError",
    "WorkflowLoadError",
]

for _value in list(globals().values()):
    if isinstance(_value, type) and _value.__module__.startswith(f"{__name__}."):
        _value.__module__ = __name__
del _value
