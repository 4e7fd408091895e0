"""DDL of headless agent execution, assembled into the one schema by :mod:`piwf.state.schema`.

- ``attempt_active_intervals``: the active time of a node attempt, one row per interval in
  which its agent was working (a headless command ran). At most one interval of an attempt is
  open (``ended_at IS NULL``); the server moves ``observed_at`` forward while it watches the
  open one, so after a crash the interval is closed at the last moment anyone saw it running
  and the downtime is never charged. ``elapsed_ms`` is ``observed_at - started_at`` while open
  and ``ended_at - started_at`` once closed (original.md §3.2).
- ``agent_processes``: the process registry. One row per agent command process a runner
  registered (its pid, exact start identity and process group) until it is unregistered by its
  runner or reaped by the server (``ended_by``).
- ``agent_turns``: per agent request, how many times its command was started and how many of
  those turns ended without an accepted submission (the unproductive-turn rule).
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

_AGENT_PROCESSES = """
CREATE TABLE agent_processes (
  start_identity TEXT PRIMARY KEY CHECK (length(start_identity) BETWEEN 1 AND 256),
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  runner_epoch TEXT NOT NULL REFERENCES run_runners(runner_epoch) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  request_id TEXT NOT NULL REFERENCES interactive_requests(request_id) ON DELETE CASCADE,
  turn_number INTEGER NOT NULL CHECK (turn_number > 0),
  pid INTEGER NOT NULL CHECK (pid > 0),
  pgid INTEGER NOT NULL CHECK (pgid > 0),
  registered_at INTEGER NOT NULL,
  ended_at INTEGER,
  ended_by TEXT CHECK (ended_by IN ('unregistered', 'reaped')),
  exit_code INTEGER,
  CHECK ((ended_at IS NULL) = (ended_by IS NULL)),
  CHECK (exit_code IS NULL OR ended_by = 'unregistered')
) STRICT
"""

# A run has at most one live agent process (one attempt waits on one request at a time).
_AGENT_PROCESSES_LIVE_RUN_INDEX = """
CREATE UNIQUE INDEX agent_processes_live_run_idx ON agent_processes(run_id)
  WHERE ended_at IS NULL
"""

_AGENT_PROCESSES_RUNNER_INDEX = """
CREATE INDEX agent_processes_runner_idx ON agent_processes(runner_epoch)
"""

_AGENT_TURNS = """
CREATE TABLE agent_turns (
  request_id TEXT PRIMARY KEY REFERENCES interactive_requests(request_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  turns_started INTEGER NOT NULL CHECK (turns_started > 0),
  unproductive_turns INTEGER NOT NULL DEFAULT 0 CHECK (unproductive_turns >= 0),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  CHECK (unproductive_turns <= turns_started)
) STRICT
"""

_AGENT_TURNS_RUN_INDEX = """
CREATE INDEX agent_turns_run_idx ON agent_turns(run_id)
"""

#: The agent statements in execution order (after the runner and request tables).
AGENT_STATEMENTS: tuple[str, ...] = (
    _ATTEMPT_ACTIVE_INTERVALS,
    _ATTEMPT_ACTIVE_INTERVALS_OPEN_INDEX,
    _AGENT_PROCESSES,
    _AGENT_PROCESSES_LIVE_RUN_INDEX,
    _AGENT_PROCESSES_RUNNER_INDEX,
    _AGENT_TURNS,
    _AGENT_TURNS_RUN_INDEX,
)
