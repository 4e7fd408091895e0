"""Receipts of state-changing client commands (``server_commands``).

A receipt is written in the same transaction as the change it reports, and only then is the
command answered. Lookups decide what a repeated command gets:

- the same request id with the same fingerprint: the stored receipt again;
- a new request id with the same client id, idempotency key and fingerprint: the stored receipt
  (the command is *adopted*, nothing runs twice);
- the same idempotency key (or request id) with another fingerprint: a conflict, and the stored
  receipt is left untouched.

The fingerprint is the SHA-256 of the canonical request without its request id.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal

from piwf.canonical import JsonValue
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.enums import CommandOutcome

_SELECT = """
SELECT request_id, client_id, operation, idempotency_key, request_fingerprint, run_id,
       accepted_revision, outcome, receipt_hash, error_hash, server_epoch, created_at
FROM server_commands
"""

_INSERT = """
INSERT INTO server_commands (request_id, client_id, operation, idempotency_key,
                             request_fingerprint, run_id, accepted_revision, outcome,
                             receipt_hash, error_hash, server_epoch, created_at, completed_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""


@dataclass(frozen=True)
class StoredCommand:
    """One stored receipt, with its body read back."""

    request_id: str
    client_id: str
    operation: str
    idempotency_key: str
    fingerprint: bytes
    run_id: str | None
    accepted_revision: int | None
    outcome: CommandOutcome
    receipt: JsonValue
    error: JsonValue
    server_epoch: int


@dataclass(frozen=True)
class Replay:
    """The command was already executed: answer with the stored receipt."""

    stored: StoredCommand
    kind: Literal["replay"] = "replay"


@dataclass(frozen=True)
class Reused:
    """The request id or idempotency key was used before with another request."""

    evidence: str
    kind: Literal["reused"] = "reused"


@dataclass(frozen=True)
class Fresh:
    """Nothing is stored for this command: execute it."""

    kind: Literal["fresh"] = "fresh"


def lookup_command(
    tx: Transaction, *, request_id: str, client_id: str, idempotency_key: str, fingerprint: bytes
) -> Replay | Reused | Fresh:
    """Decide whether a command is new, a repeat to adopt, or a reuse to refuse."""
    by_request = tx.one(_SELECT + " WHERE request_id = ?", (request_id,))
    if by_request is not None:
        if bytes(by_request["request_fingerprint"]) != fingerprint:
            return Reused(
                "this request id was already used for another durable request of this state"
                " home; give every request a new id (a random one, such as a UUID)"
            )
        return Replay(_read(tx, by_request))
    by_key = tx.one(
        _SELECT + " WHERE client_id = ? AND idempotency_key = ?", (client_id, idempotency_key)
    )
    if by_key is None:
        return Fresh()
    if bytes(by_key["request_fingerprint"]) != fingerprint:
        return Reused(
            "this idempotency key was already used for another request of this client id;"
            " a new command needs a new key"
        )
    return Replay(_read(tx, by_key))


def store_command(
    tx: Transaction,
    *,
    request_id: str,
    client_id: str,
    operation: str,
    idempotency_key: str,
    fingerprint: bytes,
    outcome: CommandOutcome,
    server_epoch: int,
    run_id: str | None = None,
    accepted_revision: int | None = None,
    receipt: object | None = None,
    error: object | None = None,
) -> None:
    """Store the receipt of an executed command in the caller's transaction."""
    tx.execute(
        _INSERT,
        (
            request_id,
            client_id,
            operation,
            idempotency_key,
            fingerprint,
            run_id,
            accepted_revision,
            outcome.value,
            None if receipt is None else blobs.put_json(tx, receipt),
            None if error is None else blobs.put_json(tx, error),
            server_epoch,
            tx.now,
            tx.now,
        ),
    )


def _read(tx: Transaction, row: sqlite3.Row) -> StoredCommand:
    receipt_hash = row["receipt_hash"]
    error_hash = row["error_hash"]
    return StoredCommand(
        request_id=row["request_id"],
        client_id=row["client_id"],
        operation=row["operation"],
        idempotency_key=row["idempotency_key"],
        fingerprint=bytes(row["request_fingerprint"]),
        run_id=row["run_id"],
        accepted_revision=row["accepted_revision"],
        outcome=CommandOutcome(row["outcome"]),
        receipt=None if receipt_hash is None else blobs.read_json(tx, bytes(receipt_hash)),
        error=None if error_hash is None else blobs.read_json(tx, bytes(error_hash)),
        server_epoch=row["server_epoch"],
    )
