"""The one DDL of the piwf state database and its digest.

Every table is ``STRICT``. Timestamps are INTEGER epoch milliseconds. ``*_hash`` columns hold
32-byte SHA-256 digests that reference :data:`blobs` rows. The DDL changes in place while piwf is
alpha: any change changes :data:`SCHEMA_DIGEST`, and a database built from another digest is
refused untouched (see :mod:`piwf.state.database`).

Lifecycle values are mirrored by the enums in :mod:`piwf.state.enums`; a test compares each
``CHECK (... IN (...))`` list with its enum.
"""

from __future__ import annotations

import hashlib

from piwf.state.schema.decisions import DECISION_STATEMENTS
from piwf.state.schema.resources import RESOURCE_STATEMENTS
from piwf.state.schema.retention import RETENTION_STATEMENTS

SCHEMA_NAME = "piwf-state"
SCHEMA_VERSION = 1
APPLICATION_ID = 0x50495746  # "PIWF"

_SCHEMA_META = """
CREATE TABLE schema_meta (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  schema_name TEXT NOT NULL CHECK (schema_name = 'piwf-state'),
  schema_version INTEGER NOT NULL CHECK (schema_version = 1),
  schema_digest BLOB NOT NULL CHECK (length(schema_digest) = 32),
  app_version TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT
"""

_PROJECTS = """
CREATE TABLE projects (
  project_id TEXT PRIMARY KEY,
  canonical_path TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL
) STRICT
"""

_BLOBS = """
CREATE TABLE blobs (
  blob_hash BLOB PRIMARY KEY CHECK (length(blob_hash) = 32),
  media_type TEXT NOT NULL CHECK (media_type IN ('application/json', 'text/plain')),
  byte_length INTEGER NOT NULL CHECK (byte_length >= 0),
  content BLOB NOT NULL,
  created_at INTEGER NOT NULL,
  CHECK (byte_length = length(content))
) STRICT
"""

_RESOURCES = """
CREATE TABLE resources (
  resource_id TEXT PRIMARY KEY,
  resource_type TEXT NOT NULL CHECK (resource_type IN (
    'run', 'effect', 'decision', 'managed_resource', 'session', 'channel', 'server', 'system')),
  aggregate_key TEXT NOT NULL,
  revision INTEGER NOT NULL DEFAULT 0 CHECK (revision >= 0),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (resource_type, aggregate_key)
) STRICT
"""

_LEASES = """
CREATE TABLE leases (
  resource_id TEXT PRIMARY KEY REFERENCES resources(resource_id) ON DELETE CASCADE,
  generation INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
  owner_type TEXT CHECK (owner_type IN (
    'server', 'control', 'resource_manager', 'session', 'channel', 'system')),
  owner_id TEXT,
  token_hash BLOB CHECK (token_hash IS NULL OR length(token_hash) = 32),
  acquired_at INTEGER,
  heartbeat_at INTEGER,
  expires_at INTEGER,
  CHECK (
    (owner_type IS NULL AND owner_id IS NULL AND token_hash IS NULL
      AND acquired_at IS NULL AND heartbeat_at IS NULL AND expires_at IS NULL)
    OR
    (owner_type IS NOT NULL AND owner_id IS NOT NULL AND token_hash IS NOT NULL
      AND acquired_at IS NOT NULL AND heartbeat_at IS NOT NULL AND expires_at IS NOT NULL
      AND generation > 0)
  )
) STRICT
"""

_LEASES_EXPIRES_INDEX = """
CREATE INDEX leases_expires_idx ON leases(expires_at) WHERE expires_at IS NOT NULL
"""

_LEASES_OWNER_INDEX = """
CREATE INDEX leases_owner_idx ON leases(owner_type, owner_id) WHERE owner_type IS NOT NULL
"""

