"""Handlers of the ``resource.*`` operations: apply, get, list, delete, reconcile.

``resource.apply`` first has a source-resolver child load the manager and compute the initial
status (the server never imports manager code), then re-checks that the discovery rule still
names the same file with the same SHA-256, and only then commits the resource and its receipt in
one transaction. Delete and reconcile commit with their receipt and wake the scheduler.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from piwf.canonical import JsonValue
from piwf.errors import PiwfError
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.protocol.client_v1 import Request, Response
from piwf.protocol.resource_payloads import (
    ChildRunInfo,
    ConditionInfo,
    ReconcileInfo,
    ResourceApplyPayload,
    ResourceDeleteReceipt,
    ResourceDetail,
    ResourceInfo,
    ResourceList,
    ResourceListPayload,
    ResourceQueueInfo,
    ResourceReceipt,
    ResourceRefPayload,
    oversized_spec,
)
from piwf.resource.discovery import discovered_path, file_sha256
from piwf.resource.errors import (
    ResourceConflictError,
    ResourceDeletingError,
    ResourceError,
    ResourceManagerLoadError,
    ResourceNotFoundError,
    ResourceSpecError,
)
from piwf.server.commands import CommandResult
from piwf.server.content_offer import ContentOffer
from piwf.server.context import ServerContext
from piwf.server.loop import Reply
from piwf.server.replies import (
    effect_info,
    error_response,
    ok,
    payload_of,
    project_of,
    unknown_resource,
)
from piwf.state import Transaction
from piwf.state import effects as fx
from piwf.state.enums import ActorType
from piwf.state.records import Actor
from piwf.state.resources import calls as calls
from piwf.state.resources import managed as store
from piwf.state.resources import runners as runners

#: ``resource.get`` shows the newest this many effects (and every unsettled one) and child runs
#: (one frame holds them), with how many there are; only those are read.
DETAIL_ITEMS = 50

#: Resolver error codes and the classes that carry them back to the client.
_RESOLVER_ERRORS: dict[str, type[ResourceError]] = {
    ResourceManagerLoadError.code: ResourceManagerLoadError,
    ResourceSpecError.code: ResourceSpecError,
}


class ResourceHandlers:
    """The managed-resource operations."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context

    def apply(self, request: Request, reply: Reply) -> None:
        """Resolve the manager in a child, re-check its source, then commit the resource."""
        payload = payload_of(request, ResourceApplyPayload)
        project_of(payload.project_path)
        oversized = oversized_spec(payload.spec)
        if oversized is not None:
            reply(error_response(request, "rejected", ResourceSpecError.code, oversized))
            return
        earlier = self.context.commands.lookup(request)
        if earlier is not None:
            reply(earlier)
            return
        resolver_request: dict[str, JsonValue] = {
            "kind": "resourceManager",
            "manager": payload.manager,
            "projectPath": payload.project_path,
            "stateHome": str(self.context.home),
            "spec": payload.spec,
        }
        self.context.resolvers.resolve(
            resolver_request, lambda result: self._resolved(request, reply, payload, result)
        )

    def _resolved(
        self,
        request: Request,
        reply: Reply,
        payload: ResourceApplyPayload,
        result: dict[str, JsonValue] | PiwfError,
    ) -> None:
        if isinstance(result, PiwfError):
            # The resolver died or overran: nothing was decided, so no receipt is stored and a
            # retry under the same key resolves again.
            reply(error_response(request, "unavailable", result.code, str(result)))
            return
        if result.get("ok") is not True:
            reply(self.context.commands.execute(request, _refusal(_resolver_error(result))))
            return
        try:
            resolved = self._checked(payload, result)
        except ResourceError as error:
            reply(self.context.commands.execute(request, _refusal(error)))
            return

        def change(tx: Transaction) -> CommandResult:
            existing = store.get_resource(tx, payload.manager, payload.key)
            if existing is not None and existing.deletion_requested_at is not None:
                deleting = ResourceDeletingError(
                    f"resource {payload.manager}/{payload.key} is being deleted: it is removed"
                    " once its manager drops its finalizers (piwf resource get"
                    f" {payload.manager} {shlex.quote(payload.key)} shows how far it is);"
                    " apply it again after that"
                )
                return CommandResult.failed("conflict", deleting)
            applied = store.apply_resource(
                tx,
                manager=payload.manager,
                key=payload.key,
                spec=payload.spec,
                resolved=resolved,
                project_path=payload.project_path,
                actor=Actor(ActorType.CLIENT),
                expected_version=request.expected_revision,
            )
            if isinstance(applied, Conflict):
                return CommandResult.failed("conflict", ResourceConflictError(applied.evidence))
            row = applied.value
            outcome: Literal["created", "updated", "unchanged"] = "unchanged"
            if isinstance(applied, Applied):
                outcome = "created" if row.resource_version == 1 else "updated"
            receipt = ResourceReceipt(resource=resource_info(tx, row), outcome=outcome)
            return CommandResult.accepted(receipt.to_wire(), revision=row.resource_version)

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()

    def _checked(
        self, payload: ResourceApplyPayload, result: dict[str, JsonValue]
    ) -> store.ResolvedManager:
        """The resolver's answer, after proving the discovery rule still names the same file
        with the same bytes (the manager may have changed while it was resolved)."""
        project = None if payload.project_path is None else Path(payload.project_path)
        expected = discovered_path(payload.manager, project, self.context.home)
        source_path, digest = result.get("sourcePath"), result.get("sourceDigest")
        status, timeout_ms = result.get("initialStatus"), result.get("timeoutMs")
        if (
            source_path != str(expected.resolve())
            or not isinstance(digest, str)
            or file_sha256(expected) != digest
        ):
            raise ResourceManagerLoadError(
                f"resource manager {payload.manager!r} changed while it was being loaded;"
                " apply again"
            )
        if not isinstance(status, dict) or not isinstance(timeout_ms, int):
            raise ResourceManagerLoadError("the resolver answered without an initial status")
        return store.ResolvedManager(str(source_path), digest, timeout_ms, status)

    def get(self, request: Request, reply: Reply) -> None:
        """One resource in full: spec, status, conditions, effects, child runs, reconciles."""
        payload = payload_of(request, ResourceRefPayload)
        with self.context.db.read() as tx:
            row = store.get_resource(tx, payload.manager, payload.key)
            detail = None if row is None else resource_detail(tx, row)
        if detail is None:
            reply(_not_found(request, payload, self.context.home))
            return
        reply(ok(request, detail, revision=detail.resource.resource_version))

    def list(self, request: Request, reply: Reply) -> None:
        """The resources ordered by manager and key."""
        payload = payload_of(request, ResourceListPayload)
        with self.context.db.read() as tx:
            rows = store.list_resources(tx, manager=payload.manager, limit=payload.limit)
            infos = [resource_info(tx, row) for row in rows]
        reply(ok(request, ResourceList(resources=infos)))

    def delete(self, request: Request, reply: Reply) -> None:
        """Delete now, or mark deleting so the manager can run its finalizers."""
        payload = payload_of(request, ResourceRefPayload)

        def change(tx: Transaction) -> CommandResult:
            row = store.get_resource(tx, payload.manager, payload.key)
            if row is None:
                return CommandResult.failed("notFound", _missing(payload, self.context.home))
            before = resource_info(tx, row)
            result = store.request_deletion(
                tx, row, Actor(ActorType.CLIENT), expected_version=request.expected_revision
            )
            if isinstance(result, Conflict):
                return CommandResult.failed("conflict", ResourceConflictError(result.evidence))
            if isinstance(result, Applied) and result.value is None:
                receipt = ResourceDeleteReceipt(resource=before, deleted=True)
                return CommandResult.accepted(receipt.to_wire())
            assert isinstance(result, (Applied, Adopted))
            current = result.value
            assert current is not None
            receipt = ResourceDeleteReceipt(resource=resource_info(tx, current), deleted=False)
            return CommandResult.accepted(receipt.to_wire(), revision=current.resource_version)

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()

    def reconcile(self, request: Request, reply: Reply) -> None:
        """Enqueue the resource for a reconcile now."""
        payload = payload_of(request, ResourceRefPayload)

        def change(tx: Transaction) -> CommandResult:
            row = store.get_resource(tx, payload.manager, payload.key)
            if row is None:
                return CommandResult.failed("notFound", _missing(payload, self.context.home))
            store.request_reconcile(tx, row)
            receipt = ResourceReceipt(resource=resource_info(tx, row), outcome="enqueued")
            return CommandResult.accepted(receipt.to_wire(), revision=row.resource_version)

        reply(self.context.commands.execute(request, change))
        self.context.wake_scheduler()


