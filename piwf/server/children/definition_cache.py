"""Resolved workflow definitions kept by source identity, so an unchanged source forks no
resolver child.

A resolver child imports the workflow and answers its definition snapshot, digest and source
identity (:mod:`piwf.runner.resolver`). The answer depends only on the source files it names
(the root and every mounted file, each by SHA-256), on which file each name found in
discovery, and on this piwf (the cache lives in one server process, so its version is fixed).
A later ``run.start`` of the same reference, project and state home (the key: what discovery
depends on) reuses the answer when, checked in the server without importing anything:

- the reference still finds the same root file, and every mount included by name still
  discovers its recorded file (discovery order: a newly added file that now shadows one, say
  a project ``.piwf/workflows/child.py`` hiding the home's, is a miss), and
- every recorded source file still has its recorded SHA-256.

Anything else is a miss and a fresh child resolves. A stale entry cannot run the wrong code:
the runner verifies the recorded sources before it imports them and the definition digest
after, and parks the run ``sourceChanged`` otherwise. Only successful workflow resolutions are
kept (never a failure, never a resource manager's), at most :data:`CAPACITY`, least recently
used out first.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from pathlib import Path

from piwf.canonical import JsonValue
from piwf.errors import WorkflowLoadError
from piwf.workflow.sources import (
    SourceIdentity,
    find_workflow,
    names_still_resolve,
    source_location,
    verify_sources,
)

#: Resolutions kept at most.
CAPACITY = 128

_Key = tuple[str, str | None, str | None]


class DefinitionCache:
    """The resolutions of unchanged sources (module docstring); used from the server loop."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[_Key, dict[str, JsonValue]] = OrderedDict()
        #: Starts answered from the cache, and lookups that had to resolve (for status/bench).
        self.hits = 0
        self.misses = 0

    def lookup(self, request: dict[str, JsonValue]) -> dict[str, JsonValue] | None:
        """Return a copy of the kept resolution for ``request`` when its sources are unchanged,
        else None (and forget a stale one)."""
        key = _key(request)
        if key is None:
            return None
        kept = self._entries.get(key)
        if kept is None or not _unchanged(key, kept):
            self._entries.pop(key, None)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return copy.deepcopy(kept)

    def remember(self, request: dict[str, JsonValue], reply: dict[str, JsonValue]) -> None:
        """Keep a successful resolution of ``request``."""
        key = _key(request)
        if key is None or reply.get("ok") is not True:
            return
        self._entries[key] = copy.deepcopy(reply)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def _key(request: dict[str, JsonValue]) -> _Key | None:
    """The cache key of a workflow resolution request; None for anything else."""
    workflow, project, home = (
        request.get("workflow"),
        request.get("projectPath"),
        request.get("stateHome"),
    )
    if "kind" in request or not isinstance(workflow, str):
        return None
    if project is not None and not isinstance(project, str):
        return None
    if home is not None and not isinstance(home, str):
        return None
    return workflow, project, home


def _unchanged(key: _Key, reply: dict[str, JsonValue]) -> bool:
    """Whether the reference finds the same root, every name the same file, and every
    recorded file is unchanged."""
    workflow, project_path, home_path = key
    project = Path(project_path) if project_path is not None else None
    home = Path(home_path) if home_path is not None else None
    try:
        identity = SourceIdentity.from_json(reply.get("sources"))
        found = find_workflow(workflow, project, home)
        if source_location(found.path) != identity.root.location:
            return False
        if not names_still_resolve(identity, project, home):
            return False
    except (ValueError, WorkflowLoadError, OSError):
        return False
    return not verify_sources(identity)
