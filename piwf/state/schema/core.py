"""DDL of the shared records and of the server's own rows, assembled by :mod:`piwf.state.schema`.

- ``schema_meta``: the database's identity (schema name, version, DDL digest, app version).
- ``projects``, ``blobs``: project paths and content-addressed values.
- ``resources``, ``leases``, ``events``: every aggregate's revision, its claim and its audit.
- ``effects``, ``effect_attempts``: the transactional outbox.
- ``server_state``, ``server_commands``: the single server claim (its epoch) and the receipts
  of durable client commands.

Two tuples, because the assembled schema keeps its statement order (and so its digest): the
records come first, the server rows after the run tables they reference.
"""

from __future__ import annotations

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
    'run', 'effect', 'decision', 'managed_resource', 'session', 'channel', 'server', 'system',
    'settings')),
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

# ``event_id`` is ``<resource_id>@<resource_revision>``: unique with that pair, so it is not
# indexed again, and the pair's index serves every lookup of one aggregate's events (in revision
# order, which is commit order). Each index here is written by every change of every aggregate.
_EVENTS = """
CREATE TABLE events (
  event_seq INTEGER PRIMARY KEY AUTOINCREMENT,
  event_id TEXT NOT NULL,
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


#: The shared records, first in the schema.
RECORD_STATEMENTS: tuple[str, ...] = (
    _SCHEMA_META,
    _PROJECTS,
    _BLOBS,
    _RESOURCES,
    _LEASES,
    _LEASES_EXPIRES_INDEX,
    _LEASES_OWNER_INDEX,
    _EVENTS,
    _EVENTS_IMMUTABLE_TRIGGER,
    _EFFECTS,
    _EFFECTS_PENDING_INDEX,
    _EFFECT_ATTEMPTS,
    _EFFECT_ATTEMPTS_OPEN_INDEX,
)

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


#: The server claim and command receipts, after the run tables.
SERVER_STATEMENTS: tuple[str, ...] = (
    _SERVER_STATE,
    _SERVER_STATE_ROW,
    _SERVER_COMMANDS,
    _SERVER_COMMANDS_RUN_INDEX,
)
