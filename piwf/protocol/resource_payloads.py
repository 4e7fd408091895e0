"""Payloads and receipts of the ``resource.*`` operations of ``piwf.client.v1``::

    operation           payload                                   receipt
    resource.apply      {manager, key, spec, projectPath?}        {"resource", "outcome"}
    resource.get        {manager, key}                            ResourceDetail
    resource.list       {manager?, limit?}                        {"resources": [ResourceInfo]}
    resource.delete     {manager, key}                            {"resource", "deleted"}
    resource.reconcile  {manager, key}                            {"resource", "outcome"}

``resource.apply`` and ``resource.delete`` honour the envelope's ``expectedRevision`` as the
expected resource version. ``ResourceInfo`` never carries the spec or status (``resource.get``
does), so a list of at most 100 stays within one frame; a large spec or status travels by
content reference (``specRef``, ``statusRef``; see :mod:`piwf.protocol.payloads`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from piwf import canonical
from piwf.protocol.client_v1 import MANAGER_NAME_PATTERN, OPAQUE_ID_PATTERN
from piwf.protocol.payloads import ContentRef, EffectInfo, PathText, WireModel
from piwf.resource.definition import MAX_SPEC_BYTES

_MANAGER = Field(min_length=1, max_length=64, pattern=MANAGER_NAME_PATTERN)
_KEY = Field(min_length=1, max_length=256, pattern=OPAQUE_ID_PATTERN)


def oversized_spec(spec: dict[str, Any]) -> str | None:
    """Why ``spec`` is refused for its size (``resourceSpec``), or None when it fits.

    Both ends check it: the client before it sends (a spec far over the limit would otherwise
    meet the 1 MiB frame limit first, with another error), the server before it resolves.
    """
    size = len(canonical.encode(spec))
    if size <= MAX_SPEC_BYTES:
        return None
    return (
        f"the spec is {size} bytes of JSON, over the limit of {MAX_SPEC_BYTES};"
        " keep large data outside the spec (in a file the spec names, for example)"
    )


class ResourceApplyPayload(WireModel):
    """Create a resource or change its spec (a JSON object)."""

    manager: str = _MANAGER
    key: str = _KEY
    spec: dict[str, Any]
    project_path: PathText | None = None


class ResourceRefPayload(WireModel):
    """Name one resource."""

    manager: str = _MANAGER
    key: str = _KEY


class ResourceListPayload(WireModel):
    """List resources, optionally of one manager."""

    manager: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=MANAGER_NAME_PATTERN
    )
    limit: int = Field(default=100, ge=1, le=100)


class ResourceQueueInfo(WireModel):
    """Why and when the resource is due for a reconcile."""

    available_at: int
    reason: str
    consecutive_errors: int
    last_error: str | None = None


class ResourceInfo(WireModel):
    """A resource as lists show it (no spec, no status)."""

    uid: str
    manager: str
    key: str
    resource_version: int
    generation: int
    observed_generation: int
    state: Literal["settled", "queued", "reconciling", "backoff", "deleting"]
    ready: str | None = None
    deletion_timestamp: int | None = None
    finalizers: list[str]
    queue: ResourceQueueInfo | None = None
    created_at: int
    updated_at: int


class ConditionInfo(WireModel):
    """One stored condition."""

    type: str
    status: str
    reason: str
    message: str | None = None
    observed_generation: int
    last_transition_time: int


class ChildRunInfo(WireModel):
    """A child run a reconcile requested."""

    request_key: str
    run_id: str
    state: str


class ReconcileInfo(WireModel):
    """One reconcile (resource-runner process) of the resource."""

    reconcile_id: str
    status: str
    result: str | None = None
    resource_generation: int
    started_at: int
    finished_at: int | None = None


class ResourceDetail(WireModel):
    """One resource in full; a large spec or status comes as ``spec_ref`` / ``status_ref``
    instead (the client resolves it). ``effects`` are the newest 50 and every unsettled one,
    ``workflows`` the newest 50 (both oldest first), ``reconciles`` the newest 10 (newest
    first); each ``*_count`` says how many there are in all (None from a server that did not
    count them)."""

    resource: ResourceInfo
    spec: Any = None
    spec_ref: ContentRef | None = None
    status: Any = None
    status_ref: ContentRef | None = None
    conditions: list[ConditionInfo]
    source_path: str
    source_digest: str
    effects: list[EffectInfo]
    workflows: list[ChildRunInfo]
    reconciles: list[ReconcileInfo]
    effect_count: int | None = None
    workflow_count: int | None = None
    reconcile_count: int | None = None


class ResourceReceipt(WireModel):
    """The receipt of ``resource.apply`` and ``resource.reconcile``."""

    resource: ResourceInfo
    outcome: Literal["created", "updated", "unchanged", "enqueued"]


class ResourceDeleteReceipt(WireModel):
    """The receipt of ``resource.delete``: ``deleted`` once it is gone, else it is deleting."""

    resource: ResourceInfo
    deleted: bool


class ResourceList(WireModel):
    """The receipt of ``resource.list``."""

    resources: list[ResourceInfo]
