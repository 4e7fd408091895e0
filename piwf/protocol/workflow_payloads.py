"""Payloads of the workflow discovery operations ``workflow.list`` and ``workflow.show``.

``workflow.list`` says what ``run.start NAME`` would find, in the order it looks (the project's
``.piwf/workflows/``, ``$PIWF_HOME/workflows/``, the built-ins), without loading any workflow
code. ``workflow.show`` loads one workflow in a resolver child, exactly as ``run.start`` does,
and describes it: its nodes, edges, exits, mounts and input contract. Neither changes anything.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from piwf.protocol.payloads import PathText, RunSource, WireModel, without_nul

WorkflowOrigin = Literal["project", "home", "builtin", "path"]

#: The most bytes of an input model's JSON schema ``workflow.show`` carries.
MAX_INPUT_SCHEMA_BYTES = 64 * 1024


class WorkflowListPayload(WireModel):
    """Where to look: ``projectPath`` (absolute) adds the project's own workflows."""

    project_path: str | None = Field(default=None, max_length=4096)


class WorkflowEntry(WireModel):
    """One workflow ``run.start`` finds by ``name`` (the file's stem)."""

    name: str
    path: str
    origin: WorkflowOrigin


class WorkflowDirectory(WireModel):
    """One directory of the discovery order, and whether it exists."""

    origin: WorkflowOrigin
    directory: str
    exists: bool


class WorkflowList(WireModel):
    """Every discoverable workflow by name (an earlier directory hides a later one's file of
    the same name), and the directories searched, in order."""

    workflows: list[WorkflowEntry]
    directories: list[WorkflowDirectory]


class WorkflowShowPayload(WireModel):
    """A workflow name (discovered as ``run.start`` does) or a path to its file."""

    workflow: PathText
    project_path: Annotated[str, Field(max_length=4096), AfterValidator(without_nul)] | None = None


class InputContract(WireModel):
    """What the workflow accepts as input.

    ``any``: any JSON value; ``model``: a pydantic model parses it (``model`` names it,
    ``jsonSchema`` is its JSON schema, left out past :data:`MAX_INPUT_SCHEMA_BYTES`);
    ``parser``: a callable parses it (``parser`` names it).
    """

    kind: Literal["any", "model", "parser"]
    model: str | None = None
    parser: str | None = None
    json_schema: dict[str, Any] | None = None


class WorkflowNode(WireModel):
    """One node: its id, its kind and the rest of its declared structure."""

    node_id: str
    kind: str
    structure: dict[str, Any]


class WorkflowDescription(WireModel):
    """One workflow as ``run.start`` would run it (the definition the resolver compiled)."""

    name: str
    workflow_ref: str
    source: str
    definition_digest: str
    title: str | None = None
    start_at: str
    max_steps: int
    nodes: list[WorkflowNode]
    edges: list[dict[str, Any]]
    exits: dict[str, Any]
    includes: dict[str, Any]
    input: InputContract
    #: What ``run.start`` would record: the root and every mount (how each named its workflow,
    #: the file that resolved to and its SHA-256), as ``run.get`` shows them.
    sources: list[RunSource]
