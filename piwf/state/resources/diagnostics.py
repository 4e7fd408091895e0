"""Read-only invariants of managed resources, reported by ``state verify`` with stable codes.

================  ================================================================
code              meaning
================  ================================================================
resourceQueue     a managed resource has a live reconcile claim but no queue row (a
                  reconcile's result or failure always decides the row in the
                  transaction that releases the claim)
resourceDeletion  a resource marked deleting has no finalizer, no queue row and no live
                  claim: nothing will ever remove it
================  ================================================================
"""

from __future__ import annotations

from piwf.state.database import Transaction

_CLAIMED_WITHOUT_QUEUE = """
SELECT m.uid FROM managed_resources m
JOIN leases l ON l.resource_id = m.resource_id
WHERE l.owner_id IS NOT NULL AND l.expires_at > :now
  AND NOT EXISTS (SELECT 1 FROM managed_resource_queue q WHERE q.uid = m.uid)
"""

_STUCK_DELETION = """
SELECT m.uid FROM managed_resources m
LEFT JOIN leases l ON l.resource_id = m.resource_id
WHERE m.deletion_requested_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM managed_resource_finalizers f WHERE f.uid = m.uid)
  AND NOT EXISTS (SELECT 1 FROM managed_resource_queue q WHERE q.uid = m.uid)
  AND (l.owner_id IS NULL OR l.expires_at <= :now)
"""


def resource_violations(tx: Transaction) -> list[tuple[str, str]]:
    """Every broken managed-resource invariant as ``(code, detail)``; details name ids only."""
    found = [
        ("resourceQueue", f"managed resource {row[0]}")
        for row in tx.all(_CLAIMED_WITHOUT_QUEUE, {"now": tx.now})
    ]
    found.extend(
        ("resourceDeletion", f"managed resource {row[0]}")
        for row in tx.all(_STUCK_DELETION, {"now": tx.now})
    )
    return found
