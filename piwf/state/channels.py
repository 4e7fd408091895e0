"""The channel store: ``channels``, ``channel_cursors`` and ``channel_messages``.

A channel is one configured profile of one adapter type (``telegram:ops``); its aggregate in
``resources`` carries the revision every accepted adapter change bumps. The store owns the rows;
:mod:`piwf.state.channel_delivery` composes them with effects and decisions into transitions.
Helpers receive the caller's transaction and never commit.
"""

from __future__ import annotations

import secrets
import sqlite3
from dataclasses import dataclass

from piwf.state.database import Transaction
from piwf.state.enums import (
    ChannelAdapterType,
    ChannelMessagePurpose,
    ChannelMessageStatus,
    ResourceType,
)
from piwf.state.records import ensure_resource, read_revision

_SELECT_CHANNEL = """
SELECT c.channel_id, c.resource_id, c.adapter_type, c.profile_key, c.adapter_epoch,
       c.attempt_generation, r.revision
FROM channels c JOIN resources r ON r.resource_id = c.resource_id
"""

_INSERT_CHANNEL = """
INSERT INTO channels (channel_id, resource_id, adapter_type, profile_key, adapter_epoch,
                      attempt_generation, created_at, updated_at)
VALUES (?, ?, ?, ?, 0, 0, ?, ?)
ON CONFLICT (channel_id) DO NOTHING
"""

_BUMP_EPOCH = """
UPDATE channels SET adapter_epoch = adapter_epoch + 1, updated_at = ?
WHERE channel_id = ? AND adapter_epoch = ?
"""

_NEXT_GENERATION = """
UPDATE channels SET attempt_generation = attempt_generation + 1, updated_at = ?
WHERE channel_id = ?
"""

_SELECT_CURSOR = """
SELECT cursor_value FROM channel_cursors WHERE channel_id = ? AND cursor_key = ?
"""

_UPSERT_CURSOR = """
INSERT INTO channel_cursors (channel_id, cursor_key, cursor_value, updated_at)
VALUES (?, ?, ?, ?)
ON CONFLICT (channel_id, cursor_key) DO UPDATE SET cursor_value = excluded.cursor_value,
  updated_at = excluded.updated_at
"""

_SELECT_MESSAGE = """
SELECT message_id, channel_id, decision_id, purpose, token, effect_id, status, created_at,
       updated_at
FROM channel_messages
"""

_INSERT_MESSAGE = """
INSERT INTO channel_messages (message_id, channel_id, decision_id, purpose, token, effect_id,
                              status, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?)
"""

_SET_MESSAGE_STATUS = """
UPDATE channel_messages SET status = ?, updated_at = ? WHERE message_id = ?
"""

# Only a delivery the API refused (known not posted) takes a new send.
_RESEND_MESSAGE = """
UPDATE channel_messages SET effect_id = ?, status = 'pending', updated_at = ?
WHERE message_id = ? AND purpose = 'delivery' AND status = 'failed'
"""

# Protected decisions (kind human_decision) still open for an answer and not yet presented on
# the channel: what the channel has to deliver next, oldest first. The status term the open
# requests' partial index is made with lets the read walk the open requests only, not every
# request ever made (a dispatch runs on every run change).
_UNDELIVERED = """
SELECT d.decision_id FROM human_decisions d
JOIN interactive_requests i ON i.request_id = d.decision_id
WHERE d.kind = 'human_decision' AND i.status = 'pending'
  AND i.status IN ('pending', 'answered')
  AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = d.decision_id)
  AND NOT EXISTS (SELECT 1 FROM channel_messages m
                  WHERE m.decision_id = d.decision_id AND m.channel_id = :channel
                    AND m.purpose = 'delivery')
ORDER BY d.created_at, d.decision_id
LIMIT :limit
"""

# Deliveries that reached the chat and whose decision has a winner now (settled on the channel
# or anywhere else), with no settlement message yet: each needs its message edited.
_UNEDITED = """
SELECT m.message_id FROM channel_messages m
JOIN human_decision_resolutions r ON r.decision_id = m.decision_id
WHERE m.channel_id = :channel AND m.purpose = 'delivery' AND m.status = 'confirmed'
  AND NOT EXISTS (SELECT 1 FROM channel_messages s
                  WHERE s.decision_id = m.decision_id AND s.channel_id = m.channel_id
                    AND s.purpose = 'settlement')
ORDER BY m.created_at, m.message_id
LIMIT :limit
"""


