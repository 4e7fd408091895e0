"""Offline verification of an inactive state file (a backup): the one client-side SQLite read.

Clients never open the live database; ``piwf state verify BACKUP`` (and ``piwf state restore``,
which verifies the copy it installs) are the documented exception. The file is read read-only
(through an immutable connection, so no -wal or -shm appears beside it); nothing is repaired::

    a symlink, not a regular file, hard-linked, another user's, open to group or others
                                  -> UnsafeStateHomeError (file_damage.check_inactive_file;
                                     nothing is opened, so a FIFO cannot block)
    a -wal or -journal beside it  -> LiveDatabaseError (in use, or copied without its journal)
    header and size               -> integrity violations (empty, not SQLite, truncated, ...)
    identity (application id, user_version, schema_meta, shape)
        unreadable                -> integrity violations from integrity_check
        not piwf's                -> IncompatibleStateError
    integrity, foreign keys, domain invariants -> their violations

Damage is always a violation with code ``integrity`` (never an exception), so ``state verify
--json`` reports ``{"valid": false, ...}`` for a damaged copy.
"""

from __future__ import annotations

import os
from pathlib import Path

from piwf.client.arguments import path_argument
from piwf.errors import IncompatibleStateError, StateCorruptError, StateError
from piwf.state import StateDatabase
from piwf.state.database import RESET_INSTRUCTION
from piwf.state.diagnostics import Violation, verify_database
from piwf.state.file_damage import check_inactive_file, header_damage, sqlite_damage

#: Files SQLite may pair with a database: their presence means it is not self-contained.
JOURNAL_SUFFIXES = ("-wal", "-journal")


class LiveDatabaseError(StateError):
    """The file is in use by a server (or was copied with a journal beside it); it is verified
    through that server, not offline."""

    code = "liveDatabase"


def refuse_journals(path: Path) -> None:
    """Raise :class:`LiveDatabaseError` when a -wal or -journal lies beside ``path``.

    A -wal means a server may be writing the file, or that the copy was taken without the
    changes still in the WAL; a -journal means an interrupted write. Either way the file alone
    is not the database, and reading it immutably would ignore what the journal holds.
    """
    for suffix in JOURNAL_SUFFIXES:
        journal = Path(f"{path}{suffix}")
        if journal.exists() or journal.is_symlink():
            raise LiveDatabaseError(
                f"{path} has a {suffix} file beside it, so it is in use or was copied "
                "without its journal: verify a live database with `piwf state verify` (no "
                "path), and make a self-contained copy with `piwf state backup DEST`"
            )


def verify_file(path: str | os.PathLike[str]) -> list[Violation]:
    """Return the violations of the inactive state file at ``path`` (empty when sound).

    ``path`` is a ``str`` or ``os.PathLike`` (relative: against the current directory);
    anything else is an :class:`~piwf.errors.InvalidArgumentError`.

    Damage of every kind is an ``integrity`` violation. Raises :class:`LiveDatabaseError` for
    a file with a -wal or -journal beside it, :class:`~piwf.errors.IncompatibleStateError` for
    an intact SQLite file that is not a piwf database of this schema, and
    :class:`~piwf.errors.UnsafeStateHomeError` for a symlink, a file that is not a regular file
    (never opened), a hard-linked file, another user's file or one open to group or others.
    """
    path = path_argument("path", path)
    check_inactive_file(path)
    refuse_journals(path)
    damage = header_damage(path)
    if damage:
        return damage
    try:
        with StateDatabase(path, mode="read-only") as database:
            return verify_database(database)
    except (IncompatibleStateError, StateCorruptError) as error:
        # Damage in the schema pages stops the identity check first: report it as damage.
        damage = sqlite_damage(path)
        if damage:
            return damage
        if isinstance(error, IncompatibleStateError):
            raise _not_a_backup(error, path) from None
        raise


def _not_a_backup(error: IncompatibleStateError, path: Path) -> IncompatibleStateError:
    """The open's refusal of a file that is not piwf's state of this schema, its advice for the
    live state file (move it aside, start piwf again) replaced by what a backup must be."""
    text = str(error).replace(". " + RESET_INSTRUCTION.format(name=path.name), "")
    return type(error)(
        f"{text}: it is not a state database of this piwf version; give a file that"
        " `piwf state backup` wrote"
    )
