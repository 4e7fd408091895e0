"""Durable command execution: receipt lookup, the change and its receipt in one transaction.

Every state-changing operation goes through :meth:`DurableCommands.execute` (or
:meth:`~DurableCommands.execute_later`, the same steps in the loop turn's group commit, whose one
``COMMIT`` then serves several commands and runner calls)::

    BEGIN IMMEDIATE
      verify this server still holds its epoch         (an older epoch writes nothing)
      look up (requestId) and (clientId, idempotencyKey)
        same fingerprint   -> replay the stored receipt (accepted becomes adopted)
        other fingerprint  -> conflict, nothing stored, nothing changed
        nothing stored     -> run the change, store its receipt
    COMMIT
    answer the client

so an answer is only ever sent for a committed receipt (the loop marks the fault point
``cmd.after_commit_before_reply`` just before it writes the answer), and a retry after a lost answer
(new request id, same key and payload) gets that receipt instead of a second execution.

When the database itself fails (locked, full, an I/O error, a damaged page:
:class:`~piwf.errors.StateUnavailableError`) the transaction is rolled back and the answer is
``unavailable`` with nothing stored, because nothing could be: a retry under the same key runs
the command afresh once the cause is gone. When this server's epoch is no longer live, the
answer is ``unavailable`` too and ``on_epoch_lost`` stops the server at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from piwf import faults
from piwf.errors import ClaimLostError, PiwfError, StateUnavailableError
from piwf.protocol.client_v1 import ErrorInfo, Outcome, Request, Response
from piwf.protocol.fingerprint import request_fingerprint
from piwf.server.failures import failure_response, log_failure
from piwf.state import StateDatabase, Transaction
from piwf.state.commands import Fresh, Replay, Reused, lookup_command, store_command
from piwf.state.enums import CommandOutcome
from piwf.state.server_epoch import SERVER_RESOURCE, ServerClaim, verify_server_claim


@dataclass(frozen=True)
class CommandResult:
    """What one executed command produced; stored as its receipt."""

    outcome: Outcome
    receipt: dict[str, Any] | None = None
    error: PiwfError | None = None
    run_id: str | None = None
    revision: int | None = None

    @classmethod
    def accepted(
        cls, receipt: dict[str, Any], *, run_id: str | None = None, revision: int | None = None
    ) -> CommandResult:
        """A successful change."""
        return cls("accepted", receipt=receipt, run_id=run_id, revision=revision)

    @classmethod
    def failed(
        cls, outcome: Outcome, error: PiwfError, *, run_id: str | None = None
    ) -> CommandResult:
        """A refused command (stored too, so a retry gets the same answer)."""
        return cls(outcome, error=error, run_id=run_id)


@dataclass
class DurableCommands:
    """Runs durable commands under this server's epoch with stored receipts."""

    db: StateDatabase
    claim: ServerClaim
    on_committed: list[Callable[[], None]] = field(default_factory=list)
    #: Called when a command finds this server's epoch lost (the lifecycle stops the server).
    on_epoch_lost: Callable[[ClaimLostError], None] = lambda _error: None

    @contextmanager
    def fenced_write(self) -> Iterator[Transaction]:
        """A write transaction that first proves this server still holds its epoch."""
        with self.db.write() as tx:
            verify_server_claim(tx, self.claim)
            yield tx

    def lookup(self, request: Request) -> Response | None:
        """Return the answer for a replayed or reused command, or None when it is new.

        Raises :class:`StateUnavailableError` when the database cannot be read.
        """
        with self.db.read() as tx:
            return self._answer_for(request, _lookup(tx, request))

    def execute(
        self,
        request: Request,
        change: Callable[[Transaction], CommandResult],
        *,
        own_savepoint: bool = True,
    ) -> Response:
        """Run ``change`` once per idempotency key and return the answer to send.

        ``change`` runs inside the transaction, in its own savepoint, and must not commit; a
        :class:`PiwfError` it raises is stored as a ``rejected`` receipt. A busy or failing
        database (:class:`StateUnavailableError`) and a lost server epoch answer ``unavailable``
        with nothing stored, so the client may retry. Any other exception propagates with
        nothing stored (the handler boundary answers it).

        ``own_savepoint=False`` is for a change that opens many savepoints itself (a prune, one
        per tree): inside an open savepoint SQLite keeps the undo copy of every page each
        nested savepoint or statement changes, in memory, until the outer one ends. Without
        it, a :class:`PiwfError` the change raises propagates too, nothing stored.
        """
        try:
            with self.db.write() as tx:
                response = self._execute_in(tx, request, change, own_savepoint)
        except StateUnavailableError as error:
            return self._unavailable(request, error)
        except ClaimLostError as error:
            if error.resource_id != SERVER_RESOURCE:
                raise
            return self._epoch_lost(request, error)
        return response

    def execute_later(
        self,
        request: Request,
        change: Callable[[Transaction], CommandResult],
        answered: Callable[[Response], None],
    ) -> None:
        """:meth:`execute` in the loop turn's group commit: the same checks, change and receipt
        in the command's own savepoint of the turn's one transaction (piwf/state/group_commit.py),
        and ``answered`` gets the answer once that committed (or failed: ``unavailable`` with
        nothing stored, or the typed failure of a change that raised something unexpected)."""
        self.db.group.defer(_QueuedCommand(self, request, change, answered))

    def _execute_in(
        self,
        tx: Transaction,
        request: Request,
        change: Callable[[Transaction], CommandResult],
        own_savepoint: bool = True,
    ) -> Response:
        """Inside ``tx``: prove the epoch, replay a stored receipt, or run ``change`` (in its
        own savepoint unless told otherwise) and store its receipt; return the answer to send
        once ``tx`` commits."""
        verify_server_claim(tx, self.claim)
        answer = self._answer_for(request, _lookup(tx, request))
        if answer is not None:
            return answer
        if not own_savepoint:
            result = change(tx)  # anything it raises rolls the whole transaction back
        else:
            try:
                with tx.savepoint() as step:
                    result = change(step)
            except StateUnavailableError:
                raise  # the file failed: this transaction cannot store anything
            except PiwfError as error:
                result = CommandResult.failed("rejected", error)
        self._store(tx, request, result)
        faults.point("cmd.before_commit")
        return _response(request.request_id, result)

    def _unavailable(self, request: Request, error: StateUnavailableError) -> Response:
        log_failure(request.operation, error)
        return _response(request.request_id, CommandResult.failed("unavailable", error))

    def _epoch_lost(self, request: Request, error: ClaimLostError) -> Response:
        log_failure(request.operation, error)
        self.on_epoch_lost(error)
        return _response(request.request_id, CommandResult.failed("unavailable", error))

    def store(self, request: Request, result: CommandResult) -> Response:
        """Store the receipt of a command whose change already happened outside SQLite
        (a backup file) or in an earlier transaction; adopt if one is already stored."""
        return self.execute(request, lambda _tx: result)

    def _store(self, tx: Transaction, request: Request, result: CommandResult) -> None:
        store_command(
            tx,
            request_id=request.request_id,
            client_id=request.client_id,
            operation=request.operation,
            idempotency_key=_key(request),
            fingerprint=request_fingerprint(request),
            outcome=CommandOutcome(result.outcome),
            server_epoch=self.claim.epoch,
            run_id=result.run_id,
            accepted_revision=result.revision,
            receipt=result.receipt,
            error=None if result.error is None else _error_json(result.error),
        )

    def _answer_for(self, request: Request, found: Replay | Reused | Fresh) -> Response | None:
        if isinstance(found, Fresh):
            return None
        if isinstance(found, Reused):
            return Response(
                request_id=request.request_id,
                outcome="conflict",
                error=ErrorInfo(code="idempotencyConflict", message=found.evidence),
            )
        stored = found.stored
        outcome: Outcome = "adopted"
        if stored.outcome is not CommandOutcome.ACCEPTED:
            outcome = stored.outcome.value
        error = stored.error
        return Response(
            request_id=request.request_id,
            outcome=outcome,
            revision=stored.accepted_revision,
            receipt=stored.receipt if isinstance(stored.receipt, dict) else None,
            error=ErrorInfo.model_validate(error) if isinstance(error, dict) else None,
        )


