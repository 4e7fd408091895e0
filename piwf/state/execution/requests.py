"""Interactive requests (``interactive_requests``): the one module that writes them.

A node visit that waits for an answer commits one request; at most one request of a run is open
(pending or answered) at a time::

    insert ─▶ pending ─(answer, timeout policy, accepted submission)─▶ answered
                 │                                        ─node finished─▶ settled
                 └─rejected submission: stays pending, its error kept as the latest rejection
    pending | answered ─node failed, finish, cancel─▶ cancelled

Every read returns :class:`RequestRow` (the request with its visit's path and number). Writers
run inside the caller's one change and never commit; their ``WHERE`` clause states the status
they expect.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from piwf.lifecycle import AnsweredBy, InteractionKind
from piwf.state.database import Transaction
from piwf.state.enums import InteractionStatus
from piwf.state.execution import messages

_SELECT = """
SELECT i.request_id, i.run_id, i.attempt_id, i.kind, i.content_hash, i.on_timeout_hash,
       i.timeout_ms, i.status, i.answer_hash, i.answered_by, i.rejection_hash, i.created_at,
       a.node_path, a.visit
FROM interactive_requests i JOIN node_attempts a ON a.attempt_id = i.attempt_id
"""

_SELECT_OPEN_OF_ATTEMPT = (
    _SELECT + " WHERE i.attempt_id = ? AND i.status IN ('pending', 'answered')"
)

_SELECT_PENDING = (
    _SELECT
    + """
WHERE i.status = 'pending' AND (:run_id IS NULL OR i.run_id = :run_id)
  AND (:after_at IS NULL OR (i.created_at, i.request_id) > (:after_at, :after_id))
ORDER BY i.created_at, i.request_id
LIMIT :limit
"""
)

_INSERT = """
INSERT INTO interactive_requests (request_id, run_id, attempt_id, kind, content_hash,
                                  on_timeout_hash, timeout_ms, status, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)
"""

_ANSWER = """
UPDATE interactive_requests
SET status = 'answered', answer_hash = ?, answered_by = ?, rejection_hash = NULL, updated_at = ?
WHERE request_id = ? AND status = 'pending'
"""

_RECORD_REJECTION = """
UPDATE interactive_requests SET rejection_hash = ?, updated_at = ?
WHERE request_id = ? AND status = 'pending'
"""

_SETTLE = """
UPDATE interactive_requests SET status = 'settled', updated_at = ?
WHERE request_id = ? AND status = 'answered'
"""

_CANCEL = """
UPDATE interactive_requests SET status = 'cancelled', updated_at = ?
WHERE request_id = ? AND status IN ('pending', 'answered')
"""

_CANCEL_OPEN_OF_RUN = """
UPDATE interactive_requests SET status = 'cancelled', updated_at = ?
WHERE run_id = ? AND status IN ('pending', 'answered')
"""


@dataclass(frozen=True)
class RequestRow:
    """One request and the visit (path, number) of the attempt that waits on it."""

    request_id: str
    run_id: str
    attempt_id: str
    kind: InteractionKind
    content_hash: bytes
    on_timeout_hash: bytes | None
    timeout_ms: int | None
    status: InteractionStatus
    answer_hash: bytes | None
    answered_by: AnsweredBy | None
    rejection_hash: bytes | None
    created_at: int
    path: str
    visit: int


def command_of_the_other_kind(
    request: RequestRow, command: str, kind_text: str, *, instead: str | None = None
) -> str:
    """The end of a refusal of an answer or submission of the other kind (a submission for a
    checkpoint, an answer for an agent step): while ``request`` is pending, ``command`` (``piwf
    answer`` or ``piwf submit``) that fits it, after ``kind_text`` (such as "answer it with"),
    or ``instead`` when the caller knows better advice (:func:`agent_request_host`); once it is
    answered, settled or cancelled, that it takes nothing more and where its outcome shows (its
    winner, or its accepted output)."""
    if request.status is InteractionStatus.PENDING:
        if instead is not None:
            return instead
        return f"{kind_text}: {command} {request.request_id} '<json>'"
    show = f"piwf run show {request.run_id}"
    if request.status is InteractionStatus.CANCELLED:
        return f"it is cancelled and takes nothing more ({show})"
    outcome = "its accepted output" if request.kind is InteractionKind.AGENT else "its winner"
    return f"it is settled already and takes nothing more ({outcome}: {show})"


def agent_request_host(tx: Transaction, run_id: str, kind: str) -> str | None:
    """How an agent request (``kind``) of an interactive run is fulfilled: through its
    session's host, since ``piwf submit`` is refused there (``sessionAuthority``); None for
    another kind of request or a headless run."""
    if kind != InteractionKind.AGENT.value:
        return None
    session = messages.session_of(tx, run_id)
    return None if session is None else f"through its session: piwf session attach {session}"


# Reads -------------------------------------------------------------------------------------


def get_request(tx: Transaction, request_id: str) -> RequestRow | None:
    """Return one request, or None."""
    row = tx.one(_SELECT + " WHERE i.request_id = ?", (request_id,))
    return None if row is None else _request(row)


def open_request(tx: Transaction, attempt_id: str) -> RequestRow | None:
    """Return the attempt's open (pending or answered) request, or None."""
    row = tx.one(_SELECT_OPEN_OF_ATTEMPT, (attempt_id,))
    return None if row is None else _request(row)


