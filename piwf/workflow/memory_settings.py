"""Live settings of an in-memory port: scopes, the copy each attempt starts with, and changes
applied from outside as the server applies ``run.changeSettings``
(:mod:`piwf.workflow.memory`, :mod:`piwf.workflow.settings`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from piwf.canonical import JsonValue
from piwf.json_patch import apply_patch, parse_patch
from piwf.settings_grants import patch_refusal
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.port import SettingsCopy, SettingsScope
from piwf.workflow.settings import SettingsError


@dataclass
class MemorySettingsScope:
    """One scope: its newest value, and every accepted change (``(actor, patch)``, oldest
    first: change N is ``changes[N - 1]``)."""

    value: JsonValue
    changes: list[tuple[str, JsonValue]] = field(default_factory=list)

    @property
    def copy(self) -> SettingsCopy:
        return SettingsCopy(len(self.changes), self.value)


class MemorySettings:
    """The settings helpers of :class:`~piwf.workflow.memory.MemoryPort` (a mixin)."""

    _lock: threading.RLock

    def __init__(self) -> None:
        #: Scopes by ``(run id, mount path, invocation)``.
        self.settings_scopes: dict[tuple[str, str, int], MemorySettingsScope] = {}

    def _settings_copy(self, run_id: str, scope: SettingsScope | None) -> SettingsCopy | None:
        """The copy a starting attempt gets (creating the scope with its initial value)."""
        if scope is None:
            return None
        key = (run_id, scope.mount_path, scope.invocation)
        found = self.settings_scopes.setdefault(key, MemorySettingsScope(scope.initial))
        return found.copy

    def _settings_newest(self, run_id: str, mount_path: str) -> SettingsCopy | None:
        """The newest copy of the latest invocation of ``mount_path``'s scope."""
        keys = [key for key in self.settings_scopes if key[:2] == (run_id, mount_path)]
        if not keys:
            return None
        return self.settings_scopes[max(keys, key=lambda key: key[2])].copy

    def change_settings(
        self,
        run_id: str,
        patch: JsonValue,
        *,
        workflow: CompiledWorkflow,
        mount_path: str = "",
        actor: str = "human",
    ) -> SettingsCopy:
        """Apply an RFC 6902 ``patch`` to the newest scope of ``mount_path`` as ``actor``
        would through the server; return the new copy. Raises ``ValueError`` (a
        :class:`~piwf.json_patch.JsonPatchError`, :class:`SettingsError`, or a refusal) and
        changes nothing when the patch is malformed, not granted or refused by ``parse``."""
        with self._lock:
            keys = [key for key in self.settings_scopes if key[:2] == (run_id, mount_path)]
            if not keys:
                raise ValueError(f"run {run_id} has no settings at {mount_path!r} yet")
            scope = self.settings_scopes[max(keys, key=lambda key: key[2])]
            declared = workflow.scope_workflow(mount_path or None).settings
            if declared is None:
                raise ValueError(f"the workflow at {mount_path!r} declares no settings")
            operations = parse_patch(patch)
            refusal = patch_refusal(declared.structure(), operations, actor)
            if refusal is not None:
                raise ValueError(refusal)
            try:
                value = declared.normalise(apply_patch(scope.value, operations))
            except SettingsError as error:
                raise ValueError(str(error)) from error
            scope.value = value
            scope.changes.append((actor, patch))
            return scope.copy
