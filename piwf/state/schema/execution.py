"""DDL of the execution tables, assembled into the one schema by :mod:`piwf.state.schema`.

- ``workflow_definitions``, ``runs``, ``run_sources``, ``run_bindings``, ``run_queue``: a run,
  its definition and source identity, how it was started, and its queue row.
- ``node_attempts``, ``run_steps``, ``workflow_updates``: node visits and what they recorded.
- ``run_runners``, ``runner_messages``: one row per runner process and its stored receipts.
- ``interactive_requests``, ``run_notifications``: what a visit parks on, and its notices.

``docs/EXECUTION_STATE.md`` describes the tables and their transitions. Two tuples, because the
assembled schema keeps its statement order (and so its digest): the server rows of
:mod:`piwf.state.schema.core` sit between them.
"""

from __future__ import annotations

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
  lineage_kind TEXT CHECK (lineage_kind IN ('restart', 'fork')),
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

# One row per mount ('' is the root): how it named its workflow, and the file that resolved to.
_RUN_SOURCES = """
CREATE TABLE run_sources (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  mount_path TEXT NOT NULL,
  reference_kind TEXT NOT NULL CHECK (reference_kind IN ('path', 'name', 'builtin', 'definition')),
  reference TEXT NOT NULL,
  source_type TEXT NOT NULL CHECK (source_type IN ('file', 'builtin')),
  source_ref TEXT NOT NULL,
  source_revision TEXT NOT NULL,
  piwf_version TEXT,
  CHECK (reference_kind <> 'builtin' OR source_type = 'builtin'),
  CHECK (piwf_version IS NULL OR source_type = 'builtin'),
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
  consecutive_errors INTEGER NOT NULL DEFAULT 0 CHECK (consecutive_errors >= 0),
  error_code TEXT CHECK (error_code IN (
    'claimLost', 'runnerCrashed', 'runnerNoProgress', 'runnerTimedOut', 'serverUnavailable',
    'sourceChanged', 'effectAmbiguous', 'nodeFailed', 'inputRejected', 'protocolRejected')),
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
  failure_hash BLOB REFERENCES blobs(blob_hash),
  started_at INTEGER,
  deadline_at INTEGER,
  wake_at INTEGER,
  finished_at INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (run_id, node_path, visit, attempt_number),
  CHECK ((status IN ('interrupted', 'completed', 'failed', 'timed_out', 'cancelled'))
    = (finished_at IS NOT NULL)),
  CHECK (output_hash IS NULL OR status IN ('completed', 'waiting')),
  CHECK (failure_hash IS NULL OR status IN ('failed', 'timed_out', 'cancelled'))
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

# Keyed by (run, step) without a rowid; ``attempt_id`` is unique across runs (it is derived from
# the run id), so its one index serves both the uniqueness and the cascade from node_attempts.
_RUN_STEPS = """
CREATE TABLE run_steps (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  step_index INTEGER NOT NULL CHECK (step_index >= 0),
  attempt_id TEXT NOT NULL UNIQUE REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  PRIMARY KEY (run_id, step_index)
) STRICT, WITHOUT ROWID
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


#: Runs, their queue and their node visits.
RUN_STATEMENTS: tuple[str, ...] = (
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
    _NODE_ATTEMPTS,
    _NODE_ATTEMPTS_ACTIVE_INDEX,
    _NODE_ATTEMPTS_RUN_INDEX,
    _NODE_ATTEMPTS_DEADLINE_INDEX,
    _RUN_STEPS,
    _WORKFLOW_UPDATES,
    _WORKFLOW_UPDATES_KEY_INDEX,
)

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
# A receipt is read by its key only: kept in its key's b-tree, without a rowid.
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
) STRICT, WITHOUT ROWID
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
    'human', 'client', 'timeout_policy', 'expired', 'session', 'unproductive')),
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


#: Runner rows, receipts, interactive requests and notifications.
RUNNER_STATEMENTS: tuple[str, ...] = (
    _RUN_RUNNERS,
    _RUN_RUNNERS_ACTIVE_INDEX,
    _RUN_RUNNERS_GENERATION_INDEX,
    _RUNNER_MESSAGES,
    _INTERACTIVE_REQUESTS,
    _INTERACTIVE_REQUESTS_OPEN_INDEX,
    _INTERACTIVE_REQUESTS_RUN_INDEX,
    _RUN_NOTIFICATIONS,
    _RUN_NOTIFICATIONS_RUN_INDEX,
)
