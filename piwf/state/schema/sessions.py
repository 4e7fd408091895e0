"""DDL of the conversation side of interactive runs, assembled by :mod:`piwf.state.schema`.

- ``workflow_messages``: everything an origin session's conversation must show, in one table
  (seed 001, "Durable protocol records"): the target session, the kind (``step`` with its
  reason ``initial``/``reminder``/``resumed``, ``decision``, ``notification``, ``terminal``,
  ``followUp``), the source record it presents (a request id, a notification id, the run id
  for the terminal message), the content (a JSON blob), the session order, the state
  (``pending``, ``sent``, ``cancelled``) and the conversation entry that proved it sent. No
  sender, send lease or duplicate flag: the coordinator that holds the session's epoch sends,
  and branch evidence (an entry id) is the only proof of a send. At most one pending step
  message per source (the partial unique index).
- ``workflow_turns``: the session's model turns accepted as workflow work, one open per
  session; how each ended (``completed``, ``aborted``, ``error``, ``lost``).
"""

from __future__ import annotations

_WORKFLOW_MESSAGES = """
CREATE TABLE workflow_messages (
  message_id TEXT PRIMARY KEY CHECK (length(message_id) BETWEEN 1 AND 256),
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  session_id TEXT NOT NULL CHECK (length(session_id) BETWEEN 1 AND 128),
  kind TEXT NOT NULL CHECK (kind IN ('step', 'decision', 'notification', 'terminal',
    'followUp')),
  reason TEXT CHECK (reason IN ('initial', 'reminder', 'resumed')),
  source_id TEXT NOT NULL CHECK (length(source_id) BETWEEN 1 AND 256),
  content_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  order_number INTEGER NOT NULL CHECK (order_number > 0),
  status TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'cancelled')),
  entry_id TEXT CHECK (entry_id IS NULL OR length(entry_id) BETWEEN 1 AND 256),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (session_id, order_number),
  CHECK ((status = 'sent') = (entry_id IS NOT NULL)),
  CHECK ((kind = 'step') = (reason IS NOT NULL))
) STRICT
"""

_WORKFLOW_MESSAGES_SESSION_INDEX = """
CREATE INDEX workflow_messages_session_idx
  ON workflow_messages(session_id, status, order_number)
"""

_WORKFLOW_MESSAGES_RUN_INDEX = """
CREATE INDEX workflow_messages_run_idx ON workflow_messages(run_id, order_number)
"""

_WORKFLOW_MESSAGES_SOURCE_INDEX = """
CREATE INDEX workflow_messages_source_idx ON workflow_messages(kind, source_id, order_number)
"""

# At most one pending step message presents one request.
_WORKFLOW_MESSAGES_PENDING_STEP_INDEX = """
CREATE UNIQUE INDEX workflow_messages_pending_step_idx ON workflow_messages(source_id)
  WHERE kind = 'step' AND status = 'pending'
"""

# One model turn of the session that the server accepted as workflow work on a sent message:
# exact start and end; ``counted`` marks an end that counted toward the step's unproductive
# turns (the reminder rule); ``ended_by_run`` an end (``lost``) the run's terminal change made,
# which the session's late matching end report adopts.
_WORKFLOW_TURNS = """
CREATE TABLE workflow_turns (
  turn_id TEXT PRIMARY KEY CHECK (length(turn_id) BETWEEN 1 AND 256),
  message_id TEXT NOT NULL REFERENCES workflow_messages(message_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  session_id TEXT NOT NULL CHECK (length(session_id) BETWEEN 1 AND 128),
  state TEXT NOT NULL CHECK (state IN ('started', 'ended')),
  stop_reason TEXT CHECK (stop_reason IN ('completed', 'aborted', 'error', 'lost')),
  response_entry_id TEXT CHECK (response_entry_id IS NULL
    OR length(response_entry_id) BETWEEN 1 AND 256),
  counted INTEGER NOT NULL DEFAULT 0 CHECK (counted IN (0, 1)),
  ended_by_run INTEGER NOT NULL DEFAULT 0 CHECK (ended_by_run IN (0, 1)),
  started_at INTEGER NOT NULL,
  ended_at INTEGER,
  CHECK ((state = 'started') = (stop_reason IS NULL AND ended_at IS NULL)),
  CHECK (counted = 0 OR state = 'ended'),
  CHECK (ended_by_run = 0 OR stop_reason = 'lost')
) STRICT
"""

# One open turn per session (and so per message).
_WORKFLOW_TURNS_OPEN_SESSION_INDEX = """
CREATE UNIQUE INDEX workflow_turns_open_session_idx ON workflow_turns(session_id)
  WHERE state = 'started'
"""

_WORKFLOW_TURNS_MESSAGE_INDEX = """
CREATE INDEX workflow_turns_message_idx ON workflow_turns(message_id, started_at)
"""

#: The session statements in execution order (after every table they reference).
SESSION_STATEMENTS: tuple[str, ...] = (
    _WORKFLOW_MESSAGES,
    _WORKFLOW_MESSAGES_SESSION_INDEX,
    _WORKFLOW_MESSAGES_RUN_INDEX,
    _WORKFLOW_MESSAGES_SOURCE_INDEX,
    _WORKFLOW_MESSAGES_PENDING_STEP_INDEX,
    _WORKFLOW_TURNS,
    _WORKFLOW_TURNS_OPEN_SESSION_INDEX,
    _WORKFLOW_TURNS_MESSAGE_INDEX,
)
