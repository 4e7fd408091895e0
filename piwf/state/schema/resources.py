"""DDL of the managed-resource tables, assembled into the one schema by :mod:`piwf.state.schema`.

A managed resource is an aggregate ``managed_resource:<uid>`` in ``resources``: its revision is
the resource version (the CAS token; every write of spec, status, finalizers or deletion bumps
it with one event). The ``resources`` row and its events outlive the resource as its audit, so
a uid is never reused. Reconcile claims live in ``leases`` on that same resource row and do not
move the resource version (picking work from the queue is not a write of the object).

- ``managed_resources``: one row per live resource, unique by (manager, key).
- ``managed_resource_finalizers``: ordered finalizer names.
- ``managed_resource_queue``: at most one row per resource; present while it needs a reconcile.
  ``queue_version`` grows with every enqueue, so a ``settled`` result removes the row only if
  nothing enqueued it again while the reconcile ran.
- ``managed_resource_runners``: one row per resource-runner process (supervision and audit),
  recorded before the spawn; at most one live row per resource.
- ``managed_resource_workflows``: child runs requested by stable key with an input fingerprint.
"""

from __future__ import annotations

_MANAGED_RESOURCES = """
CREATE TABLE managed_resources (
  uid TEXT PRIMARY KEY CHECK (length(uid) BETWEEN 1 AND 64),
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id) ON DELETE CASCADE,
  manager_name TEXT NOT NULL CHECK (length(manager_name) BETWEEN 1 AND 64),
  resource_key TEXT NOT NULL CHECK (length(resource_key) BETWEEN 1 AND 256),
  project_path TEXT,
  source_path TEXT NOT NULL,
  source_digest TEXT NOT NULL CHECK (length(source_digest) = 64),
  timeout_ms INTEGER NOT NULL CHECK (timeout_ms > 0),
  generation INTEGER NOT NULL CHECK (generation > 0),
  observed_generation INTEGER NOT NULL DEFAULT 0 CHECK (observed_generation >= 0),
  spec_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  status_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  conditions_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  deletion_requested_at INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (manager_name, resource_key),
  CHECK (observed_generation <= generation)
) STRICT
"""

_MANAGED_RESOURCE_FINALIZERS = """
CREATE TABLE managed_resource_finalizers (
  uid TEXT NOT NULL REFERENCES managed_resources(uid) ON DELETE CASCADE,
  finalizer TEXT NOT NULL CHECK (length(finalizer) BETWEEN 1 AND 128),
  position INTEGER NOT NULL CHECK (position >= 0),
  PRIMARY KEY (uid, finalizer),
  UNIQUE (uid, position)
) STRICT
"""

_MANAGED_RESOURCE_QUEUE = """
CREATE TABLE managed_resource_queue (
  uid TEXT PRIMARY KEY REFERENCES managed_resources(uid) ON DELETE CASCADE,
  available_at INTEGER NOT NULL,
  reason TEXT NOT NULL CHECK (reason IN (
    'applied', 'requested', 'requeue', 'requeueAfter', 'conflict', 'error', 'childFinished',
    'deleting', 'interrupted')),
  queue_version INTEGER NOT NULL DEFAULT 1 CHECK (queue_version > 0),
  consecutive_errors INTEGER NOT NULL DEFAULT 0 CHECK (consecutive_errors >= 0),
  last_error_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT
"""

_MANAGED_RESOURCE_QUEUE_READY_INDEX = """
CREATE INDEX managed_resource_queue_ready_idx
  ON managed_resource_queue(available_at, created_at)
"""

_MANAGED_RESOURCE_RUNNERS = """
CREATE TABLE managed_resource_runners (
  reconcile_id TEXT PRIMARY KEY CHECK (length(reconcile_id) BETWEEN 1 AND 256),
  resource_id TEXT NOT NULL REFERENCES resources(resource_id) ON DELETE CASCADE,
  uid TEXT NOT NULL,
  claim_generation INTEGER NOT NULL CHECK (claim_generation > 0),
  server_epoch INTEGER NOT NULL CHECK (server_epoch > 0),
  resource_version INTEGER NOT NULL CHECK (resource_version > 0),
  resource_generation INTEGER NOT NULL CHECK (resource_generation > 0),
  queue_version INTEGER NOT NULL CHECK (queue_version > 0),
  deadline_at INTEGER NOT NULL,
  pid INTEGER CHECK (pid IS NULL OR pid > 0),
  process_start_identity TEXT,
  source_digest TEXT CHECK (source_digest IS NULL OR length(source_digest) = 64),
  status TEXT NOT NULL CHECK (status IN (
    'starting', 'running', 'exited', 'timedOut', 'crashed', 'claimLost', 'orphaned')),
  result TEXT CHECK (result IN (
    'settled', 'requeue', 'requeueAfter', 'deleted', 'conflict', 'failed')),
  error_hash BLOB REFERENCES blobs(blob_hash),
  started_at INTEGER NOT NULL,
  finished_at INTEGER,
  exit_code INTEGER,
  signal TEXT,
  CHECK ((pid IS NULL) = (process_start_identity IS NULL)),
  CHECK ((status IN ('starting', 'running')) = (finished_at IS NULL))
) STRICT
"""

# At most one live resource runner per resource.
_MANAGED_RESOURCE_RUNNERS_ACTIVE_INDEX = """
CREATE UNIQUE INDEX managed_resource_runners_active_idx ON managed_resource_runners(resource_id)
  WHERE status IN ('starting', 'running')
"""

_MANAGED_RESOURCE_RUNNERS_RESOURCE_INDEX = """
CREATE INDEX managed_resource_runners_resource_idx
  ON managed_resource_runners(resource_id, started_at)
"""

# ``notified_at`` is set once the child run was seen terminal and the parent enqueued for it.
_MANAGED_RESOURCE_WORKFLOWS = """
CREATE TABLE managed_resource_workflows (
  request_id TEXT PRIMARY KEY,
  uid TEXT NOT NULL REFERENCES managed_resources(uid) ON DELETE CASCADE,
  request_key TEXT NOT NULL CHECK (length(request_key) BETWEEN 1 AND 256),
  workflow_ref TEXT NOT NULL,
  input_fingerprint BLOB NOT NULL CHECK (length(input_fingerprint) = 32),
  run_id TEXT NOT NULL REFERENCES runs(run_id),
  notified_at INTEGER,
  created_at INTEGER NOT NULL,
  UNIQUE (uid, request_key)
) STRICT
"""

_MANAGED_RESOURCE_WORKFLOWS_OPEN_INDEX = """
CREATE INDEX managed_resource_workflows_open_idx ON managed_resource_workflows(run_id)
  WHERE notified_at IS NULL
"""

#: The managed-resource statements in execution order (after ``runs``).
RESOURCE_STATEMENTS: tuple[str, ...] = (
    _MANAGED_RESOURCES,
    _MANAGED_RESOURCE_FINALIZERS,
    _MANAGED_RESOURCE_QUEUE,
    _MANAGED_RESOURCE_QUEUE_READY_INDEX,
    _MANAGED_RESOURCE_RUNNERS,
    _MANAGED_RESOURCE_RUNNERS_ACTIVE_INDEX,
    _MANAGED_RESOURCE_RUNNERS_RESOURCE_INDEX,
    _MANAGED_RESOURCE_WORKFLOWS,
    _MANAGED_RESOURCE_WORKFLOWS_OPEN_INDEX,
)
