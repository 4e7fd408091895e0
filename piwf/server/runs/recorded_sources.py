"""A run's source identity in its three forms, converted in one place.

::

    resolver answer / launch envelope      run_sources rows              wire (run.get,
    SourceIdentity.to_json()          ⇄    runs.SourceFile, one per  ─▶  workflow.show)
    {"root": source, "mounted": [...]}     mount ('' is the root)        RunSource

A row keeps how the mount named its workflow (``path``, ``name``, ``builtin``, ``definition``
and the text), the file that resolved to (``source_ref``: an absolute path or
``builtin:NAME``), its SHA-256 (``source_revision``) and, for a built-in, the piwf version that
shipped it. A runner gets the recorded identity back and loads exactly those files.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

from piwf.protocol.payloads import RunSource
from piwf.state import Transaction
from piwf.state.enums import SourceType
from piwf.state.execution import runs as run_store
from piwf.workflow.sources import MountSource, SourceDrift, SourceIdentity, verify_sources


def rows_of(identity: SourceIdentity) -> list[run_store.SourceFile]:
    """The ``run_sources`` rows of ``identity``, root first."""
    return [
        run_store.SourceFile(
            mount_path=entry.mount_path,
            source_type=SourceType.BUILTIN if entry.builtin else SourceType.FILE,
            source_ref=entry.location,
            source_revision=entry.sha256,
            reference_kind=entry.kind,
            reference=entry.reference,
            piwf_version=entry.piwf_version,
        )
        for entry in identity.entries()
    ]


def identity_of(rows: Iterable[run_store.SourceFile]) -> SourceIdentity:
    """The recorded identity of a run's rows; raises ``ValueError`` without a root row."""
    return SourceIdentity.of(
        MountSource(
            row.mount_path,
            row.reference_kind,
            row.reference,
            row.source_ref,
            row.source_revision,
            row.piwf_version,
        )
        for row in rows
    )


def source_info(row: run_store.SourceFile) -> RunSource:
    """The wire form of one row."""
    return RunSource(
        mount_path=row.mount_path,
        reference_kind=row.reference_kind.value,
        reference=row.reference,
        source_type=row.source_type.value,
        source_ref=row.source_ref,
        source_revision=row.source_revision,
        piwf_version=row.piwf_version,
    )


def workflow_source(tx: Transaction, run_id: str) -> dict[str, Any]:
    """The run's recorded source identity as a child verifies it before importing anything
    and loads it without discovering anything again (a runner's launch, a validation):
    ``{"root": source, "mounted": [...]}``, (:func:`identity_of`)."""
    return identity_of(run_store.list_run_sources(tx, run_id)).to_json()


def drift_of(tx: Transaction, run_id: str) -> SourceDrift:
    """How the run's recorded files differ from the files on disk now (falsy: they match).

    Reads and hashes each recorded file (never imports it). Raises ``ValueError`` for a run
    with no recorded root.
    """
    return verify_sources(identity_of(run_store.list_run_sources(tx, run_id)))


def start_command(workflow_ref: str) -> str:
    """The command that starts a new run of the current sources of ``workflow_ref`` (the
    reference as the run was started with: a path, a name or ``builtin:NAME``)."""
    return f"piwf run start {shlex.quote(workflow_ref)}"