_EVENTS = """
CREATE TABLE events (
  event_seq INTEGER PRIMARY KEY AUTOINCREMENT,
  event_id TEXT NOT NULL UNIQUE,
  resource_id TEXT NOT NULL REFERENCES resources(resource_id) ON DELETE CASCADE,
  resource_revision INTEGER NOT NULL CHECK (resource_revision > 0),
  event_type TEXT NOT NULL,
  actor_type TEXT NOT NULL CHECK (actor_type IN (
    'server', 'runner', 'client', 'control', 'human', 'policy', 'resource_manager',
    'session', 'channel', 'system')),
  actor_id TEXT,
  lease_generation INTEGER CHECK (lease_generation IS NULL OR lease_generation > 0),
  payload_hash BLOB REFERENCES blobs(blob_hash),
  recorded_at INTEGER NOT NULL,
  UNIQUE (resource_id, resource_revision)
) STRICT
"""

_EVENTS_RESOURCE_INDEX = """
CREATE INDEX events_resource_idx ON events(resource_id, event_seq)
"""

# Events are the immutable audit: no normal path may rewrite one. Deletion stays possible only
# through the cascade of a whole aggregate (retention of a complete terminal run tree).
_EVENTS_IMMUTABLE_TRIGGER = """
CREATE TRIGGER events_immutable BEFORE UPDATE ON events
BEGIN
  SELECT RAISE(ABORT, 'events are immutable');
END
"""

_EFFECTS = """
CREATE TABLE effects (
  effect_id TEXT PRIMARY KEY,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id) ON DELETE CASCADE,
  source_resource_id TEXT NOT NULL REFERENCES resources(resource_id) ON DELETE CASCADE,
  source_revision INTEGER NOT NULL CHECK (source_revision >= 0),
  effect_type TEXT NOT NULL CHECK (length(effect_type) BETWEEN 1 AND 256),
  idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 256),
  payload_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  recovery TEXT NOT NULL CHECK (recovery IN ('idempotent', 'manual', 'observe')),
  owner_scope TEXT NOT NULL CHECK (owner_scope IN (
    'run', 'resource_manager', 'channel', 'system')),
  status TEXT NOT NULL CHECK (status IN (
    'pending', 'applying', 'applied', 'rejected', 'ambiguous', 'cancelled')),
  attempt_count INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
  next_attempt_at INTEGER,
  result_hash BLOB REFERENCES blobs(blob_hash),
  external_ref TEXT,
  error_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  settled_at INTEGER,
  UNIQUE (source_resource_id, effect_type, idempotency_key),
  CHECK ((status IN ('applied', 'rejected', 'cancelled')) = (settled_at IS NOT NULL)),
  CHECK (status != 'applying' OR attempt_count > 0)
) STRICT
"""

_EFFECTS_PENDING_INDEX = """
CREATE INDEX effects_pending_idx ON effects(status, next_attempt_at, created_at)
"""

_EFFECT_ATTEMPTS = """
CREATE TABLE effect_attempts (
  effect_id TEXT NOT NULL REFERENCES effects(effect_id) ON DELETE CASCADE,
  attempt_number INTEGER NOT NULL CHECK (attempt_number > 0),
  owner_id TEXT NOT NULL,
  lease_generation INTEGER NOT NULL CHECK (lease_generation > 0),
  started_at INTEGER NOT NULL,
  finished_at INTEGER,
  outcome TEXT CHECK (outcome IN ('applied', 'rejected', 'ambiguous', 'interrupted')),
  result_hash BLOB REFERENCES blobs(blob_hash),
  error_hash BLOB REFERENCES blobs(blob_hash),
  PRIMARY KEY (effect_id, attempt_number),
  CHECK ((finished_at IS NULL) = (outcome IS NULL))
) STRICT
"""

# At most one attempt of an effect is open at a time.
_EFFECT_ATTEMPTS_OPEN_INDEX = """
CREATE UNIQUE INDEX effect_attempts_open_idx ON effect_attempts(effect_id)
  WHERE finished_at IS NULL
"""