def pending_requests(
    tx: Transaction,
    run_id: str | None = None,
    *,
    after: tuple[int, str] | None = None,
    limit: int = -1,
) -> list[RequestRow]:
    """Return the pending requests of every kind (of one run, or of all), oldest first: those
    after ``after`` (a request's ``(created_at, request_id)``), at most ``limit`` (-1: all)."""
    after_at, after_id = (None, None) if after is None else after
    parameters = {"run_id": run_id, "after_at": after_at, "after_id": after_id, "limit": limit}
    return [_request(row) for row in tx.all(_SELECT_PENDING, parameters)]


# Writes (inside the caller's one change) ---------------------------------------------------


def insert_request(
    tx: Transaction,
    *,
    request_id: str,
    run_id: str,
    attempt_id: str,
    kind: InteractionKind,
    content_hash: bytes,
    on_timeout_hash: bytes | None,
    timeout_ms: int | None,
) -> None:
    """Insert a ``pending`` request of the attempt."""
    tx.execute(
        _INSERT,
        (
            request_id,
            run_id,
            attempt_id,
            kind.value,
            content_hash,
            on_timeout_hash,
            timeout_ms,
            tx.now,
            tx.now,
        ),
    )


def answer(
    tx: Transaction, request_id: str, *, answer_hash: bytes, answered_by: AnsweredBy
) -> None:
    """A ``pending`` request becomes ``answered`` (an earlier rejection is cleared); the
    messages presenting it are withdrawn."""
    tx.execute(_ANSWER, (answer_hash, answered_by.value, tx.now, request_id))
    messages.source_closed(tx, request_id)


def record_rejection(tx: Transaction, request_id: str, rejection_hash: bytes) -> None:
    """A ``pending`` request keeps ``rejection_hash`` (a text blob) as its latest rejection."""
    tx.execute(_RECORD_REJECTION, (rejection_hash, tx.now, request_id))


def settle(tx: Transaction, request_id: str) -> None:
    """An ``answered`` request becomes ``settled`` (its visit finished with the answer)."""
    tx.execute(_SETTLE, (tx.now, request_id))


def cancel(tx: Transaction, request_id: str) -> None:
    """An open request becomes ``cancelled``; the messages presenting it are withdrawn."""
    tx.execute(_CANCEL, (tx.now, request_id))
    messages.source_closed(tx, request_id)


def cancel_open_of_run(tx: Transaction, run_id: str) -> None:
    """Every open request of the run becomes ``cancelled``."""
    tx.execute(_CANCEL_OPEN_OF_RUN, (tx.now, run_id))


def _request(row: sqlite3.Row) -> RequestRow:
    return RequestRow(
        request_id=row["request_id"],
        run_id=row["run_id"],
        attempt_id=row["attempt_id"],
        kind=InteractionKind(row["kind"]),
        content_hash=bytes(row["content_hash"]),
        on_timeout_hash=_optional_bytes(row["on_timeout_hash"]),
        timeout_ms=row["timeout_ms"],
        status=InteractionStatus(row["status"]),
        answer_hash=_optional_bytes(row["answer_hash"]),
        answered_by=None if row["answered_by"] is None else AnsweredBy(row["answered_by"]),
        rejection_hash=_optional_bytes(row["rejection_hash"]),
        created_at=row["created_at"],
        path=row["node_path"],
        visit=row["visit"],
    )


def _optional_bytes(value: bytes | None) -> bytes | None:
    return None if value is None else bytes(value)
