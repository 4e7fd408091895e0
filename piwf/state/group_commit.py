"""Group commit: writes queued during one server loop turn share one transaction and one fsync.

A writer that may wait for the end of the turn (the server's runner messages) queues a
:class:`DeferredWrite` with :meth:`GroupCommit.defer` instead of opening its own transaction.
:meth:`GroupCommit.flush` applies everything queued, in the order queued, in one
``BEGIN IMMEDIATE`` transaction, each write in its own savepoint, and commits once::

    BEGIN IMMEDIATE
      SAVEPOINT  write 1  RELEASE              applied
      SAVEPOINT  write 2  ROLLBACK TO/RELEASE  refused (a failed check): only its own changes undone
      SAVEPOINT  write 3  RELEASE              applied
    COMMIT                                     one fsync for all three
    then, in order: write 1 committed, write 2 refused, write 3 committed

Nothing is answered before the commit: every continuation (an answer to a child, a stop) runs
after ``COMMIT`` returned. When the file fails (``StateUnavailableError`` from a statement,
``BEGIN`` or ``COMMIT``), nothing of the group was committed and every write in it is told
:meth:`DeferredWrite.unavailable`, in order, to retry later.

Any other transaction (:meth:`StateDatabase.write`) first flushes what is queued, so queued
writes are applied before every write that began after them: deferring changes when a write
commits within the turn, never the order of writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from piwf.errors import PiwfError, StateUnavailableError

if TYPE_CHECKING:
    from piwf.state.database import StateDatabase, Transaction

log = logging.getLogger("piwf.state")

#: What runs once the group's transaction has committed (or its write was refused).
Continuation = Callable[[], None]


class DeferredWrite(Protocol):
    """One write waiting for the turn's commit."""

    def apply(self, tx: Transaction) -> Continuation:
        """Make the write inside ``tx`` (its own savepoint) and return what to do once it is
        committed. Raising a :class:`~piwf.errors.PiwfError` undoes this write alone."""
        ...

    def refused(self, error: PiwfError) -> Continuation:
        """``apply`` raised ``error`` (not a failure of the file): what to do after the commit."""
        ...

    def unavailable(self, error: StateUnavailableError) -> None:
        """The file failed: nothing of the group was committed; try again later."""
        ...


class GroupCommit:
    """The writes queued for one database handle, applied together by :meth:`flush`."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db
        self._queued: list[DeferredWrite] = []
        #: How many groups committed and how many writes they held (for the benchmarks).
        self.groups = 0
        self.writes = 0

    @property
    def pending(self) -> bool:
        """Whether a write waits for the next :meth:`flush`."""
        return bool(self._queued)

    def defer(self, write: DeferredWrite) -> None:
        """Queue ``write`` for the next :meth:`flush` (at the latest, the end of the turn)."""
        self._queued.append(write)

    def flush(self) -> None:
        """Apply every queued write in one transaction, commit, then run the continuations."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        continuations: list[Continuation] = []
        try:
            with self._db.write_now() as tx:
                for write in queued:
                    continuations.append(_apply_one(tx, write))
        except StateUnavailableError as error:
            for write in queued:
                write.unavailable(error)
            return
        self.groups += 1
        self.writes += len(queued)
        for continuation in continuations:
            try:
                continuation()
            except Exception:  # one write's follow-up must not starve the rest of the group
                log.exception("a committed write's follow-up failed")


def _apply_one(tx: Transaction, write: DeferredWrite) -> Continuation:
    """Apply ``write`` in its own savepoint; a refusal undoes its changes alone."""
    try:
        with tx.savepoint():
            return write.apply(tx)
    except StateUnavailableError:
        raise
    except PiwfError as error:
        return write.refused(error)
    except Exception:
        # A bug in one write: its changes are undone and it gets no answer (as when it ran
        # alone and its callback raised); the rest of the group still commits.
        log.exception("a queued write failed")
        return _nothing


def _nothing() -> None:
    return None
