"""DDL of the channel tables (decision delivery through external channels such as Telegram).

- ``channels``: one row per configured profile ever seen (adapter type and profile name), with
  the epoch of its current adapter child (+1 at every launch: messages of an older adapter are
  refused) and the counter that hands each external attempt its own generation.
- ``channel_cursors``: the adapter's position in the external update stream (the Telegram
  ``getUpdates`` offset), advanced in the transaction that applies the update, so an update is
  never applied twice across restarts.
- ``channel_messages``: which decision was presented where and how its settlement was shown.
  It is the decision feature's record; the external work itself (attempts, the Telegram message
  reference) lives in ``effects``/``effect_attempts`` and is not repeated here.

Credentials never enter these tables.
"""

from __future__ import annotations

_CHANNELS = """
CREATE TABLE channels (
  channel_id TEXT PRIMARY KEY,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id),
  adapter_type TEXT NOT NULL CHECK (adapter_type IN ('telegram')),
  profile_key TEXT NOT NULL CHECK (length(profile_key) BETWEEN 1 AND 64),
  adapter_epoch INTEGER NOT NULL DEFAULT 0 CHECK (adapter_epoch >= 0),
  attempt_generation INTEGER NOT NULL DEFAULT 0 CHECK (attempt_generation >= 0),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (adapter_type, profile_key)
) STRICT
"""

_CHANNEL_CURSORS = """
CREATE TABLE channel_cursors (
  channel_id TEXT NOT NULL REFERENCES channels(channel_id) ON DELETE CASCADE,
  cursor_key TEXT NOT NULL CHECK (length(cursor_key) BETWEEN 1 AND 64),
  cursor_value TEXT NOT NULL CHECK (length(cursor_value) <= 256),
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (channel_id, cursor_key)
) STRICT
"""

_CHANNEL_MESSAGES = """
CREATE TABLE channel_messages (
  message_id TEXT PRIMARY KEY,
  channel_id TEXT NOT NULL REFERENCES channels(channel_id) ON DELETE CASCADE,
  decision_id TEXT REFERENCES human_decisions(decision_id) ON DELETE CASCADE,
  purpose TEXT NOT NULL CHECK (purpose IN ('delivery', 'settlement')),
  token TEXT CHECK (token IS NULL OR length(token) BETWEEN 1 AND 32),
  effect_id TEXT NOT NULL REFERENCES effects(effect_id),
  status TEXT NOT NULL CHECK (status IN ('pending', 'confirmed', 'failed', 'ambiguous')),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (channel_id, token),
  UNIQUE (effect_id),
  CHECK ((purpose = 'delivery') = (token IS NOT NULL))
) STRICT
"""

# One delivery and one settlement per decision and channel.
_CHANNEL_MESSAGES_DECISION_INDEX = """
CREATE UNIQUE INDEX channel_messages_decision_idx
  ON channel_messages(decision_id, channel_id, purpose) WHERE decision_id IS NOT NULL
"""

#: The channel statements in execution order (after the decision and effect tables).
CHANNEL_STATEMENTS: tuple[str, ...] = (
    _CHANNELS,
    _CHANNEL_CURSORS,
    _CHANNEL_MESSAGES,
    _CHANNEL_MESSAGES_DECISION_INDEX,
)
