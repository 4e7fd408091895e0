"""Payloads of the live-settings operations ``run.settings`` and ``run.changeSettings``.

::

    run.settings        {mountPath?}  (runId in the envelope)    RunSettings
    run.changeSettings  {patch, mountPath?, expectedChange?, coordinatorEpoch?}
                        (runId in the envelope)                  SettingsChangeReceipt

``mountPath`` names the workflow whose settings are meant: ``""`` (the default) is the run's
own workflow, ``a/b`` the workflow mounted as ``b`` inside the mount ``a``; its newest entry is
changed. A change is made as a person (``human``), or, with the run's origin session's active
``coordinatorEpoch``, as that session. ``expectedChange`` refuses the change
(``settingsConflict``) unless the settings are still at that change number. A value is shown
only as far as the actor's read grants reach.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from piwf.protocol.payloads import WireModel

#: Operations one patch may hold (:data:`piwf.json_patch.MAX_OPERATIONS`).
MAX_PATCH_OPERATIONS = 256


class RunSettingsPayload(WireModel):
    """Read the settings of the workflow at ``mountPath`` in the run of the envelope."""

    mount_path: str = Field(default="", max_length=1024)


class RunChangeSettingsPayload(WireModel):
    """Apply an RFC 6902 JSON Patch to the newest settings of the workflow at ``mountPath``."""

    patch: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_PATCH_OPERATIONS)
    mount_path: str = Field(default="", max_length=1024)
    expected_change: int | None = Field(default=None, ge=0)
    coordinator_epoch: str | None = Field(default=None, min_length=1, max_length=256)


class SettingsChangeInfo(WireModel):
    """One accepted change: its number, who made it (``human`` or ``session``), when, and
    the patch."""

    change_number: int
    actor: str
    accepted_at: int
    patch: list[Any]


class SettingsScopeInfo(WireModel):
    """One settings scope of a run: the workflow at ``mountPath`` on its ``invocation``-th
    entry, at ``changeNumber`` (0: the initial value), its readable ``value``, what it is for
    and who may change what (``paths``)."""

    mount_path: str
    invocation: int
    change_number: int
    value: Any = None
    description: str | None = None
    paths: list[dict[str, Any]] = Field(default_factory=list)
    changes: list[SettingsChangeInfo] = Field(default_factory=list)


class RunSettings(WireModel):
    """Every settings scope of a run (for ``run.settings``, the scopes of ``mountPath``)."""

    run_id: str
    #: The mount's newest entries (at most 10, as many as fit in 512 KiB, at least one), oldest
    #: first: a loop that enters a mount adds one on every entry.
    scopes: list[SettingsScopeInfo]
    #: How many entries the mount has had (None from an older server).
    scope_count: int | None = None


class SettingsChangeReceipt(WireModel):
    """The change made (or, for a repeated request, the one made the first time)."""

    run_id: str
    scope: SettingsScopeInfo
