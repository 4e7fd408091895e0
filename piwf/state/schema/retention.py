"""DDL of state retention, assembled into the one schema by :mod:`piwf.state.schema`.

``retention_state`` is one row, created with the schema: when the last automatic sweep started
and completed, what it deleted, and its last failure (a bounded text naming the error class and
ids, never a payload). A restarted server reads ``last_completed_at`` so that it does not sweep
twice within one interval. ``runs_root_idx`` lets the selector find a tree by its root.
"""

from __future__ import annotations

_RUNS_ROOT_INDEX = """
CREATE INDEX runs_root_idx ON runs(root_run_id)
"""

_RETENTION_STATE = """
CREATE TABLE retention_state (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  last_started_at INTEGER,
  last_completed_at INTEGER,
  last_trees_deleted INTEGER NOT NULL DEFAULT 0 CHECK (last_trees_deleted >= 0),
  last_runs_deleted INTEGER NOT NULL DEFAULT 0 CHECK (last_runs_deleted >= 0),
  last_trees_protected INTEGER NOT NULL DEFAULT 0 CHECK (last_trees_protected >= 0),
  total_trees_deleted INTEGER NOT NULL DEFAULT 0 CHECK (total_trees_deleted >= 0),
  last_failure_at INTEGER,
  last_failure TEXT CHECK (last_failure IS NULL OR length(last_failure) BETWEEN 1 AND 512),
  CHECK ((last_failure_at IS NULL) = (last_failure IS NULL))
) STRICT
"""

_RETENTION_STATE_ROW = """
INSERT INTO retention_state (id) VALUES (1)
"""

#: The retention statements in execution order (after ``runs``).
RETENTION_STATEMENTS: tuple[str, ...] = (
    _RUNS_ROOT_INDEX,
    _RETENTION_STATE,
    _RETENTION_STATE_ROW,
)
