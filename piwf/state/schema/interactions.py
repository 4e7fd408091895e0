"""DDL of agent submissions, assembled into the one schema by :mod:`piwf.state.schema`.

``interactive_submissions`` keeps every candidate output submitted for an agent request and what
became of it::

    validating ──validation child accepted──▶ accepted   (the request is answered with value_hash)
               ──validation child rejected──▶ rejected   (the request stays pending)
               ──its child died / its request closed──▶ rejected

A request has at most one ``validating`` candidate (partial unique index), and an idempotency key
names one candidate of a request. ``validation_id`` is the child currently validating it (NULL
while it waits for a slot); only a reply carrying that id may settle it. A settled candidate keeps
its receipt (``receipt_hash``): a repeat with the same key gets it back.
"""

from __future__ import annotations

_INTERACTIVE_SUBMISSIONS = """
CREATE TABLE interactive_submissions (
  submission_id TEXT PRIMARY KEY CHECK (length(submission_id) BETWEEN 1 AND 256),
  request_id TEXT NOT NULL REFERENCES interactive_requests(request_id) ON DELETE CASCADE,
  idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 256),
  payload_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  outcome TEXT NOT NULL CHECK (outcome IN ('validating', 'accepted', 'rejected')),
  value_hash BLOB REFERENCES blobs(blob_hash),
  error_hash BLOB REFERENCES blobs(blob_hash),
  receipt_hash BLOB REFERENCES blobs(blob_hash),
  validation_id TEXT CHECK (validation_id IS NULL OR length(validation_id) BETWEEN 1 AND 256),
  submitted_at INTEGER NOT NULL,
  settled_at INTEGER,
  UNIQUE (request_id, idempotency_key),
  CHECK ((outcome = 'validating') = (settled_at IS NULL)),
  CHECK ((outcome = 'validating') = (receipt_hash IS NULL)),
  CHECK ((outcome = 'accepted') = (value_hash IS NOT NULL)),
  CHECK ((outcome = 'rejected') = (error_hash IS NOT NULL))
) STRICT
"""

# At most one candidate of a request is being validated at a time.
_INTERACTIVE_SUBMISSIONS_VALIDATING_INDEX = """
CREATE UNIQUE INDEX interactive_submissions_validating_idx
  ON interactive_submissions(request_id) WHERE outcome = 'validating'
"""

_INTERACTIVE_SUBMISSIONS_REQUEST_INDEX = """
CREATE INDEX interactive_submissions_request_idx
  ON interactive_submissions(request_id, submitted_at)
"""

#: The submission statements in execution order (after ``interactive_requests``).
INTERACTION_STATEMENTS: tuple[str, ...] = (
    _INTERACTIVE_SUBMISSIONS,
    _INTERACTIVE_SUBMISSIONS_VALIDATING_INDEX,
    _INTERACTIVE_SUBMISSIONS_REQUEST_INDEX,
)