# Deliveries the API refused whose decision is still open: a decision the chat never showed
# (a reload sends it again, a bounded number of times; piwf answer answers it). Driven from the open
# requests (CROSS JOIN keeps that order), not from the channel's every message.
_FAILED_OPEN = """
SELECT m.message_id, m.channel_id, m.decision_id, m.purpose, m.token, m.effect_id, m.status,
       m.created_at, m.updated_at
FROM interactive_requests i
CROSS JOIN channel_messages m ON m.decision_id = i.request_id AND m.channel_id = :channel
  AND m.purpose = 'delivery'
WHERE i.status = 'pending' AND i.status IN ('pending', 'answered') AND m.status = 'failed'
  AND NOT EXISTS (SELECT 1 FROM human_decision_resolutions r WHERE r.decision_id = m.decision_id)
ORDER BY m.created_at, m.message_id
LIMIT :limit
"""


@dataclass(frozen=True)
class ChannelRow:
    """One channel with its aggregate revision."""

    channel_id: str
    resource_id: str
    adapter_type: ChannelAdapterType
    profile_key: str
    adapter_epoch: int
    attempt_generation: int
    revision: int


@dataclass(frozen=True)
class ChannelMessage:
    """One presentation of a decision on a channel (its delivery or its settlement)."""

    message_id: str
    channel_id: str
    decision_id: str | None
    purpose: ChannelMessagePurpose
    token: str | None
    effect_id: str
    status: ChannelMessageStatus
    created_at: int
    updated_at: int


def channel_id_for(adapter_type: ChannelAdapterType, profile_key: str) -> str:
    """The stable id of a profile's channel (``telegram:ops``)."""
    return f"{adapter_type.value}:{profile_key}"


def ensure_channel(
    tx: Transaction, adapter_type: ChannelAdapterType, profile_key: str
) -> ChannelRow:
    """Return the channel of the profile, created (revision 0, epoch 0) when missing."""
    channel_id = channel_id_for(adapter_type, profile_key)
    resource_id = ensure_resource(tx, ResourceType.CHANNEL, channel_id)
    tx.execute(
        _INSERT_CHANNEL,
        (channel_id, resource_id, adapter_type.value, profile_key, tx.now, tx.now),
    )
    found = get_channel(tx, channel_id)
    assert found is not None
    return found


def get_channel(tx: Transaction, channel_id: str) -> ChannelRow | None:
    """Return the channel, or None."""
    row = tx.one(_SELECT_CHANNEL + " WHERE c.channel_id = ?", (channel_id,))
    return None if row is None else _channel(row)


def list_channels(tx: Transaction) -> list[ChannelRow]:
    """Every channel ever configured, by id."""
    return [_channel(row) for row in tx.all(_SELECT_CHANNEL + " ORDER BY c.channel_id")]


def advance_epoch(tx: Transaction, channel: ChannelRow) -> int:
    """Give the channel's next adapter epoch ``channel.adapter_epoch + 1`` (compare-and-set on
    the epoch read); raises ``LookupError`` when another launch took it first."""
    cursor = tx.execute(_BUMP_EPOCH, (tx.now, channel.channel_id, channel.adapter_epoch))
    if cursor.rowcount != 1:
        raise LookupError(f"channel {channel.channel_id} changed its epoch meanwhile")
    return channel.adapter_epoch + 1


def next_attempt_generation(tx: Transaction, channel_id: str) -> int:
    """Hand out the channel's next attempt generation (one per external attempt, never reused,
    so no generation ever starts an effect twice)."""
    tx.execute(_NEXT_GENERATION, (tx.now, channel_id))
    return int(
        tx.scalar("SELECT attempt_generation FROM channels WHERE channel_id = ?", (channel_id,))
    )


def current_revision(tx: Transaction, channel: ChannelRow) -> int:
    """The channel aggregate's revision now."""
    revision = read_revision(tx, channel.resource_id)
    assert revision is not None
    return revision


def read_cursor(tx: Transaction, channel_id: str, cursor_key: str) -> str | None:
    """The stored position ``cursor_key`` of the channel, or None before the first."""
    value = tx.scalar(_SELECT_CURSOR, (channel_id, cursor_key))
    return None if value is None else str(value)


def write_cursor(tx: Transaction, channel_id: str, cursor_key: str, value: str) -> None:
    """Store the channel's position ``cursor_key`` (inside the change that consumed it)."""
    tx.execute(_UPSERT_CURSOR, (channel_id, cursor_key, value, tx.now))


def new_token() -> str:
    """A fresh short token for a delivery's buttons (12 URL-safe characters): what a button
    carries instead of any payload, so its callback data stays far below Telegram's 64 bytes."""
    return secrets.token_urlsafe(9)


