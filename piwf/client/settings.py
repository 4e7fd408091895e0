"""``Client`` methods that read and change a run's live settings (``run.settings``,
``run.changeSettings``; :mod:`piwf.workflow.settings`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from piwf import canonical
from piwf.client.arguments import build_payload
from piwf.client.calls import ClientCalls

if TYPE_CHECKING:
    from piwf.protocol.settings_payloads import RunSettings, SettingsScopeInfo

_Receipt = TypeVar("_Receipt", bound=BaseModel)


class SettingsMethods(ClientCalls):
    """Live settings of a run."""

    def run_settings(self, run_id: str, *, mount_path: str = "") -> RunSettings:
        """The run's settings scopes of the workflow at ``mount_path`` (``""``: the run's own
        workflow): each value as far as a person may read it, the grants and recent changes.
        A workflow without settings is a :class:`~piwf.errors.NotFoundError`
        (``settingsRefused``)."""
        from piwf.protocol.settings_payloads import RunSettings, RunSettingsPayload

        payload = build_payload(RunSettingsPayload, mount_path=mount_path)
        return self._call("run.settings", payload, RunSettings, run_id=run_id)

    def change_settings(
        self,
        run_id: str,
        patch: Sequence[dict[str, Any]],
        *,
        mount_path: str = "",
        expected_change: int | None = None,
        coordinator_epoch: str | None = None,
        idempotency_key: str | None = None,
    ) -> SettingsScopeInfo:
        """Apply the RFC 6902 ``patch`` to the run's newest settings of the workflow at
        ``mount_path`` and return the scope after the change (``run.changeSettings``).

        Made as a person, or as the run's origin session with its ``coordinator_epoch``.
        Only attempts that start afterwards see it. A patch that is malformed, names a path
        the workflow does not grant, or that its ``parse`` refuses is a
        :class:`~piwf.errors.RejectedError` (``settingsRefused``) and changes nothing; with
        ``expected_change`` a newer change is a :class:`~piwf.errors.ConflictError`
        (``settingsConflict``). A value in ``patch`` that is no canonical JSON (a set, bytes,
        NaN, nesting deeper than 128) is a :class:`~piwf.errors.CanonicalJsonError` before
        anything is sent."""
        from piwf.protocol.settings_payloads import (
            RunChangeSettingsPayload,
            SettingsChangeReceipt,
        )

        if isinstance(patch, (list, tuple)):
            # The values are sent as given, never through pydantic's JSON conversion, which
            # would quietly turn a set, bytes or a date into something else.
            canonical.check_value(list(patch), "patch")
        payload = build_payload(
            RunChangeSettingsPayload,
            # A tuple is a list on the wire; anything else is refused by the model, named.
            patch=list(patch) if isinstance(patch, (list, tuple)) else patch,
            mount_path=mount_path,
            expected_change=expected_change,
            coordinator_epoch=coordinator_epoch,
        )
        receipt = self._call(
            "run.changeSettings",
            payload,
            SettingsChangeReceipt,
            run_id=run_id,
            idempotency_key=idempotency_key,
        )
        return receipt.scope