_WORKFLOW_DEFINITIONS = """
CREATE TABLE workflow_definitions (
  definition_digest BLOB PRIMARY KEY REFERENCES blobs(blob_hash),
  workflow_name TEXT NOT NULL,
  created_at INTEGER NOT NULL
) STRICT
"""

_RUNS = """
CREATE TABLE runs (
  run_id TEXT PRIMARY KEY,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id) ON DELETE CASCADE,
  project_id TEXT REFERENCES projects(project_id),
  parent_run_id TEXT REFERENCES runs(run_id),
  root_run_id TEXT NOT NULL REFERENCES runs(run_id),
  lineage_kind TEXT CHECK (lineage_kind IN ('restart')),
  restart_number INTEGER NOT NULL DEFAULT 0 CHECK (restart_number >= 0),
  parent_terminal_fingerprint BLOB
    CHECK (parent_terminal_fingerprint IS NULL OR length(parent_terminal_fingerprint) = 32),
  definition_digest BLOB NOT NULL REFERENCES workflow_definitions(definition_digest),
  workflow_ref TEXT NOT NULL,
  launch_options_hash BLOB REFERENCES blobs(blob_hash),
  title TEXT,
  status TEXT NOT NULL CHECK (status IN (
    'queued', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'cancelled')),
  paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
  status_detail TEXT,
  input_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  final_output_hash BLOB REFERENCES blobs(blob_hash),
  error_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  finished_at INTEGER,
  CHECK ((status IN ('completed', 'failed', 'timed_out', 'cancelled'))
    = (finished_at IS NOT NULL)),
  CHECK ((parent_run_id IS NULL) = (lineage_kind IS NULL)),
  CHECK ((lineage_kind IS 'restart') = (parent_terminal_fingerprint IS NOT NULL)),
  CHECK (parent_run_id IS NOT NULL OR restart_number = 0),
  CHECK (parent_run_id IS NULL OR restart_number > 0),
  CHECK (final_output_hash IS NULL OR status = 'completed')
) STRICT
"""

_RUNS_PROJECT_INDEX = """
CREATE INDEX runs_project_idx ON runs(project_id, created_at DESC)
"""

_RUNS_STATUS_INDEX = """
CREATE INDEX runs_status_idx ON runs(status, updated_at DESC)
"""

_RUNS_CREATED_INDEX = """
CREATE INDEX runs_created_idx ON runs(created_at DESC, run_id DESC)
"""

_RUNS_PARENT_INDEX = """
CREATE INDEX runs_parent_idx ON runs(parent_run_id)
"""

# A terminal run is restarted at most once; the restart chain is a line, never a tree.
_RUNS_RESTART_PARENT_INDEX = """
CREATE UNIQUE INDEX runs_restart_parent_idx ON runs(parent_run_id)
  WHERE lineage_kind = 'restart'
"""

_RUN_SOURCES = """
CREATE TABLE run_sources (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  mount_path TEXT NOT NULL,
  source_type TEXT NOT NULL CHECK (source_type IN ('file', 'builtin')),
  source_ref TEXT NOT NULL,
  source_revision TEXT NOT NULL,
  PRIMARY KEY (run_id, mount_path)
) STRICT
"""

_RUN_BINDINGS = """
CREATE TABLE run_bindings (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  origin_session_id TEXT,
  execution_mode TEXT NOT NULL CHECK (execution_mode IN ('interactive', 'headless')),
  created_at INTEGER NOT NULL,
  CHECK ((execution_mode = 'interactive') = (origin_session_id IS NOT NULL))
) STRICT
"""

_RUN_BINDINGS_SESSION_INDEX = """
CREATE INDEX run_bindings_session_idx ON run_bindings(origin_session_id, created_at DESC)
  WHERE origin_session_id IS NOT NULL
"""

