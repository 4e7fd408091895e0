"""DDL of session capture, assembled by :mod:`piwf.state.schema`.

What an origin session reports of the model turns it runs for a run (seed 000, "Session
capture"; seed 001: capture starts only after an ``active`` turn receipt), stored per turn:

- ``session_segments``: one per accepted workflow turn: the run, the node attempt the turn
  worked on (NULL for a terminal or follow-up message's turn), its state (``recording`` until
  the turn's end is reported, then ``complete``, or ``failed`` when the end proved an
  interruption), and its counts, including what the bounds dropped.
- ``session_entries``: the conversation entries of a segment in report order (the session's
  own entry ids), each with its content as a JSON blob; numbered per segment and per run.
- ``attempt_entries``: for a node attempt, which captured entries were its ``prompt`` (the
  step message's entry), its ``response`` (the turn's reply entry), and its ``first`` and
  ``last`` captured entries.
- ``session_events``: the segment's events (tool calls and results, the turn's start and end)
  in report order, each with its payload as a JSON blob; numbered per segment and per run.
"""

from __future__ import annotations

_SESSION_SEGMENTS = """
CREATE TABLE session_segments (
  segment_id TEXT PRIMARY KEY CHECK (length(segment_id) BETWEEN 1 AND 256),
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  attempt_id TEXT REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  turn_id TEXT NOT NULL UNIQUE REFERENCES workflow_turns(turn_id) ON DELETE CASCADE,
  session_id TEXT NOT NULL CHECK (length(session_id) BETWEEN 1 AND 128),
  status TEXT NOT NULL CHECK (status IN ('recording', 'complete', 'failed')),
  entry_count INTEGER NOT NULL DEFAULT 0 CHECK (entry_count >= 0),
  event_count INTEGER NOT NULL DEFAULT 0 CHECK (event_count >= 0),
  stored_bytes INTEGER NOT NULL DEFAULT 0 CHECK (stored_bytes >= 0),
  dropped_entries INTEGER NOT NULL DEFAULT 0 CHECK (dropped_entries >= 0),
  dropped_events INTEGER NOT NULL DEFAULT 0 CHECK (dropped_events >= 0),
  failure TEXT CHECK (failure IS NULL OR length(failure) BETWEEN 1 AND 1000),
  created_at INTEGER NOT NULL,
  finished_at INTEGER,
  CHECK ((status = 'recording') = (finished_at IS NULL)),
  CHECK ((status = 'failed') = (failure IS NOT NULL))
) STRICT
"""

_SESSION_SEGMENTS_RUN_INDEX = """
CREATE INDEX session_segments_run_idx ON session_segments(run_id, created_at)
"""

_SESSION_SEGMENTS_ATTEMPT_INDEX = """
CREATE INDEX session_segments_attempt_idx ON session_segments(attempt_id)
  WHERE attempt_id IS NOT NULL
"""

_SESSION_ENTRIES = """
CREATE TABLE session_entries (
  segment_id TEXT NOT NULL REFERENCES session_segments(segment_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  entry_seq INTEGER NOT NULL CHECK (entry_seq > 0),
  run_seq INTEGER NOT NULL CHECK (run_seq > 0),
  entry_id TEXT NOT NULL CHECK (length(entry_id) BETWEEN 1 AND 256),
  entry_kind TEXT NOT NULL CHECK (length(entry_kind) BETWEEN 1 AND 64),
  content_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  content_bytes INTEGER NOT NULL CHECK (content_bytes >= 0),
  recorded_at INTEGER NOT NULL,
  PRIMARY KEY (segment_id, entry_seq),
  UNIQUE (segment_id, entry_id),
  UNIQUE (run_id, run_seq)
) STRICT
"""

_ATTEMPT_ENTRIES = """
CREATE TABLE attempt_entries (
  attempt_id TEXT NOT NULL REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  role TEXT NOT NULL CHECK (role IN ('prompt', 'response', 'first', 'last')),
  segment_id TEXT NOT NULL,
  entry_id TEXT NOT NULL,
  PRIMARY KEY (attempt_id, role),
  FOREIGN KEY (segment_id, entry_id) REFERENCES session_entries(segment_id, entry_id)
    ON DELETE CASCADE
) STRICT
"""

_ATTEMPT_ENTRIES_ENTRY_INDEX = """
CREATE INDEX attempt_entries_entry_idx ON attempt_entries(segment_id, entry_id)
"""

_SESSION_EVENTS = """
CREATE TABLE session_events (
  segment_id TEXT NOT NULL REFERENCES session_segments(segment_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  event_seq INTEGER NOT NULL CHECK (event_seq > 0),
  run_seq INTEGER NOT NULL CHECK (run_seq > 0),
  event_type TEXT NOT NULL CHECK (length(event_type) BETWEEN 1 AND 64),
  tool_call_id TEXT CHECK (tool_call_id IS NULL OR length(tool_call_id) BETWEEN 1 AND 256),
  payload_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  payload_bytes INTEGER NOT NULL CHECK (payload_bytes >= 0),
  recorded_at INTEGER NOT NULL,
  PRIMARY KEY (segment_id, event_seq),
  UNIQUE (run_id, run_seq)
) STRICT
"""

#: The capture statements in execution order (after the turns they reference).
CAPTURE_STATEMENTS: tuple[str, ...] = (
    _SESSION_SEGMENTS,
    _SESSION_SEGMENTS_RUN_INDEX,
    _SESSION_SEGMENTS_ATTEMPT_INDEX,
    _SESSION_ENTRIES,
    _ATTEMPT_ENTRIES,
    _ATTEMPT_ENTRIES_ENTRY_INDEX,
    _SESSION_EVENTS,
)
