"""What a visit publishes: progress updates (``workflow_updates``) and notifications
(``run_notifications``). The one module that writes either table.

Updates keep the latest record per (attempt, update type, key); each publish takes the attempt's
next sequence number. A notification is stored once under its stable id, so a crash retry of the
visit that sends it again finds it. Writers run inside the caller's one change and never commit.
"""

from __future__ import annotations

from dataclasses import dataclass

from piwf import canonical
from piwf.lifecycle import NotifyKind
from piwf.state.database import Transaction

_SELECT_UPDATE = """
SELECT update_id, data_hash FROM workflow_updates
WHERE attempt_id = ? AND update_type = ? AND update_key = ?
ORDER BY update_seq DESC LIMIT 1
"""

_NEXT_UPDATE_SEQ = """
SELECT coalesce(max(update_seq), 0) + 1 FROM workflow_updates WHERE attempt_id = ?
"""

_INSERT_UPDATE = """
INSERT INTO workflow_updates (update_id, attempt_id, update_seq, run_revision, update_type,
                              update_key, data_hash, recorded_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

# One record per (attempt, type, key): a newer publish replaces the data and takes the next seq.
_REPLACE_UPDATE = """
UPDATE workflow_updates SET update_seq = ?, run_revision = ?, data_hash = ?, recorded_at = ?
WHERE update_id = ?
"""

_SELECT_NOTIFICATION = """
SELECT notification_id, run_id, node_path, visit, kind, message_hash FROM run_notifications
WHERE notification_id = ?
"""

_INSERT_NOTIFICATION = """
INSERT INTO run_notifications (notification_id, run_id, attempt_id, node_path, visit, kind,
                               message_hash, run_revision, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""


@dataclass(frozen=True)
class UpdateRow:
    """The latest update of one (attempt, type, key)."""

    update_id: str
    data_hash: bytes


@dataclass(frozen=True)
class NotificationRow:
    """One stored notification."""

    notification_id: str
    run_id: str
    path: str
    visit: int
    kind: NotifyKind
    message_hash: bytes


def latest_update(tx: Transaction, attempt_id: str, update_type: str, key: str) -> UpdateRow | None:
    """Return the kept update of (attempt, type, key), or None."""
    row = tx.one(_SELECT_UPDATE, (attempt_id, update_type, key))
    return None if row is None else UpdateRow(row["update_id"], bytes(row["data_hash"]))


def publish_update(
    tx: Transaction,
    *,
    attempt_id: str,
    update_type: str,
    key: str,
    data_hash: bytes,
    run_revision: int,
    replaces: UpdateRow | None,
) -> None:
    """Keep ``data_hash`` as the latest update of (attempt, type, key), at the next sequence.

    ``replaces`` is the record :func:`latest_update` returned (its data is replaced), or None
    for the first publish of this type and key.
    """
    sequence = int(tx.scalar(_NEXT_UPDATE_SEQ, (attempt_id,)))
    if replaces is not None:
        tx.execute(_REPLACE_UPDATE, (sequence, run_revision, data_hash, tx.now, replaces.update_id))
        return
    identity = ["piwf.update.v1", attempt_id, update_type, key]
    update_id = "update-" + canonical.digest_hex(identity)[:40]
    tx.execute(
        _INSERT_UPDATE,
        (update_id, attempt_id, sequence, run_revision, update_type, key, data_hash, tx.now),
    )


def get_notification(tx: Transaction, notification_id: str) -> NotificationRow | None:
    """Return one notification, or None."""
    row = tx.one(_SELECT_NOTIFICATION, (notification_id,))
    if row is None:
        return None
    return NotificationRow(
        notification_id=row["notification_id"],
        run_id=row["run_id"],
        path=row["node_path"],
        visit=row["visit"],
        kind=NotifyKind(row["kind"]),
        message_hash=bytes(row["message_hash"]),
    )


def insert_notification(
    tx: Transaction,
    *,
    notification_id: str,
    run_id: str,
    attempt_id: str,
    path: str,
    visit: int,
    kind: NotifyKind,
    message_hash: bytes,
    run_revision: int,
) -> None:
    """Store one notification of the visit under its stable id."""
    tx.execute(
        _INSERT_NOTIFICATION,
        (
            notification_id,
            run_id,
            attempt_id,
            path,
            visit,
            kind.value,
            message_hash,
            run_revision,
            tx.now,
        ),
    )
