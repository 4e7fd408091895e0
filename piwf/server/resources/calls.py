"""The calls a resource-runner child makes, applied to the store in the server's transaction.

Each ``piwf.resource.v1`` call payload (already validated by its pydantic model) maps to one
store function; every one of them renews the reconcile's claim first, so a call from a worker
that lost its claim raises :class:`~piwf.errors.ClaimLostError` and writes nothing. A
:class:`~piwf.state.Conflict` becomes a ``rejected`` answer with the code of
:func:`conflict_code`.
"""

from __future__ import annotations

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.lifecycle import Conflict
from piwf.protocol.payloads import RunStartPayload
from piwf.protocol.resource_v1 import (
    EffectBegin,
    EffectReserve,
    EffectSettle,
    ReconcileFail,
    ReconcileFinish,
    WorkflowEnsure,
)
from piwf.server.runs.handlers import new_run_from
from piwf.state import Transaction
from piwf.state.enums import ReconcileOutcome
from piwf.state.leases import Claim
from piwf.state.resources import calls as calls
from piwf.state.resources import reconciles as rc
from piwf.state.resources.status import StatusPatch

Payload = (
    EffectReserve | EffectBegin | EffectSettle | WorkflowEnsure | ReconcileFinish | ReconcileFail
)


def apply_call(
    tx: Transaction,
    payload: object,
    *,
    claim: Claim,
    reconcile_id: str,
    uid: str,
    project_path: str | None,
    lease_ms: int,
) -> JsonValue | Conflict:
    """Apply one call in ``tx`` and return its JSON result (or the Conflict to refuse it)."""
    if isinstance(payload, EffectReserve):
        return _effect_json(
            calls.reserve_effect(
                tx,
                claim,
                key=payload.key,
                kind=payload.kind,
                request=payload.request,
                lease_ms=lease_ms,
            )
        )
    if isinstance(payload, EffectBegin):
        return _effect_json(calls.begin_effect(tx, claim, payload.effect_id, lease_ms=lease_ms))
    if isinstance(payload, EffectSettle):
        return _effect_json(
            calls.settle_effect(
                tx,
                claim,
                payload.effect_id,
                attempt=payload.attempt,
                outcome=payload.outcome,
                result=payload.result,
                error=payload.error,
                lease_ms=lease_ms,
            )
        )
    if isinstance(payload, WorkflowEnsure):
        return _ensure_workflow(tx, payload, claim, uid, project_path, lease_ms)
    if isinstance(payload, ReconcileFinish):
        outcome = rc.finish_reconcile(
            tx, claim, reconcile_id, _result_in(payload), lease_ms=lease_ms
        )
        return {"outcome": outcome.value}
    if not isinstance(payload, ReconcileFail):
        raise TypeError(f"not a resource-runner call payload: {type(payload).__name__}")
    due = rc.fail_reconcile(tx, claim, reconcile_id, payload.error, lease_ms=lease_ms)
    return {"outcome": ReconcileOutcome.FAILED.value, "dueAt": due}


def conflict_code(operation: str) -> str:
    """The error code of a refused call."""
    return "workflowRequestConflict" if operation == "workflow.ensure" else "resourceConflict"


def _ensure_workflow(
    tx: Transaction,
    payload: WorkflowEnsure,
    claim: Claim,
    uid: str,
    project_path: str | None,
    lease_ms: int,
) -> JsonValue | Conflict:
    """Find the child run; ``{"found": false}`` asks the child to resolve the workflow and call
    again with ``resolved``, which creates the run (queued) with its request row."""
    fingerprint = canonical.digest({"workflow": payload.workflow, "input": payload.input})
    found = calls.find_child_run(
        tx,
        claim,
        uid=uid,
        request_key=payload.request_key,
        fingerprint=fingerprint,
        lease_ms=lease_ms,
    )
    if found is None and payload.resolved is None:
        return {"found": False}
    if found is None:
        assert payload.resolved is not None
        start = RunStartPayload(
            workflow=payload.workflow, project_path=project_path, input=payload.input
        )
        found = calls.create_child_run(
            tx,
            claim,
            uid=uid,
            request_key=payload.request_key,
            workflow_ref=payload.workflow,
            fingerprint=fingerprint,
            new_run=new_run_from(start, payload.resolved.model_dump(by_alias=True)),
            lease_ms=lease_ms,
        )
    if isinstance(found, Conflict):
        return found
    return {
        "found": True,
        "runId": found.run_id,
        "state": found.state,
        "output": found.output,
        "error": found.error,
    }


def _effect_json(state: calls.EffectState | Conflict) -> JsonValue | Conflict:
    if isinstance(state, Conflict):
        return state
    return {
        "effectId": state.effect_id,
        "key": state.key,
        "kind": state.kind,
        "status": state.status.value,
        "attempt": state.attempt,
        "result": state.result,
        "error": state.error,
    }


def _result_in(payload: ReconcileFinish) -> rc.ResultIn:
    patch = payload.patch
    return rc.ResultIn(
        kind=ReconcileOutcome(payload.kind),
        after_ms=payload.after_ms,
        patch=StatusPatch(
            status=patch.status,
            conditions=None
            if patch.conditions is None
            else [c.model_dump(by_alias=True, exclude_none=True) for c in patch.conditions],
            finalizers=patch.finalizers,
        ),
    )
