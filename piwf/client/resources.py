"""The managed-resource methods of :class:`piwf.client.Client` (``resource.*`` operations).

Kept in their own module so that ``client.py`` stays one screenful per concern; ``Client``
inherits them. Every durable call gets one idempotency key (reused across its automatic
retries), exactly like the run operations.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from piwf import canonical
from piwf.client.arguments import build_payload, project_argument, whole_number_argument
from piwf.client.calls import ClientCalls
from piwf.client.content import resolve_references
from piwf.errors import RejectedError
from piwf.protocol import InvalidMessageError, Response

if TYPE_CHECKING:
    from piwf.protocol.resource_payloads import (
        ResourceDeleteReceipt,
        ResourceDetail,
        ResourceInfo,
        ResourceReceipt,
    )

_R = TypeVar("_R", bound=BaseModel)


class ResourceMethods(ClientCalls):
    """``Client`` methods for managed resources (see docs/RESOURCE_MANAGERS.md)."""

    def apply_resource(
        self,
        manager: str,
        key: str,
        spec: dict[str, Any],
        *,
        project: str | os.PathLike[str] | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> ResourceReceipt:
        """Create the resource ``manager``/``key`` or change its spec (``resource.apply``).

        ``spec`` is a JSON object; ``project`` (default: the current directory) is where the
        manager is discovered (``.piwf/resource_managers/``, then ``$PIWF_HOME``). With
        ``expected_version`` the apply only happens if the resource is at that version (0 for
        a new one); otherwise :class:`~piwf.errors.ConflictError`. The receipt's ``outcome`` is
        ``created``, ``updated`` (new generation) or ``unchanged``. Raises
        :class:`~piwf.errors.RejectedError` for an unknown manager or a refused spec (a spec
        over 256 KiB of canonical JSON is refused, ``resourceSpec``, before anything is sent), and
        :class:`~piwf.errors.CanonicalJsonError` before anything is sent when ``spec`` breaks
        the canonical JSON rules (an integer beyond ±(2**53 - 1), NaN, a lone surrogate).
        """
        from piwf.protocol.resource_payloads import (
            ResourceApplyPayload,
            ResourceReceipt,
            oversized_spec,
        )

        canonical.check_value(spec, "spec")
        oversized = oversized_spec(spec)
        if oversized is not None:  # refused as the server would, before the frame limit is met
            raise RejectedError(oversized, error_code="resourceSpec")
        payload = build_payload(
            ResourceApplyPayload,
            manager=manager,
            key=key,
            spec=spec,
            project_path=str(project_argument(project)),
        )
        wire = payload.to_wire()
        wire["spec"] = spec  # sent as given: canonical JSON checks it, pydantic would convert
        response = self.request(
            "resource.apply",
            wire,
            expected_revision=_version_argument(expected_version),
            idempotency_key=idempotency_key,
        )
        return _parsed(ResourceReceipt, response)

    def get_resource(self, manager: str, key: str) -> ResourceDetail:
        """One resource in full (``resource.get``); NotFoundError when there is none.

        A spec or status the server sent by content reference is read and verified first.
        """
        from piwf.protocol.resource_payloads import ResourceDetail, ResourceRefPayload

        payload = build_payload(ResourceRefPayload, manager=manager, key=key)
        detail = _parsed(ResourceDetail, self.request("resource.get", payload.to_wire()))
        return resolve_references(detail, self.read_content)

    def list_resources(self, manager: str | None = None, limit: int = 100) -> list[ResourceInfo]:
        """The resources ordered by manager and key (``resource.list``)."""
        from piwf.protocol.resource_payloads import ResourceList, ResourceListPayload

        payload = build_payload(ResourceListPayload, manager=manager, limit=limit)
        return _parsed(ResourceList, self.request("resource.list", payload.to_wire())).resources

    def delete_resource(
        self,
        manager: str,
        key: str,
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> ResourceDeleteReceipt:
        """Delete a resource (``resource.delete``): at once when it has no finalizer, else it
        is marked deleting and its manager finalizes it (``deleted`` is then False)."""
        from piwf.protocol.resource_payloads import ResourceDeleteReceipt, ResourceRefPayload

        payload = build_payload(ResourceRefPayload, manager=manager, key=key)
        response = self.request(
            "resource.delete",
            payload.to_wire(),
            expected_revision=_version_argument(expected_version),
            idempotency_key=idempotency_key,
        )
        return _parsed(ResourceDeleteReceipt, response)

    def reconcile_resource(
        self, manager: str, key: str, *, idempotency_key: str | None = None
    ) -> ResourceReceipt:
        """Enqueue a resource for a reconcile now (``resource.reconcile``)."""
        from piwf.protocol.resource_payloads import ResourceReceipt, ResourceRefPayload

        payload = build_payload(ResourceRefPayload, manager=manager, key=key)
        response = self.request(
            "resource.reconcile", payload.to_wire(), idempotency_key=idempotency_key
        )
        return _parsed(ResourceReceipt, response)


def _version_argument(value: object) -> int | None:
    """An ``expected_version`` as the request's expected revision, checked before sending."""
    rule = f"a resource version (a whole number from 0 to {canonical.MAX_SAFE_INTEGER}), or None"
    return whole_number_argument("expected_version", value, rule, most=canonical.MAX_SAFE_INTEGER)


def _parsed(model: type[_R], response: Response) -> _R:
    try:
        return model.model_validate(response.receipt or {})
    except ValidationError:
        raise InvalidMessageError(
            "receipt", "invalidValue", f"the server sent an invalid {model.__name__}"
        ) from None
