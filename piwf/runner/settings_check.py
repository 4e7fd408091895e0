"""The resolver child's settings check: run a workflow's settings ``parse`` on a patched value.

The server applies a ``run.changeSettings`` patch itself (pure JSON) but never runs workflow
code, so a workflow whose settings declare ``parse`` has the patched value checked here, from
the run's recorded sources only (every hash verified before anything is imported)::

    request  {"kind": "settingsCheck", "workflowSource": {root, mounted},
              "definitionDigest": hex, "mountPath": str, "value": JSON}
    reply    {"ok": true, "value": JSON}          the value as the scope stores it
          or {"ok": false, "error": {"code": "settingsRefused" | "sourceChanged" | ...,
                                     "message": str}}
"""

from __future__ import annotations

from piwf.canonical import JsonValue
from piwf.errors import SettingsChangeError, WorkflowLoadError


def check_settings(request: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """Check ``request["value"]`` with the settings ``parse`` of the workflow at
    ``mountPath``; raise a :class:`~piwf.errors.PiwfError` when it is refused."""
    from piwf.runner.verified_sources import SourcesChanged, load_verified_workflow
    from piwf.workflow.settings import SettingsError

    source, digest, mount_path = (
        request.get("workflowSource"),
        request.get("definitionDigest"),
        request.get("mountPath"),
    )
    if not isinstance(source, dict) or not isinstance(digest, str):
        raise ValueError("a settings check needs the run's workflowSource and definitionDigest")
    if not isinstance(mount_path, str):
        raise ValueError("a settings check needs a mountPath")
    loaded = load_verified_workflow(source, digest)
    if isinstance(loaded, SourcesChanged):
        raise WorkflowLoadError(
            f"the workflow source is not what the run started with ({loaded.drift.describe()});"
            " its settings cannot be checked, so none can be changed: restore the file"
        )
    compiled = loaded.compiled
    if mount_path and mount_path not in compiled.mounts:
        raise SettingsChangeError(f"the run's workflow has no mount {mount_path!r}")
    declared = compiled.scope_workflow(mount_path or None).settings
    if declared is None:
        raise SettingsChangeError(f"the workflow at {mount_path or 'the root'!r} has no settings")
    try:
        return {"ok": True, "value": declared.normalise(request.get("value"))}
    except SettingsError as error:
        raise SettingsChangeError(str(error)) from error
