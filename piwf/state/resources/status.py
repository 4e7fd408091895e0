"""The status part of a reconcile result: patch, condition merge, finalizer list.

Applied only by :func:`piwf.state.resources.reconciles.finish_reconcile`, inside its one
transaction, after the resource-version check; the rows are written by
:mod:`piwf.state.resources.managed`, which owns them. A patch that changes nothing writes
nothing, so an idle periodic reconcile does not move the resource version.
"""

from __future__ import annotations

from dataclasses import dataclass

from piwf.canonical import JsonValue
from piwf.state import blobs
from piwf.state.database import Transaction
from piwf.state.leases import Claim
from piwf.state.records import Actor, record_change
from piwf.state.resources.managed import (
    ResourceRow,
    read_finalizers,
    replace_finalizers,
    write_status,
)
from piwf.state.resources.runners import RunnerRow


@dataclass(frozen=True)
class StatusPatch:
    """The part of a result that writes the resource; ``None`` leaves a part unchanged.

    ``conditions`` are ``{type, status, reason, message?}`` objects merged by type; the store
    adds ``observedGeneration`` and keeps ``lastTransitionTime`` while a status is unchanged.
    """

    status: dict[str, JsonValue] | None = None
    conditions: list[dict[str, JsonValue]] | None = None
    finalizers: list[str] | None = None


def write_status_patch(
    tx: Transaction,
    row: ResourceRow,
    runner: RunnerRow,
    patch: StatusPatch,
    actor: Actor,
    claim: Claim,
) -> None:
    """Apply ``patch`` to ``row`` as the result of ``runner``'s reconcile (one change, event
    ``reconcile.status``); the observed generation becomes the one the reconcile read."""
    status_hash = row.status_hash if patch.status is None else blobs.put_json(tx, patch.status)
    old_conditions = blobs.read_json(tx, row.conditions_hash)
    conditions = old_conditions if isinstance(old_conditions, list) else []
    if patch.conditions is not None:
        conditions = merge_conditions(
            conditions, patch.conditions, runner.resource_generation, tx.now
        )
    conditions_hash = blobs.put_json(tx, conditions)
    old_finalizers = read_finalizers(tx, row.uid)
    finalizers = (
        old_finalizers if patch.finalizers is None else list(dict.fromkeys(patch.finalizers))
    )
    observed = max(row.observed_generation, runner.resource_generation)
    if (status_hash, conditions_hash, finalizers, observed) == (
        row.status_hash,
        row.conditions_hash,
        old_finalizers,
        row.observed_generation,
    ):
        return
    record_change(
        tx,
        row.resource_id,
        row.resource_version,
        "reconcile.status",
        actor,
        claim=claim,
        payload={"reconcileId": runner.reconcile_id, "observedGeneration": observed},
    )
    write_status(
        tx, row.uid, status_hash=status_hash, conditions_hash=conditions_hash, observed=observed
    )
    if finalizers != old_finalizers:
        replace_finalizers(tx, row.uid, finalizers)


def merge_conditions(
    old: list[JsonValue], patch: list[dict[str, JsonValue]], generation: int, now: int
) -> list[JsonValue]:
    """Merge ``patch`` into ``old`` by ``type`` (new types append). A condition whose status
    did not change keeps its ``lastTransitionTime``; every patched one gets ``generation``."""
    merged: dict[str, dict[str, JsonValue]] = {}
    for item in old:
        if isinstance(item, dict) and isinstance(item.get("type"), str):
            merged[str(item["type"])] = dict(item)
    for item in patch:
        kind = str(item["type"])
        previous = merged.get(kind)
        transition: JsonValue = now
        if previous is not None and previous.get("status") == item["status"]:
            transition = previous.get("lastTransitionTime", now)
        condition: dict[str, JsonValue] = {
            "type": kind,
            "status": item["status"],
            "reason": item["reason"],
            "observedGeneration": generation,
            "lastTransitionTime": transition,
        }
        if item.get("message") is not None:
            condition["message"] = item["message"]
        merged[kind] = condition
    return list(merged.values())
