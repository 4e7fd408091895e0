"""DDL of headless agent execution, assembled into the one schema by :mod:`piwf.state.schema`.

- ``attempt_active_intervals``: the active time of a node attempt, one row per interval in
  which its agent was working (a headless command ran). At most one interval of an attempt is
  open (``ended_at IS NULL``); the server moves ``observed_at`` forward while it watches the
  open one, so after a crash the interval is closed at the last moment anyone saw it running
  and the downtime is never charged. ``elapsed_ms`` is ``observed_at - started_at`` while open
  and ``ended_at - started_at`` once closed (original.md §3.2).
"""

from __future__ import annotations

_ATTEMPT_ACTIVE_INTERVALS = """
CREATE TABLE attempt_active_intervals (
  attempt_id TEXT NOT NULL REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  interval_number INTEGER NOT NULL CHECK (interval_number > 0),
  started_at INTEGER NOT NULL,
  observed_at INTEGER NOT NULL,
  ended_at INTEGER,
  elapsed_ms INTEGER NOT NULL CHECK (elapsed_ms >= 0),
  PRIMARY KEY (attempt_id, interval_number),
  CHECK (observed_at >= started_at),
  CHECK (ended_at IS NULL OR ended_at >= started_at),
  CHECK (elapsed_ms = coalesce(ended_at, observed_at) - started_at)
) STRICT
"""

# At most one open interval per attempt; also how the open ones are found.
_ATTEMPT_ACTIVE_INTERVALS_OPEN_INDEX = """
CREATE UNIQUE INDEX attempt_active_intervals_open_idx ON attempt_active_intervals(attempt_id)
  WHERE ended_at IS NULL
"""

#: The agent statements in execution order (after the runner and request tables).
AGENT_STATEMENTS: tuple[str, ...] = (
    _ATTEMPT_ACTIVE_INTERVALS,
    _ATTEMPT_ACTIVE_INTERVALS_OPEN_INDEX,
)