_RUN_QUEUE = """
CREATE TABLE run_queue (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  status TEXT NOT NULL CHECK (status IN (
    'queued', 'starting', 'running', 'parked', 'done', 'failed', 'cancelled')),
  available_at INTEGER NOT NULL,
  origin_session_id TEXT,
  consecutive_errors INTEGER NOT NULL DEFAULT 0 CHECK (consecutive_errors >= 0),
  error_code TEXT CHECK (error_code IN (
    'claimLost', 'runnerCrashed', 'runnerNoProgress', 'runnerTimedOut', 'serverUnavailable',
    'sourceChanged', 'effectAmbiguous', 'nodeFailed', 'protocolRejected')),
  error_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  started_at INTEGER,
  finished_at INTEGER,
  CHECK ((status IN ('done', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
) STRICT
"""

_RUN_QUEUE_CLAIM_INDEX = """
CREATE INDEX run_queue_claim_idx ON run_queue(status, available_at, created_at)
"""

# An interactive run reserves its origin session while it is queued or executing.
_RUN_QUEUE_ACTIVE_SESSION_INDEX = """
CREATE UNIQUE INDEX run_queue_active_session_idx ON run_queue(origin_session_id)
  WHERE status IN ('queued', 'starting', 'running') AND origin_session_id IS NOT NULL
"""

_NODE_ATTEMPTS = """
CREATE TABLE node_attempts (
  attempt_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  node_path TEXT NOT NULL,
  visit INTEGER NOT NULL CHECK (visit > 0),
  attempt_number INTEGER NOT NULL CHECK (attempt_number > 0),
  node_type TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN (
    'pending', 'running', 'waiting', 'interrupted', 'completed', 'failed', 'timed_out',
    'cancelled')),
  lease_generation INTEGER NOT NULL CHECK (lease_generation > 0),
  prompt_hash BLOB REFERENCES blobs(blob_hash),
  output_hash BLOB REFERENCES blobs(blob_hash),
  receipt_hash BLOB REFERENCES blobs(blob_hash),
  error_hash BLOB REFERENCES blobs(blob_hash),
  started_at INTEGER,
  deadline_at INTEGER,
  finished_at INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (run_id, node_path, visit, attempt_number),
  CHECK ((status IN ('interrupted', 'completed', 'failed', 'timed_out', 'cancelled'))
    = (finished_at IS NOT NULL)),
  CHECK (output_hash IS NULL OR status IN ('completed', 'waiting'))
) STRICT
"""

# One active attempt per run (seed 000 "partial unique indexes").
_NODE_ATTEMPTS_ACTIVE_INDEX = """
CREATE UNIQUE INDEX node_attempts_active_idx ON node_attempts(run_id)
  WHERE status IN ('pending', 'running', 'waiting')
"""

_NODE_ATTEMPTS_RUN_INDEX = """
CREATE INDEX node_attempts_run_idx ON node_attempts(run_id, created_at)
"""

_NODE_ATTEMPTS_DEADLINE_INDEX = """
CREATE INDEX node_attempts_deadline_idx ON node_attempts(deadline_at)
  WHERE deadline_at IS NOT NULL
"""

_RUN_STEPS = """
CREATE TABLE run_steps (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  step_index INTEGER NOT NULL CHECK (step_index >= 0),
  attempt_id TEXT NOT NULL REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  PRIMARY KEY (run_id, step_index),
  UNIQUE (run_id, attempt_id)
) STRICT
"""

_RUN_STEPS_ATTEMPT_INDEX = """
CREATE INDEX run_steps_attempt_idx ON run_steps(attempt_id)
"""

_WORKFLOW_UPDATES = """
CREATE TABLE workflow_updates (
  update_id TEXT PRIMARY KEY,
  attempt_id TEXT NOT NULL REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  update_seq INTEGER NOT NULL CHECK (update_seq > 0),
  run_revision INTEGER NOT NULL CHECK (run_revision > 0),
  update_type TEXT NOT NULL CHECK (length(update_type) BETWEEN 1 AND 256),
  update_key TEXT NOT NULL CHECK (length(update_key) BETWEEN 1 AND 256),
  data_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  recorded_at INTEGER NOT NULL,
  UNIQUE (attempt_id, update_seq)
) STRICT
"""

