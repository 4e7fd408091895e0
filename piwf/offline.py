"""Offline verification of an inactive state file (a backup): the one client-side SQLite read.

Clients never open the live database; ``piwf state verify BACKUP`` is the documented exception.
It opens the file read-only (an inactive file through an immutable connection, so no -wal or
-shm appears beside it), checks its identity, integrity, foreign keys and domain invariants, and
never repairs anything. A file that a live server is using (a -wal beside it) is refused: ask
that server with ``piwf state verify`` instead.
"""

from __future__ import annotations

from pathlib import Path

from piwf.errors import StateError
from piwf.state import StateDatabase
from piwf.state.diagnostics import Violation, find_violations


class LiveDatabaseError(StateError):
    """The file is in use by a server; it is verified through that server, not offline."""

    code = "liveDatabase"


def verify_file(path: Path) -> list[Violation]:
    """Return the violations of the inactive state file at ``path`` (empty when sound).

    Raises :class:`LiveDatabaseError` for a file with a -wal beside it, and
    :class:`~piwf.errors.IncompatibleStateError` for a file that is not a piwf database of this
    schema.
    """
    if Path(f"{path}-wal").exists():
        raise LiveDatabaseError(
            f"{path} is in use (it has a -wal file); run `piwf state verify` without a path"
        )
    with StateDatabase(path, mode="read-only") as database, database.read() as tx:
        return find_violations(tx)
