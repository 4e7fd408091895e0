"""The resource-manager authoring API (Kubernetes-style controllers).

A resource manager keeps each managed resource converging to its spec. Put one manager per file
in ``<project>/.piwf/resource_managers/<name>.py`` or ``$PIWF_HOME/resource_managers/<name>.py``::

    from piwf.resource import condition_true, define_resource_manager, settled

    def reconcile(ctx, resource):
        ctx.effects.ensure(
            key=f"write:{resource.generation}",
            kind="file.write",
            request={"path": resource.spec["path"]},
            observe=lambda signal: "applied" if exists() else "not_applied",
            apply=lambda signal: write() or "applied",
        )
        return settled(conditions=[condition_true("Ready", "Written")])

    manager = define_resource_manager(
        name="greeting", initial_status=lambda spec: {}, reconcile=reconcile
    )

This package imports no storage and no server code; manager files are imported only by child
processes (the source resolver and the resource runner). docs/RESOURCE_MANAGERS.md has the
whole contract.
"""

from piwf.resource.context import (
    ApplyOutcome,
    EffectObservation,
    EffectOutcome,
    EffectRecord,
    Effects,
    ManagedResource,
    ReconcileContext,
    ReconcilePort,
    WorkflowRef,
    Workflows,
    WorkflowState,
)
from piwf.resource.definition import (
    Condition,
    ConditionStatus,
    ReconcileResult,
    ResourceManagerDefinition,
    ResultKind,
    condition_false,
    condition_true,
    condition_unknown,
    define_resource_manager,
    requeue,
    requeue_after,
    settled,
)
from piwf.resource.errors import (
    EffectIndeterminateError,
    ResourceError,
    WorkflowRequestConflictError,
)

__all__ = [
    "ApplyOutcome",
    "Condition",
    "ConditionStatus",
    "EffectIndeterminateError",
    "EffectObservation",
    "EffectOutcome",
    "EffectRecord",
    "Effects",
    "ManagedResource",
    "ReconcileContext",
    "ReconcilePort",
    "ReconcileResult",
    "ResourceError",
    "ResourceManagerDefinition",
    "ResultKind",
    "WorkflowRef",
    "WorkflowRequestConflictError",
    "WorkflowState",
    "Workflows",
    "condition_false",
    "condition_true",
    "condition_unknown",
    "define_resource_manager",
    "requeue",
    "requeue_after",
    "settled",
]