_WORKFLOW_UPDATES_KEY_INDEX = """
CREATE INDEX workflow_updates_key_idx
  ON workflow_updates(attempt_id, update_type, update_key, update_seq DESC)
"""

# The single server claim: one row, created with the schema. Epoch grows by one per server.
_SERVER_STATE = """
CREATE TABLE server_state (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  epoch INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0),
  server_id TEXT,
  token_hash BLOB CHECK (token_hash IS NULL OR length(token_hash) = 32),
  pid INTEGER CHECK (pid IS NULL OR pid > 0),
  process_start_identity TEXT,
  started_at INTEGER,
  heartbeat_at INTEGER,
  expires_at INTEGER,
  CHECK (
    (server_id IS NULL AND token_hash IS NULL AND pid IS NULL AND process_start_identity IS NULL
      AND started_at IS NULL AND heartbeat_at IS NULL AND expires_at IS NULL)
    OR
    (server_id IS NOT NULL AND token_hash IS NOT NULL AND pid IS NOT NULL
      AND process_start_identity IS NOT NULL AND started_at IS NOT NULL
      AND heartbeat_at IS NOT NULL AND expires_at IS NOT NULL AND epoch > 0)
  )
) STRICT
"""

_SERVER_STATE_ROW = """
INSERT INTO server_state (id, epoch) VALUES (1, 0)
"""

# Receipts of state-changing client commands, written in the transaction of the change.
_SERVER_COMMANDS = """
CREATE TABLE server_commands (
  request_id TEXT PRIMARY KEY CHECK (length(request_id) BETWEEN 1 AND 256),
  client_id TEXT NOT NULL CHECK (length(client_id) BETWEEN 1 AND 256),
  operation TEXT NOT NULL,
  idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 256),
  request_fingerprint BLOB NOT NULL CHECK (length(request_fingerprint) = 32),
  run_id TEXT REFERENCES runs(run_id) ON DELETE SET NULL,
  accepted_revision INTEGER CHECK (accepted_revision IS NULL OR accepted_revision >= 0),
  outcome TEXT NOT NULL CHECK (outcome IN (
    'accepted', 'adopted', 'rejected', 'conflict', 'notFound', 'claimLost', 'unavailable')),
  receipt_hash BLOB REFERENCES blobs(blob_hash),
  error_hash BLOB REFERENCES blobs(blob_hash),
  server_epoch INTEGER NOT NULL CHECK (server_epoch > 0),
  created_at INTEGER NOT NULL,
  completed_at INTEGER NOT NULL,
  UNIQUE (client_id, idempotency_key)
) STRICT
"""

_SERVER_COMMANDS_RUN_INDEX = """
CREATE INDEX server_commands_run_idx ON server_commands(run_id, created_at)
"""

