"""DDL of live settings, assembled into the one schema by :mod:`piwf.state.schema`.

- ``workflow_settings``: one scope per (run, mount path, entry of that mount): its own
  aggregate (``resources`` type ``settings``, whose events audit every change), its initial
  and current value and the number of the newest change (0: the initial value).
- ``workflow_setting_changes``: every accepted change: the RFC 6902 patch, the values before
  and after, who made it and the request id that makes a repeated change answer the same.
- ``attempt_settings``: the copy each node attempt started with (change number and value).

Only :mod:`piwf.state.execution.settings` writes them.
"""

from __future__ import annotations

_WORKFLOW_SETTINGS = """
CREATE TABLE workflow_settings (
  scope_id TEXT PRIMARY KEY,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  mount_path TEXT NOT NULL,
  invocation INTEGER NOT NULL CHECK (invocation > 0),
  change_number INTEGER NOT NULL CHECK (change_number >= 0),
  initial_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  current_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (run_id, mount_path, invocation)
) STRICT
"""

_WORKFLOW_SETTING_CHANGES = """
CREATE TABLE workflow_setting_changes (
  change_id TEXT PRIMARY KEY,
  scope_id TEXT NOT NULL REFERENCES workflow_settings(scope_id) ON DELETE CASCADE,
  request_id TEXT NOT NULL CHECK (length(request_id) BETWEEN 1 AND 256),
  change_number INTEGER NOT NULL CHECK (change_number > 0),
  actor_type TEXT NOT NULL CHECK (actor_type IN ('human', 'session')),
  actor_id TEXT,
  patch_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  before_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  after_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  accepted_at INTEGER NOT NULL,
  UNIQUE (scope_id, request_id),
  UNIQUE (scope_id, change_number)
) STRICT
"""

_ATTEMPT_SETTINGS = """
CREATE TABLE attempt_settings (
  attempt_id TEXT PRIMARY KEY REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  scope_id TEXT NOT NULL REFERENCES workflow_settings(scope_id) ON DELETE CASCADE,
  change_number INTEGER NOT NULL CHECK (change_number >= 0),
  settings_hash BLOB NOT NULL REFERENCES blobs(blob_hash)
) STRICT
"""

_ATTEMPT_SETTINGS_SCOPE_INDEX = """
CREATE INDEX attempt_settings_scope_idx ON attempt_settings(scope_id)
"""

#: The settings statements in execution order (after every table they reference).
SETTINGS_STATEMENTS: tuple[str, ...] = (
    _WORKFLOW_SETTINGS,
    _WORKFLOW_SETTING_CHANGES,
    _ATTEMPT_SETTINGS,
    _ATTEMPT_SETTINGS_SCOPE_INDEX,
)