def insert_message(
    tx: Transaction,
    *,
    channel_id: str,
    decision_id: str,
    purpose: ChannelMessagePurpose,
    effect_id: str,
    token: str | None,
) -> ChannelMessage:
    """Record a new ``pending`` presentation (a delivery with its :func:`new_token`)."""
    message_id = f"chmsg-{secrets.token_hex(10)}"
    tx.execute(
        _INSERT_MESSAGE,
        (message_id, channel_id, decision_id, purpose.value, token, effect_id, tx.now, tx.now),
    )
    found = get_message(tx, message_id)
    assert found is not None
    return found


def set_message_status(tx: Transaction, message_id: str, status: ChannelMessageStatus) -> None:
    """Move a message to ``status`` (the caller changed its effect in the same transaction)."""
    tx.execute(_SET_MESSAGE_STATUS, (status.value, tx.now, message_id))


def resend_message(tx: Transaction, message_id: str, effect_id: str) -> bool:
    """Point a ``failed`` delivery at its new send ``effect_id`` and make it ``pending`` again;
    False (nothing written) when it is not a failed delivery."""
    cursor = tx.execute(_RESEND_MESSAGE, (effect_id, tx.now, message_id))
    return cursor.rowcount == 1


def get_message(tx: Transaction, message_id: str) -> ChannelMessage | None:
    """Return the message, or None."""
    row = tx.one(_SELECT_MESSAGE + " WHERE message_id = ?", (message_id,))
    return None if row is None else _message(row)


def message_by_token(tx: Transaction, channel_id: str, token: str) -> ChannelMessage | None:
    """Return the channel's delivery whose buttons carry ``token``, or None."""
    row = tx.one(_SELECT_MESSAGE + " WHERE channel_id = ? AND token = ?", (channel_id, token))
    return None if row is None else _message(row)


def message_of_effect(tx: Transaction, effect_id: str) -> ChannelMessage | None:
    """Return the message whose external work is ``effect_id``, or None."""
    row = tx.one(_SELECT_MESSAGE + " WHERE effect_id = ?", (effect_id,))
    return None if row is None else _message(row)


def find_message(
    tx: Transaction, channel_id: str, decision_id: str, purpose: ChannelMessagePurpose
) -> ChannelMessage | None:
    """Return the channel's delivery or settlement of ``decision_id``, or None."""
    row = tx.one(
        _SELECT_MESSAGE + " WHERE channel_id = ? AND decision_id = ? AND purpose = ?",
        (channel_id, decision_id, purpose.value),
    )
    return None if row is None else _message(row)


def list_messages(tx: Transaction, channel_id: str) -> list[ChannelMessage]:
    """Every message of the channel, oldest first."""
    rows = tx.all(
        _SELECT_MESSAGE + " WHERE channel_id = ? ORDER BY created_at, message_id", (channel_id,)
    )
    return [_message(row) for row in rows]


def undelivered_decisions(tx: Transaction, channel_id: str, limit: int = 16) -> list[str]:
    """Open protected decisions not yet presented on the channel, oldest first."""
    rows = tx.all(_UNDELIVERED, {"channel": channel_id, "limit": limit})
    return [str(row[0]) for row in rows]


def failed_open_deliveries(
    tx: Transaction, channel_id: str, limit: int = 16
) -> list[ChannelMessage]:
    """Deliveries the API refused whose decision is still open, oldest first: the chat never
    showed them (see :func:`piwf.state.channel_delivery.resend_refused`)."""
    rows = tx.all(_FAILED_OPEN, {"channel": channel_id, "limit": limit})
    return [_message(row) for row in rows]


def unedited_deliveries(tx: Transaction, channel_id: str, limit: int = 16) -> list[str]:
    """Ids of confirmed deliveries whose decision is settled and not shown settled yet."""
    rows = tx.all(_UNEDITED, {"channel": channel_id, "limit": limit})
    return [str(row[0]) for row in rows]


def _channel(row: sqlite3.Row) -> ChannelRow:
    return ChannelRow(
        channel_id=row["channel_id"],
        resource_id=row["resource_id"],
        adapter_type=ChannelAdapterType(row["adapter_type"]),
        profile_key=row["profile_key"],
        adapter_epoch=row["adapter_epoch"],
        attempt_generation=row["attempt_generation"],
        revision=row["revision"],
    )


def _message(row: sqlite3.Row) -> ChannelMessage:
    return ChannelMessage(
        message_id=row["message_id"],
        channel_id=row["channel_id"],
        decision_id=row["decision_id"],
        purpose=ChannelMessagePurpose(row["purpose"]),
        token=row["token"],
        effect_id=row["effect_id"],
        status=ChannelMessageStatus(row["status"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