# One row per runner process launched for a run generation, recorded before the spawn. A runner
# row is a supervision record, not part of the run aggregate: writing it checks the run claim but
# does not change the run revision (except ``ready``, which moves the queue row). The no-progress
# rule compares the run revision with ``ready_revision`` (or ``launch_revision`` when the runner
# never became ready).
_RUN_RUNNERS = """
CREATE TABLE run_runners (
  runner_epoch TEXT PRIMARY KEY CHECK (length(runner_epoch) BETWEEN 1 AND 256),
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  generation INTEGER NOT NULL CHECK (generation > 0),
  server_epoch INTEGER NOT NULL CHECK (server_epoch > 0),
  command TEXT NOT NULL CHECK (command IN ('start', 'resume', 'continue', 'restart')),
  launch_envelope_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  launch_revision INTEGER NOT NULL CHECK (launch_revision >= 0),
  ready_revision INTEGER CHECK (ready_revision IS NULL OR ready_revision >= 0),
  pid INTEGER CHECK (pid IS NULL OR pid > 0),
  process_start_identity TEXT,
  status TEXT NOT NULL CHECK (status IN (
    'starting', 'ready', 'running', 'exited', 'cancelled', 'timedOut', 'crashed', 'claimLost',
    'orphaned')),
  started_at INTEGER NOT NULL,
  ready_at INTEGER,
  finished_at INTEGER,
  exit_code INTEGER,
  signal TEXT,
  diagnostic_hash BLOB REFERENCES blobs(blob_hash),
  CHECK ((pid IS NULL) = (process_start_identity IS NULL)),
  CHECK ((status IN ('starting', 'ready', 'running')) = (finished_at IS NULL)),
  CHECK ((ready_at IS NULL) = (ready_revision IS NULL)),
  CHECK (status != 'starting' OR ready_at IS NULL),
  CHECK (status NOT IN ('ready', 'running') OR ready_at IS NOT NULL)
) STRICT
"""

# At most one live runner per run.
_RUN_RUNNERS_ACTIVE_INDEX = """
CREATE UNIQUE INDEX run_runners_active_idx ON run_runners(run_id)
  WHERE status IN ('starting', 'ready', 'running')
"""

_RUN_RUNNERS_GENERATION_INDEX = """
CREATE INDEX run_runners_generation_idx ON run_runners(run_id, generation, started_at)
"""

# Receipts of state-changing runner messages: a retried message gets the identical answer.
_RUNNER_MESSAGES = """
CREATE TABLE runner_messages (
  runner_epoch TEXT NOT NULL REFERENCES run_runners(runner_epoch) ON DELETE CASCADE,
  message_id TEXT NOT NULL CHECK (length(message_id) BETWEEN 1 AND 256),
  request_fingerprint BLOB NOT NULL CHECK (length(request_fingerprint) = 32),
  outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'adopted', 'rejected', 'claimLost')),
  accepted_revision INTEGER CHECK (accepted_revision IS NULL OR accepted_revision >= 0),
  result_hash BLOB REFERENCES blobs(blob_hash),
  error_hash BLOB REFERENCES blobs(blob_hash),
  completed_at INTEGER NOT NULL,
  PRIMARY KEY (runner_epoch, message_id)
) STRICT
"""

# The request a node visit parks on (checkpoint, protected human decision, agent step). Minimal:
# the decision, submission and message tables of later features build on it.
_INTERACTIVE_REQUESTS = """
CREATE TABLE interactive_requests (
  request_id TEXT PRIMARY KEY CHECK (length(request_id) BETWEEN 1 AND 256),
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL UNIQUE REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  kind TEXT NOT NULL CHECK (kind IN ('checkpoint', 'human_decision', 'agent')),
  content_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  on_timeout_hash BLOB REFERENCES blobs(blob_hash),
  timeout_ms INTEGER CHECK (timeout_ms IS NULL OR timeout_ms > 0),
  status TEXT NOT NULL CHECK (status IN ('pending', 'answered', 'settled', 'cancelled')),
  answer_hash BLOB REFERENCES blobs(blob_hash),
  answered_by TEXT CHECK (answered_by IN (
    'human', 'client', 'timeout_policy', 'expired', 'session')),
  rejection_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  CHECK ((answer_hash IS NULL) = (answered_by IS NULL)),
  CHECK (status NOT IN ('answered', 'settled') OR answer_hash IS NOT NULL),
  CHECK (status != 'pending' OR answer_hash IS NULL)
) STRICT
"""

# One open (pending or answered) request per run.
_INTERACTIVE_REQUESTS_OPEN_INDEX = """
CREATE UNIQUE INDEX interactive_requests_open_run_idx ON interactive_requests(run_id)
  WHERE status IN ('pending', 'answered')
"""

