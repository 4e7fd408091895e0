"""Resolving a resource manager for ``resource.apply``, inside the source-resolver child.

::

    request  {"kind": "resourceManager", "manager": str, "projectPath": str | null,
              "stateHome": str, "spec": {...}}
    reply    {"ok": true, "manager": str, "sourcePath": str, "sourceDigest": hex,
              "timeoutMs": int, "initialStatus": {...}}
          or {"ok": false, "error": {"code", "message"}}

The manager file is discovered and imported here, never in the server; ``initial_status(spec)``
runs here too, so a manager can refuse a spec by raising. The server then re-checks that the
discovery rule still names the same file with the same SHA-256 before it commits.
"""

from __future__ import annotations

from pathlib import Path

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import CanonicalJsonError
from piwf.resource.definition import MAX_STATUS_BYTES
from piwf.resource.discovery import find_and_load
from piwf.resource.errors import ResourceManagerLoadError, ResourceSpecError
from piwf.workflow.sources import line_in_file


def resolve_resource_manager(request: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """Load the named manager and compute the initial status of the spec; raise a
    :class:`~piwf.resource.errors.ResourceError` on failure (when manager code raised, that
    exception is its ``__cause__`` and the message names the line of the manager's file)."""
    name, project, home = (
        request.get("manager"),
        request.get("projectPath"),
        request.get("stateHome"),
    )
    if not isinstance(name, str) or not isinstance(home, str):
        raise ResourceManagerLoadError("resolver request needs a manager name and a state home")
    loaded = find_and_load(name, Path(project) if isinstance(project, str) else None, Path(home))
    try:
        status = loaded.definition.initial_status(request.get("spec"))
    except Exception as error:
        line = line_in_file(error, loaded.path)
        where = "" if line is None else f" at line {line} of {loaded.path.name}"
        raise ResourceSpecError(
            f"manager {name!r} refused the spec{where}: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(status, dict):
        raise ResourceSpecError(f"manager {name!r}: initial_status must return a JSON object")
    try:
        size = len(canonical.encode(status))
    except CanonicalJsonError as error:
        raise ResourceSpecError(f"manager {name!r}: initial status is not JSON: {error}") from None
    if size > MAX_STATUS_BYTES:
        raise ResourceSpecError(
            f"manager {name!r}: initial status exceeds {MAX_STATUS_BYTES} bytes"
        )
    return {
        "ok": True,
        "manager": name,
        "sourcePath": str(loaded.path),
        "sourceDigest": loaded.sha256,
        "timeoutMs": loaded.definition.timeout_ms,
        "initialStatus": status,
    }
