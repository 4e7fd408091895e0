"""Errors of the durable state: the database file and its home, its availability, revisions,
claims, blobs, backups and lifecycle transitions (the ``StateError`` branch of
:mod:`piwf.errors`)."""

from __future__ import annotations

from typing import Literal

from piwf.errors.base import PiwfError

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