def _lookup(tx: Transaction, request: Request) -> Replay | Reused | Fresh:
    """What is stored under ``request``'s id and idempotency key."""
    return lookup_command(
        tx,
        request_id=request.request_id,
        client_id=request.client_id,
        idempotency_key=_key(request),
        fingerprint=request_fingerprint(request),
    )


def _key(request: Request) -> str:
    assert request.idempotency_key is not None, "durable requests carry a key (protocol rule)"
    return request.idempotency_key


def _error_json(error: PiwfError) -> dict[str, Any]:
    info = ErrorInfo.of(error)
    return {"code": info.code, "message": info.message}


def _response(request_id: str, result: CommandResult) -> Response:
    return Response(
        request_id=request_id,
        outcome=result.outcome,
        revision=result.revision,
        receipt=result.receipt,
        error=None if result.error is None else ErrorInfo.of(result.error),
    )


class _ChangeFailedError(PiwfError):
    """A queued command's change raised an exception that is not a piwf error (a bug): carried
    out of its savepoint, so its writes are undone, and answered as that exception's failure."""

    code = "internalError"

    def __init__(self, error: Exception) -> None:
        super().__init__(type(error).__name__)
        self.error = error


@dataclass(frozen=True)
class _QueuedCommand:
    """One durable command in the loop turn's group commit (a ``DeferredWrite``)."""

    commands: DurableCommands
    request: Request
    change: Callable[[Transaction], CommandResult]
    answered: Callable[[Response], None]

    def apply(self, tx: Transaction) -> Callable[[], None]:
        try:
            response = self.commands._execute_in(tx, self.request, self.change)
        except PiwfError:
            raise
        except Exception as error:
            raise _ChangeFailedError(error) from error
        return lambda: self.answered(response)

    def refused(self, error: PiwfError) -> Callable[[], None]:
        request = self.request
        if isinstance(error, ClaimLostError) and error.resource_id == SERVER_RESOURCE:
            response = self.commands._epoch_lost(request, error)
        elif isinstance(error, _ChangeFailedError):
            response = failure_response(request, error.error)
        else:
            response = failure_response(request, error)
        return lambda: self.answered(response)

    def unavailable(self, error: StateUnavailableError) -> None:
        self.answered(self.commands._unavailable(self.request, error))