def resource_info(tx: Transaction, row: store.ResourceRow) -> ResourceInfo:
    """The list form of a resource (no spec, no status)."""
    view = store.read_view(tx, row)
    queue = view.queue
    return ResourceInfo(
        uid=row.uid,
        manager=row.manager,
        key=row.key,
        resource_version=row.resource_version,
        generation=row.generation,
        observed_generation=row.observed_generation,
        state=view.state,  # type: ignore[arg-type]
        ready=view.ready,
        deletion_timestamp=row.deletion_requested_at,
        finalizers=view.finalizers,
        queue=None
        if queue is None
        else ResourceQueueInfo(
            available_at=queue.available_at,
            reason=queue.reason.value,
            consecutive_errors=queue.consecutive_errors,
            last_error=None if queue.last_error is None else queue.last_error[:1000],
        ),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def resource_detail(tx: Transaction, row: store.ResourceRow) -> ResourceDetail:
    """The full form of a resource; a large spec or status goes by content reference."""
    view = store.read_view(tx, row)
    offer = ContentOffer(tx)
    spec = offer.json("resource", row.uid, row.spec_hash)
    status = offer.json("resource", row.uid, row.status_hash)
    return ResourceDetail(
        resource=resource_info(tx, row),
        spec=spec.value,
        spec_ref=spec.ref,
        status=status.value,
        status_ref=status.ref,
        conditions=[ConditionInfo.model_validate(condition) for condition in view.conditions],
        source_path=row.source_path,
        source_digest=row.source_digest,
        effects=[
            effect_info(effect)
            for effect in fx.list_shown_effects(tx, row.resource_id, DETAIL_ITEMS)
        ],
        effect_count=fx.count_effects(tx, row.resource_id),
        workflows=[
            ChildRunInfo(request_key=child.request_key, run_id=child.run_id, state=child.state)
            for child in calls.list_newest_child_runs(tx, row.uid, DETAIL_ITEMS)
        ],
        workflow_count=calls.count_child_runs(tx, row.uid),
        reconciles=[
            ReconcileInfo(
                reconcile_id=runner.reconcile_id,
                status=runner.status.value,
                result=None if runner.result is None else runner.result.value,
                resource_generation=runner.resource_generation,
                started_at=runner.started_at,
                finished_at=runner.finished_at,
            )
            for runner in runners.list_runners(tx, row.resource_id)
        ],
        reconcile_count=runners.count_runners(tx, row.resource_id),
    )


def _resolver_error(result: dict[str, JsonValue]) -> PiwfError:
    error = result.get("error")
    code, message = "resourceManagerLoad", "the resource manager could not be loaded"
    if isinstance(error, dict):
        code = str(error.get("code") or code)
        message = str(error.get("message") or message)
    return _RESOLVER_ERRORS.get(code, ResourceManagerLoadError)(message)


def _missing(payload: ResourceRefPayload, home: Path) -> ResourceNotFoundError:
    return ResourceNotFoundError(unknown_resource(payload.manager, payload.key, home))


def _refusal(error: PiwfError) -> Callable[[Transaction], CommandResult]:
    """A command change that only stores ``error`` as a rejected receipt."""
    return lambda _tx: CommandResult.failed("rejected", error)


def _not_found(request: Request, payload: ResourceRefPayload, home: Path) -> Response:
    error = _missing(payload, home)
    return error_response(request, "notFound", error.code, str(error))
