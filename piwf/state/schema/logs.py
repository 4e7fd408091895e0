"""DDL of attempt logs, assembled into the one schema by :mod:`piwf.state.schema`.

- ``attempt_logs``: per node attempt, the file its captured stdout/stderr went to
  (``log_file``: relative to the state home, never absolute, never ``..``), how many bytes each
  stream wrote, how many the file kept and how many past the per-attempt cap were dropped
  (``kept_bytes + dropped_bytes = stdout_bytes + stderr_bytes``). ``log_number`` orders a run's
  logs as their attempts started (1, 2, ...); rowids are not kept by ``VACUUM``, so the order
  is a column. The row is written with the attempt's ``node_started`` and its counts with its
  end (``node_finished``/``node_failed``, or the runner's exit); ``docs/EXECUTION.md``,
  "Attempt logs", says what is exact.
"""

from __future__ import annotations

_ATTEMPT_LOGS = """
CREATE TABLE attempt_logs (
  attempt_id TEXT PRIMARY KEY REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  log_number INTEGER NOT NULL CHECK (log_number > 0),
  log_file TEXT NOT NULL CHECK (length(log_file) BETWEEN 1 AND 512
    AND substr(log_file, 1, 1) <> '/' AND instr(log_file, '..') = 0),
  stdout_bytes INTEGER NOT NULL DEFAULT 0 CHECK (stdout_bytes >= 0),
  stderr_bytes INTEGER NOT NULL DEFAULT 0 CHECK (stderr_bytes >= 0),
  kept_bytes INTEGER NOT NULL DEFAULT 0 CHECK (kept_bytes >= 0),
  dropped_bytes INTEGER NOT NULL DEFAULT 0 CHECK (dropped_bytes >= 0),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (run_id, log_number),
  CHECK (kept_bytes + dropped_bytes = stdout_bytes + stderr_bytes)
) STRICT
"""

#: The attempt-log statements in execution order (after every table they reference).
LOG_STATEMENTS: tuple[str, ...] = (_ATTEMPT_LOGS,)
