"""Errors of the resource-manager feature, each with a stable wire code.

::

    PiwfError
    └── ResourceError                   resourceError
        ├── ResourceManagerDefinitionError  resourceManagerDefinition (an authoring rule broke)
        ├── ResourceManagerLoadError    resourceManagerLoad  (unknown manager, load failed)
        ├── ResourceSpecError           resourceSpec         (spec refused: shape, size, initial)
        ├── ResourceStatusError         resourceStatus       (a result's status patch refused)
        ├── ResourceNotFoundError       resourceNotFound
        ├── ResourceDeletingError       resourceDeleting     (deletion is in progress)
        ├── ResourceConflictError       resourceConflict     (expected version is stale)
        ├── EffectIndeterminateError    effectIndeterminate  (observe/apply could not tell)
        └── WorkflowRequestConflictError workflowRequestConflict (same key, other input)

Messages name managers, keys and rules, never spec or status contents.
"""

from __future__ import annotations

from piwf.errors import PiwfError


class ResourceError(PiwfError):
    """A problem with a resource manager or a managed resource."""

    code = "resourceError"


class ResourceManagerDefinitionError(ResourceError):
    """``define_resource_manager`` was called with arguments that break an authoring rule."""

    code = "resourceManagerDefinition"


class ResourceManagerLoadError(ResourceError):
    """A resource manager could not be found or loaded (unknown name, import failure)."""

    code = "resourceManagerLoad"


class ResourceSpecError(ResourceError):
    """A spec was refused: not a JSON object, too large, or refused by ``initial_status``."""

    code = "resourceSpec"


class ResourceStatusError(ResourceError):
    """A reconcile result carried a status patch that breaks the status rules."""

    code = "resourceStatus"


class ResourceNotFoundError(ResourceError):
    """No managed resource has this manager and key."""

    code = "resourceNotFound"


class ResourceDeletingError(ResourceError):
    """The resource is being deleted; its spec can no longer change."""

    code = "resourceDeleting"


class ResourceConflictError(ResourceError):
    """The resource is not at the version the caller expected (or a call contradicts its
    stored state); nothing was changed."""

    code = "resourceConflict"


class EffectIndeterminateError(ResourceError):
    """``observe`` or ``apply`` could not tell whether the effect happened.

    The effect is left ``ambiguous``; the next reconcile observes it again before it may apply.
    """

    code = "effectIndeterminate"


class WorkflowRequestConflictError(ResourceError):
    """``workflows.ensure`` named an existing request key with another workflow or input."""

    code = "workflowRequestConflict"