_INTERACTIVE_REQUESTS_RUN_INDEX = """
CREATE INDEX interactive_requests_run_idx ON interactive_requests(run_id, created_at)
"""

# Notifications proposed by notify nodes; the id is stable across crash retries of a visit.
_RUN_NOTIFICATIONS = """
CREATE TABLE run_notifications (
  notification_id TEXT PRIMARY KEY CHECK (length(notification_id) BETWEEN 1 AND 256),
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  node_path TEXT NOT NULL,
  visit INTEGER NOT NULL CHECK (visit > 0),
  kind TEXT NOT NULL CHECK (kind IN ('progress', 'final')),
  message_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  run_revision INTEGER NOT NULL CHECK (run_revision > 0),
  created_at INTEGER NOT NULL
) STRICT
"""

_RUN_NOTIFICATIONS_RUN_INDEX = """
CREATE INDEX run_notifications_run_idx ON run_notifications(run_id, created_at)
"""

#: Statements in execution order; each one is a single SQL statement.
STATEMENTS: tuple[str, ...] = tuple(
    statement.strip()
    for statement in (
        _SCHEMA_META,
        _PROJECTS,
        _BLOBS,
        _RESOURCES,
        _LEASES,
        _LEASES_EXPIRES_INDEX,
        _LEASES_OWNER_INDEX,
        _EVENTS,
        _EVENTS_RESOURCE_INDEX,
        _EVENTS_IMMUTABLE_TRIGGER,
        _EFFECTS,
        _EFFECTS_PENDING_INDEX,
        _EFFECT_ATTEMPTS,
        _EFFECT_ATTEMPTS_OPEN_INDEX,
        _WORKFLOW_DEFINITIONS,
        _RUNS,
        _RUNS_PROJECT_INDEX,
        _RUNS_STATUS_INDEX,
        _RUNS_CREATED_INDEX,
        _RUNS_PARENT_INDEX,
        _RUNS_RESTART_PARENT_INDEX,
        _RUN_SOURCES,
        _RUN_BINDINGS,
        _RUN_BINDINGS_SESSION_INDEX,
        _RUN_QUEUE,
        _RUN_QUEUE_CLAIM_INDEX,
        _RUN_QUEUE_ACTIVE_SESSION_INDEX,
        _NODE_ATTEMPTS,
        _NODE_ATTEMPTS_ACTIVE_INDEX,
        _NODE_ATTEMPTS_RUN_INDEX,
        _NODE_ATTEMPTS_DEADLINE_INDEX,
        _RUN_STEPS,
        _RUN_STEPS_ATTEMPT_INDEX,
        _WORKFLOW_UPDATES,
        _WORKFLOW_UPDATES_KEY_INDEX,
        _SERVER_STATE,
        _SERVER_STATE_ROW,
        _SERVER_COMMANDS,
        _SERVER_COMMANDS_RUN_INDEX,
        _RUN_RUNNERS,
        _RUN_RUNNERS_ACTIVE_INDEX,
        _RUN_RUNNERS_GENERATION_INDEX,
        _RUNNER_MESSAGES,
        _INTERACTIVE_REQUESTS,
        _INTERACTIVE_REQUESTS_OPEN_INDEX,
        _INTERACTIVE_REQUESTS_RUN_INDEX,
        _RUN_NOTIFICATIONS,
        _RUN_NOTIFICATIONS_RUN_INDEX,
        *DECISION_STATEMENTS,
        *RETENTION_STATEMENTS,
        *RESOURCE_STATEMENTS,
    )
)

#: The full DDL text, the single source of truth for the schema.
SCHEMA_SQL = ";\n\n".join(STATEMENTS) + ";\n"

#: SHA-256 of :data:`SCHEMA_SQL`; stored in ``schema_meta`` and checked on every open.
SCHEMA_DIGEST = hashlib.sha256(SCHEMA_SQL.encode("utf-8")).digest()
