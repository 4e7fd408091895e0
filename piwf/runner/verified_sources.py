"""Loading a run's workflow only as it was recorded: what every child that runs workflow code
does first (the workflow runner and the validation child).

::

    recorded identity (root + every mount: reference, file, sha256)
      ── verify every hash before anything of the workflow is imported ──▶ changed: refuse
      ── load and compile, each include by name from the record ──▶ loaded sources and
         definition digest equal the recorded ones?
                              no: refuse (a changed include, another definition)

A refusal names the differing files; changed code never runs. Nothing is discovered again: a
file added since the run started that would now shadow a name changes nothing for this run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from piwf.workflow.sources import LoadedWorkflow, SourceDrift


@dataclass(frozen=True)
class SourcesChanged:
    """The recorded sources differ from the files now on disk: which changed, which are
    missing."""

    drift: SourceDrift


def load_verified_workflow(
    workflow_source: dict[str, Any], definition_digest: str
) -> LoadedWorkflow | SourcesChanged:
    """Load the workflow of ``workflow_source`` if, and only if, it is still what was recorded.

    Raises what loading raises (a :class:`~piwf.errors.PiwfError` or an error of the workflow's
    own import) once the hashes matched.
    """
    # Imported here so that a broken environment shows up as a crash of this child only.
    from piwf.workflow.sources import (
        SourceDrift,
        SourceIdentity,
        load_recorded_workflow,
        verify_sources,
    )

    identity = SourceIdentity.from_json(workflow_source)
    drift = verify_sources(identity)
    if drift:
        return SourcesChanged(drift)
    loaded = load_recorded_workflow(identity)
    if loaded.sources != identity or loaded.compiled.digest != definition_digest:
        differing = {s.location for s in (loaded.sources.root, *loaded.sources.mounted)} ^ {
            s.location for s in (identity.root, *identity.mounted)
        }
        return SourcesChanged(SourceDrift(tuple(sorted(differing)) or (identity.root.location,)))
    return loaded
