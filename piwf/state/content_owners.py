"""Which stored values a client may read by content reference, and whose they are.

A client reads a large value through a reference that names its owner: a run (``run`` scope,
the run id) or a managed resource (``resource`` scope, the uid). A part read is served only
while that owner still holds a value with the reference's digest, so a reference cannot reach
another run's values, a made-up digest, or anything the server never advertises::

    scope     owner   values a reference may name
    run       run id  final output, error text, the reason it is parked, content of its
                      requests, the winning answer and every submitted answer of its
                      decisions, every output submitted
                      to its agent requests (as sent, as accepted) and each rejection, the
                      output and error of each node attempt and the data of each update it
                      published (the run view's steps), the content of its workflow messages,
                      the entries and event payloads of its session capture
    resource  uid     spec, status

Read-only: nothing here writes, and a read leaves no receipt or other trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from piwf.state.database import Transaction

Scope = Literal["run", "resource"]

_RUN_HOLDS = """
SELECT EXISTS (
  SELECT 1 FROM runs
  WHERE run_id = :owner AND (final_output_hash = :digest OR error_hash = :digest)
  UNION ALL
  SELECT 1 FROM run_queue WHERE run_id = :owner AND error_hash = :digest
  UNION ALL
  SELECT 1 FROM workflow_messages WHERE run_id = :owner AND content_hash = :digest
  UNION ALL
  SELECT 1 FROM interactive_requests WHERE run_id = :owner AND content_hash = :digest
  UNION ALL
  SELECT 1 FROM human_decision_resolutions r JOIN human_decisions d USING (decision_id)
  WHERE d.run_id = :owner AND r.response_hash = :digest
  UNION ALL
  SELECT 1 FROM human_decision_submissions s JOIN human_decisions d USING (decision_id)
  WHERE d.run_id = :owner AND s.candidate_hash = :digest
  UNION ALL
  SELECT 1 FROM interactive_submissions s JOIN interactive_requests i USING (request_id)
  WHERE i.run_id = :owner
    AND (s.payload_hash = :digest OR s.value_hash = :digest OR s.error_hash = :digest)
  UNION ALL
  SELECT 1 FROM node_attempts
  WHERE run_id = :owner AND (output_hash = :digest OR error_hash = :digest)
  UNION ALL
  SELECT 1 FROM workflow_updates u JOIN node_attempts a USING (attempt_id)
  WHERE a.run_id = :owner AND u.data_hash = :digest
  UNION ALL
  SELECT 1 FROM session_entries WHERE run_id = :owner AND content_hash = :digest
  UNION ALL
  SELECT 1 FROM session_events WHERE run_id = :owner AND payload_hash = :digest
)
"""

_RESOURCE_HOLDS = """
SELECT EXISTS (
  SELECT 1 FROM managed_resources
  WHERE uid = :owner AND (spec_hash = :digest OR status_hash = :digest)
)
"""

_HOLDS: dict[Scope, str] = {"run": _RUN_HOLDS, "resource": _RESOURCE_HOLDS}

_SELECT_RUN_VALUES = "SELECT final_output_hash, error_hash FROM runs WHERE run_id = ?"


@dataclass(frozen=True)
class RunValues:
    """The digests of a run's final output (JSON) and error text, None when it has none."""

    output: bytes | None
    error: bytes | None


def holds(tx: Transaction, scope: Scope, owner: str, digest: bytes) -> bool:
    """Return True when ``owner`` (of ``scope``) holds a client-readable value ``digest``."""
    return bool(tx.scalar(_HOLDS[scope], {"owner": owner, "digest": digest}))


def run_values(tx: Transaction, run_id: str) -> RunValues:
    """Return the digests of the run's output and error (both None for an unknown run)."""
    row = tx.one(_SELECT_RUN_VALUES, (run_id,))
    if row is None:
        return RunValues(None, None)
    output, error = row["final_output_hash"], row["error_hash"]
    return RunValues(
        output=None if output is None else bytes(output),
        error=None if error is None else bytes(error),
    )
