"""Who may read and change which part of a workflow's live settings: pure checks over the
``settings`` structure of a definition snapshot (:meth:`~piwf.workflow.settings.
WorkflowSettings.structure`), shared by the server and the in-memory port.

A grant is ``{"path": pointer, "read": [actor kinds], "replace": [actor kinds]}``. An operation
of a patch that writes (every one but ``test``) needs a ``replace`` grant for the actor's kind
on a path containing each pointer it names (``path``, and ``from`` for ``move``/``copy``); a
``test`` needs a ``read`` grant. Without any grant nothing may be changed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from piwf.canonical import JsonValue
from piwf.json_patch import PatchOperation, parse_pointer, pointer_within


def scope_structure(snapshot: JsonValue, mount_path: str) -> Mapping[str, JsonValue] | None:
    """The settings structure of the workflow at ``mount_path`` (``""``: the root) in a
    definition snapshot, or ``None`` when that workflow declares no settings (or there is no
    such mount)."""
    tree = snapshot.get("workflow") if isinstance(snapshot, dict) else None
    for name in mount_path.split("/") if mount_path else ():
        includes = tree.get("includes") if isinstance(tree, dict) else None
        mount = includes.get(name) if isinstance(includes, dict) else None
        tree = mount.get("workflow") if isinstance(mount, dict) else None
    settings = tree.get("settings") if isinstance(tree, dict) else None
    return settings if isinstance(settings, dict) else None


def mount_paths(snapshot: JsonValue) -> list[str]:
    """Every mount path (``mount`` or ``mount/inner``) of a definition snapshot's workflow
    tree, in declaration order; empty for a workflow that mounts none."""
    found: list[str] = []

    def walk(tree: JsonValue, prefix: str) -> None:
        includes = tree.get("includes") if isinstance(tree, dict) else None
        for name, mount in includes.items() if isinstance(includes, dict) else ():
            found.append(prefix + name)
            walk(mount.get("workflow") if isinstance(mount, dict) else None, f"{prefix}{name}/")

    walk(snapshot.get("workflow") if isinstance(snapshot, dict) else None, "")
    return found


def _grants(
    structure: Mapping[str, JsonValue], actor: str, *, writes: bool
) -> list[tuple[str, ...]]:
    allowed: list[tuple[str, ...]] = []
    paths = structure.get("paths")
    for grant in paths if isinstance(paths, list) else ():
        if not isinstance(grant, dict) or not isinstance(grant.get("path"), str):
            continue
        actors = grant.get("replace") if writes else grant.get("read")
        if isinstance(actors, list) and actor in actors:
            allowed.append(parse_pointer(grant["path"]))
    return allowed


def patch_refusal(
    structure: Mapping[str, JsonValue], operations: Sequence[PatchOperation], actor: str
) -> str | None:
    """Why ``actor`` may not apply ``operations``, or ``None`` when every pointer is granted."""
    for index, operation in enumerate(operations):
        granted = _grants(structure, actor, writes=operation.writes)
        for pointer in operation.pointers():
            tokens = parse_pointer(pointer)
            if not any(pointer_within(tokens, prefix) for prefix in granted):
                need = "replace" if operation.writes else "read"
                return (
                    f"operation {index} ({operation.op}) names {pointer!r}, which the workflow"
                    f" does not let a {actor} {need} (it lies under no allow_path(..., {need}="
                    f"[{actor!r}]) grant)"
                )
    return None


def readable(structure: Mapping[str, JsonValue], value: JsonValue, actor: str) -> JsonValue:
    """The part of ``value`` that ``actor`` may read: everything under a ``read`` (or
    ``replace``) grant, in the shape of the document; ``None`` when nothing is granted."""
    prefixes = _grants(structure, actor, writes=False) + _grants(structure, actor, writes=True)
    if () in prefixes:
        return copy.deepcopy(value)
    shown: JsonValue = None
    for prefix in sorted(set(prefixes)):
        found, part = _lookup(value, prefix)
        if found:
            shown = _place(shown, prefix, copy.deepcopy(part))
    return shown


def _lookup(value: JsonValue, tokens: tuple[str, ...]) -> tuple[bool, JsonValue]:
    for token in tokens:
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return False, None
    return True, value


def _place(shown: JsonValue, tokens: tuple[str, ...], part: JsonValue) -> JsonValue:
    """Put ``part`` at ``tokens`` in ``shown`` (objects all the way: array items are shown as
    members named by their index)."""
    root: dict[str, JsonValue] = shown if isinstance(shown, dict) else {}
    node = root
    for token in tokens[:-1]:
        child = node.get(token)
        if not isinstance(child, dict):
            child = {}
            node[token] = child
        node = child
    node[tokens[-1]] = part
    return root
