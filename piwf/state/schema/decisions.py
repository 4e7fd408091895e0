"""DDL of the decision tables, assembled into the one schema by :mod:`piwf.state.schema`.

A ``human_decisions`` row audits every checkpoint and protected human decision request (its id
is the request id). ``human_decision_resolutions`` holds the single winner: its primary key is
the decision, so a human answer, the timeout policy, an explicit cancel and a no-default expiry
compete for one insert and the row is never updated. ``human_decision_submissions`` keeps every
candidate with what became of it.
"""

from __future__ import annotations

_HUMAN_DECISIONS = """
CREATE TABLE human_decisions (
  decision_id TEXT PRIMARY KEY REFERENCES interactive_requests(request_id) ON DELETE CASCADE,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id),
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  kind TEXT NOT NULL CHECK (kind IN ('checkpoint', 'human_decision')),
  choices_hash BLOB REFERENCES blobs(blob_hash),
  default_response_hash BLOB REFERENCES blobs(blob_hash),
  deadline_at INTEGER,
  created_at INTEGER NOT NULL,
  CHECK (default_response_hash IS NULL OR deadline_at IS NOT NULL),
  CHECK (kind = 'human_decision' OR deadline_at IS NULL)
) STRICT
"""

_HUMAN_DECISIONS_RUN_INDEX = """
CREATE INDEX human_decisions_run_idx ON human_decisions(run_id, created_at)
"""

_HUMAN_DECISIONS_DEADLINE_INDEX = """
CREATE INDEX human_decisions_deadline_idx ON human_decisions(deadline_at)
  WHERE deadline_at IS NOT NULL
"""

_HUMAN_DECISION_RESOLUTIONS = """
CREATE TABLE human_decision_resolutions (
  decision_id TEXT PRIMARY KEY REFERENCES human_decisions(decision_id) ON DELETE CASCADE,
  outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'cancelled')),
  provenance TEXT NOT NULL CHECK (provenance IN (
    'human', 'client', 'timeout_policy', 'explicit_cancel', 'expired_no_default')),
  response_hash BLOB REFERENCES blobs(blob_hash),
  reason TEXT,
  actor_type TEXT NOT NULL,
  actor_id TEXT,
  resolved_at INTEGER NOT NULL,
  CHECK (outcome != 'accepted' OR (response_hash IS NOT NULL AND reason IS NULL)),
  CHECK (outcome != 'cancelled' OR (reason IS NOT NULL AND response_hash IS NULL)),
  CHECK ((outcome = 'accepted') = (provenance IN ('human', 'client', 'timeout_policy')))
) STRICT
"""

_HUMAN_DECISION_RESOLUTIONS_IMMUTABLE_TRIGGER = """
CREATE TRIGGER human_decision_resolutions_immutable BEFORE UPDATE ON human_decision_resolutions
BEGIN
  SELECT RAISE(ABORT, 'a decision resolution is immutable');
END
"""

_HUMAN_DECISION_SUBMISSIONS = """
CREATE TABLE human_decision_submissions (
  decision_id TEXT NOT NULL REFERENCES human_decisions(decision_id) ON DELETE CASCADE,
  submission_id TEXT NOT NULL CHECK (length(submission_id) BETWEEN 1 AND 600),
  source TEXT NOT NULL CHECK (source IN ('human', 'client', 'workflow', 'policy', 'control')),
  actor_id TEXT,
  candidate_hash BLOB REFERENCES blobs(blob_hash),
  outcome TEXT NOT NULL CHECK (outcome IN ('won', 'adopted', 'already_resolved', 'rejected')),
  reason TEXT,
  submitted_at INTEGER NOT NULL,
  PRIMARY KEY (decision_id, submission_id),
  CHECK ((outcome = 'rejected') = (reason IS NOT NULL))
) STRICT
"""

# The submission that produced the resolution; at most one per decision.
_HUMAN_DECISION_SUBMISSIONS_WINNER_INDEX = """
CREATE UNIQUE INDEX human_decision_submissions_winner_idx
  ON human_decision_submissions(decision_id) WHERE outcome = 'won'
"""

#: The decision statements in execution order (after ``interactive_requests``).
DECISION_STATEMENTS: tuple[str, ...] = (
    _HUMAN_DECISIONS,
    _HUMAN_DECISIONS_RUN_INDEX,
    _HUMAN_DECISIONS_DEADLINE_INDEX,
    _HUMAN_DECISION_RESOLUTIONS,
    _HUMAN_DECISION_RESOLUTIONS_IMMUTABLE_TRIGGER,
    _HUMAN_DECISION_SUBMISSIONS,
    _HUMAN_DECISION_SUBMISSIONS_WINNER_INDEX,
)
