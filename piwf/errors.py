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
"""

from __future__ import annotations

from typing import ClassVar, Literal

ClaimLostReason = Literal[
    "missingAuthority", "expired", "ownerChanged", "tokenChanged", "generationChanged"
]
CLAIM_LOST_REASONS: tuple[ClaimLostReason, ...] = (
    "missingAuthority",
    "expired",
    "ownerChanged",
    "tokenChanged",
    "generationChanged",
)


class PiwfError(Exception):
    """Base class of every error piwf raises on purpose; ``code`` is stable on the wire."""

    code: ClassVar[str] = "piwfError"


class CanonicalJsonError(PiwfError, ValueError):
    """A value or text is not canonical JSON; ``reason`` names the broken rule."""

    code = "invalidJson"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.path: list[str] = []  # where the refused part sits, innermost step first


class InvalidArgumentError(PiwfError, ValueError):
    """A call was given an argument it cannot take (wrong type, out of range, too large); nothing
    was sent. The message names each argument and what it allows, never the value given."""

    code = "invalidArgument"


class RequestTooLargeError(InvalidArgumentError):
    """A request (a run's input, an answer) would not fit its 1 MiB frame; nothing was sent."""

    code = "requestTooLarge"


class StateError(PiwfError):
    """A problem with the durable state database."""

    code = "stateError"


class IncompatibleStateError(StateError):
    """The database file is not a piwf state file of this schema; it was left untouched."""

    code = "incompatibleState"


class UnsafeStateHomeError(StateError):
    """The state home or a file in it is a symlink, owned by another user or too open."""

    code = "unsafeStateHome"


class ReadOnlyStateError(StateError):
    """A write was attempted through a read-only database handle."""

    code = "readOnly"


class StateUnavailableError(StateError):
    """The state database cannot serve this now; the transaction was rolled back, nothing was
    changed and nothing can be stored, so a command is answered ``unavailable``."""

    code = "stateUnavailable"


class StateBusyError(StateUnavailableError):
    """SQLite stayed locked by another writer past ``busy_timeout``; retrying may succeed."""

    code = "stateBusy"


class StateFullError(StateUnavailableError):
    """The disk or quota is full (``SQLITE_FULL``, ``ENOSPC``, ``EDQUOT``); free space, retry."""

    code = "stateFull"


class StateIoError(StateUnavailableError):
    """The OS failed a read or write (``SQLITE_IOERR*``, ``EIO``, an open); the message says."""

    code = "stateIo"


class StateCorruptError(StateUnavailableError):
    """The state database is damaged (``SQLITE_CORRUPT``, ``SQLITE_NOTADB`` inside a verified
    file). Retrying does not help: stop the server, then restore a backup or move the file."""

    code = "stateCorrupt"
    #: SQLite's own description of the damage, when SQLite gave one.
    sqlite_message: str | None = None


class StaleRevisionError(StateError):
    """The caller's expected revision of an aggregate is not the stored one."""

    code = "staleRevision"

    def __init__(
        self, resource_id: str, expected: int, actual: int | None, *, next_step: str = ""
    ) -> None:
        found = "missing" if actual is None else f"at revision {actual}"
        message = f"{resource_id} expected at revision {expected}, found {found}"
        super().__init__(f"{message}; {next_step}" if next_step else message)
        self.resource_id = resource_id
        self.expected = expected
        self.actual = actual


class ClaimLostError(StateError):
    """The caller no longer holds its claim (one ``reason`` says why): a handoff, never a
    failure; the old owner stops and writes nothing more."""

    code = "claimLost"

    def __init__(self, reason: ClaimLostReason, resource_id: str, generation: int) -> None:
        if reason not in CLAIM_LOST_REASONS:
            raise ValueError(f"unknown claim-lost reason {reason!r}")
        super().__init__(f"claim lost on {resource_id} (generation {generation}): {reason}")
        self.reason: ClaimLostReason = reason
        self.resource_id = resource_id
        self.generation = generation


class BlobConflictError(StateError):
    """Different bytes or media type were offered under a digest that is already stored."""

    code = "blobConflict"


class BlobMissingError(StateError):
    """No blob is stored under the digest that was read."""

    code = "blobMissing"


class BlobTypeError(StateError):
    """A blob was read as a media type other than the one it was stored with."""

    code = "blobType"


class BackupError(StateError):
    """A backup destination cannot take a backup, or the copy did not verify; no file was left
    under its name. The message says what to change (an OS reason as ``ENAME: text``)."""

    code = "backupFailed"


class InvalidTransitionError(StateError):
    """A lifecycle change was asked of a row whose current state does not allow it."""

    code = "invalidTransition"


class WorkflowError(PiwfError):
    """A problem with a workflow definition, file or run command."""

    code = "workflowError"


class WorkflowDefinitionError(WorkflowError):
    """A workflow definition breaks an authoring rule; the message names the rule."""

    code = "workflowDefinition"


class WorkflowLoadError(WorkflowError):
    """A workflow file could not be loaded; the message names the file and the problem."""

    code = "workflowLoad"


class RunCommandError(WorkflowError):
    """A run command does not fit the saved run state; no workflow code ran."""

    code = "runCommand"


class RunPausedError(RunCommandError):
    """The run is paused: answers, submissions and updates wait until it is resumed."""

    code = "runPaused"


class AnswerRejectedError(WorkflowError):
    """An answer does not fit its request (choices, protection, status); nothing settled."""

    code = "answerRejected"


class NotDecisionRequestError(WorkflowError):
    """An agent step's request takes a submitted output (``piwf submit``), not an answer."""

    code = "notDecisionRequest"


class SubmissionError(WorkflowError):
    """An agent submission was refused before or by validation; nothing else changed."""

    code = "submissionError"


class RequestNotOpenError(SubmissionError):
    """The request is answered, closed, or belongs to an attempt that is no longer active."""

    code = "requestNotOpen"


class NotAgentRequestError(SubmissionError):
    """A submission named a checkpoint or decision; those are answered (``piwf answer``)."""

    code = "notAgentRequest"


class ValidationPendingError(SubmissionError):
    """Another candidate of the request is being validated; wait for its outcome first."""

    code = "validationPending"


class RequestRunMismatchError(SubmissionError):
    """The frame's run id is not the run of the request it names."""

    code = "requestRunMismatch"


class SubmissionKeyConflictError(SubmissionError):
    """The idempotency key was already used for another output of the same request."""

    code = "idempotencyConflict"


class SubmissionRejectedError(SubmissionError):
    """The candidate was rejected (its ``validate`` refused it, or its validation stopped); the
    request stays pending and the message says what to submit instead."""

    code = "submissionRejected"


class AgentCommandError(WorkflowError):
    """An agent command is not a list of non-empty strings (or ``'CMD ARGS'`` that splits into
    one); nothing was sent or started."""

    code = "agentCommand"


class MissingSubmissionError(WorkflowError):
    """An agent step's command ended three turns (two of them reminders) without an accepted
    submission: the attempt failed. Its code starts the node's error text."""

    code = "missingSubmission"


class SessionError(WorkflowError):
    """An interactive session's rule was broken; nothing changed."""

    code = "sessionError"


class SessionBusyError(SessionError):
    """The session is reserved by another unfinished interactive run (one at a time)."""

    code = "sessionBusy"


class SessionAuthorityError(SessionError):
    """The request needs the session's active coordinator epoch, and did not carry it."""

    code = "sessionAuthority"


class SettingsChangeError(WorkflowError):
    """A live-settings change was refused; nothing changed. The message says why."""

    code = "settingsRefused"


class SettingsConflictError(SettingsChangeError):
    """A live-settings change was based on another change than the newest."""

    code = "settingsConflict"


class ContentReadError(PiwfError):
    """A value sent by content reference could not be read (docs/PROTOCOL.md, ``view.content``)."""

    code = "contentRead"


class ContentReferenceError(ContentReadError):
    """A ``view.content`` request names a range the reference cannot serve (rejected)."""

    code = "contentReference"


class ContentNotFoundError(ContentReadError):
    """The reference names no stored value of its run or resource (notFound): a made-up or
    foreign digest, another media type or length, or a value deleted since it was advertised."""

    code = "contentNotFound"


class ContentMismatchError(ContentReadError):
    """The client assembled parts that do not match their reference (length, digest, media
    type or encoding); no partial value is ever returned. Read the value again."""

    code = "contentMismatch"


class LogReadError(PiwfError):
    """A ``run.logs`` read names something the run's logs cannot serve; nothing changed."""

    code = "logRead"


class NodeNotInRunError(LogReadError):
    """The run's workflow has no node of that path; the message names the ones it has."""

    code = "nodeNotFound"


class LogCursorError(LogReadError):
    """A log cursor names no attempt log of the run, or an offset past its end."""

    code = "logCursor"


class InternalError(PiwfError):
    """An unexpected failure inside the server (a bug); the operation was undone and nothing
    was stored. The message names the operation and the exception class, never its text."""

    code = "internalError"


class MissingExtraError(PiwfError):
    """A command needs an optional extra that is not installed; the message names the
    ``pip install 'piwf[...]'`` that brings it."""

    code = "missingExtra"


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


class CommandError(PiwfError):
    """A command was answered with a non-success outcome; ``code`` is the wire error code."""

    code = "commandError"

    def __init__(self, message: str, *, error_code: str | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code or self.code


class RejectedError(CommandError):
    """The server refused the command (invalid payload, wrong state, failed check)."""

    code = "rejected"


class ConflictError(CommandError):
    """The command contradicts stored state or reuses an idempotency key with another payload."""

    code = "conflict"


class NotFoundError(CommandError):
    """The command names something that does not exist."""

    code = "notFound"


class UnavailableError(CommandError):
    """The server could not take the command now (stopping, busy); retrying may succeed."""

    code = "unavailable"


class ClaimLostCommandError(CommandError):
    """The command needed a claim that is no longer held (``claimLost``); nothing changed."""

    code = "claimLost"


class BackupFailedError(RejectedError):
    """The server could not use the backup destination (``backupFailed``); fix it, then retry."""

    code = "backupFailed"


class SubmissionRejectedCommandError(RejectedError):
    """The server rejected an agent submission (``submissionRejected``); the message is the
    stored, actionable error. The request stays pending: fix the output and submit again."""

    code = "submissionRejected"


class ValidationPendingCommandError(RejectedError):
    """Another candidate of the request is still being validated (``validationPending``); wait
    for its outcome (a submit with its idempotency key returns it), then submit again."""

    code = "validationPending"


class SessionAuthorityCommandError(RejectedError):
    """The command needs the session's active coordinator epoch (``sessionAuthority``);
    nothing changed. From a :class:`~piwf.client.sessions.SessionCoordinator` it means another
    coordinator attached after it (it was fenced): attach again to take the session back."""

    code = "sessionAuthority"


class InternalServerError(RejectedError):
    """The server failed unexpectedly on the command (``internalError``); nothing changed."""

    code = "internalError"


class StateFullCommandError(UnavailableError):
    """The server's disk is full (``stateFull``); nothing changed. Free space, then retry."""

    code = "stateFull"


class StateIoCommandError(UnavailableError):
    """The server hit an I/O error on its files (``stateIo``); nothing changed."""

    code = "stateIo"


class StateCorruptCommandError(UnavailableError):
    """The server's state database is damaged (``stateCorrupt``); nothing changed. Stop the
    server, then restore a backup or move the file aside."""

    code = "stateCorrupt"


class IncompatibleServerError(ServerUnavailableError):
    """The server runs another piwf package version; this client does not talk to it."""

    code = "incompatibleServer"


class ServerNotRunningError(ServerUnavailableError):
    """No server listens for the state home and the client was told not to start one."""
