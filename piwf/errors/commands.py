"""The client's errors for a command's outcome: one class per non-success outcome, and finer ones
per wire code (the ``CommandError`` branch of :mod:`piwf.errors`; ``client.CODE_ERRORS`` maps
codes to them)."""

from __future__ import annotations

from piwf.errors.base import PiwfError


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
