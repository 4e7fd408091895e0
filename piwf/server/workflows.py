"""``workflow.list`` and ``workflow.show``: what ``run.start NAME`` would find, and what it is.

``workflow.list`` reads directories only (no workflow code is imported anywhere): the discovery
order of :func:`piwf.workflow.sources.workflow_directories`, each file once under its name, an
earlier directory hiding a later one's file of the same name. ``workflow.show`` resolves the
workflow in a resolver child exactly as ``run.start`` does (same discovery, same cache of
unchanged sources) and describes the compiled definition; it records nothing.
"""

from __future__ import annotations

from typing import Any

from piwf.canonical import JsonValue
from piwf.errors import PiwfError
from piwf.protocol.client_v1 import Request
from piwf.protocol.workflow_payloads import (
    InputContract,
    WorkflowDescription,
    WorkflowDirectory,
    WorkflowEntry,
    WorkflowList,
    WorkflowListPayload,
    WorkflowNode,
    WorkflowShowPayload,
)
from piwf.server.context import ServerContext
from piwf.server.failures import answering, failure_response
from piwf.server.loop import Reply
from piwf.server.replies import error_response, ok, payload_of, project_of
from piwf.server.runs.handlers import resolver_error
from piwf.server.runs.recorded_sources import rows_of, source_info
from piwf.workflow.sources import SourceIdentity, discover_workflows, workflow_directories


class WorkflowHandlers:
    """The two workflow discovery operations."""

    def __init__(self, context: ServerContext) -> None:
        self.context = context

    def workflow_list(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, WorkflowListPayload)
        project = project_of(payload.project_path)
        found = discover_workflows(project, self.context.home)
        directories = workflow_directories(project, self.context.home)
        listing = WorkflowList(
            workflows=[
                WorkflowEntry(name=w.name, path=str(w.path), origin=w.origin.value) for w in found
            ],
            directories=[
                WorkflowDirectory(
                    origin=origin.value, directory=str(directory), exists=directory.is_dir()
                )
                for origin, directory in directories
            ],
        )
        reply(ok(request, listing))

    def workflow_show(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, WorkflowShowPayload)
        project_of(payload.project_path)  # refused before a child starts
        resolver_request: dict[str, JsonValue] = {
            "workflow": payload.workflow,
            "projectPath": payload.project_path,
            "stateHome": str(self.context.home),
        }

        def resolved(result: dict[str, JsonValue] | PiwfError) -> None:
            with answering(request, reply):
                if isinstance(result, PiwfError):  # the child died or overran: try again
                    reply(error_response(request, "unavailable", result.code, str(result)))
                elif result.get("ok") is not True:
                    error = resolver_error(result)
                    reply(error_response(request, "rejected", error.code, str(error)))
                else:
                    reply(ok(request, describe(result)))

        try:
            self.context.resolvers.resolve(resolver_request, resolved)
        except PiwfError as error:
            reply(failure_response(request, error))


def describe(result: dict[str, JsonValue]) -> WorkflowDescription:
    """The description of a resolver child's reply (its compiled snapshot and sources)."""
    snapshot = _mapping(result.get("snapshot"))
    tree = _mapping(snapshot.get("workflow"))
    sources = _mapping(result.get("sources"))
    root = _mapping(sources.get("root"))
    nodes = _mapping(tree.get("nodes"))
    contract = _mapping(result.get("input")) or {"kind": "any"}
    edges = [_mapping(edge) for edge in _sequence(tree.get("edges"))]
    title = result.get("title")
    return WorkflowDescription(
        name=str(result.get("workflowName")),
        workflow_ref=str(result.get("workflowRef")),
        source=str(root.get("location")),
        definition_digest=str(result.get("definitionDigest")),
        title=title if isinstance(title, str) else None,
        start_at=str(tree.get("startAt")),
        max_steps=int(str(tree.get("maxSteps"))),
        nodes=[
            WorkflowNode(
                node_id=node_id,
                kind=str(_mapping(nodes[node_id]).get("kind")),
                structure={k: v for k, v in _mapping(nodes[node_id]).items() if k != "kind"},
            )
            for node_id in _reading_order(str(tree.get("startAt")), list(nodes), edges)
        ],
        edges=edges,
        exits=_mapping(tree.get("exits")),
        includes=_mapping(tree.get("includes")),
        input=InputContract.model_validate(contract),
        sources=[source_info(row) for row in rows_of(SourceIdentity.from_json(sources))],
    )


def _reading_order(start: str, node_ids: list[str], edges: list[dict[str, Any]]) -> list[str]:
    """The node ids from the start along the edges (breadth first), then any not reached."""
    targets: dict[str, list[str]] = {}
    for edge in edges:
        switch = _mapping(edge.get("switch"))
        cases = _mapping(switch.get("cases"))
        found = [str(edge["to"])] if "to" in edge else [str(t) for t in cases.values()]
        targets.setdefault(str(edge.get("from")).split(".")[0], []).extend(found)
    order: list[str] = []
    queue = [start]
    while queue:
        node = queue.pop(0).split(".")[0]
        if node in order:
            continue
        order.append(node)
        queue.extend(targets.get(node, []))
    known = set(node_ids)
    return [n for n in order if n in known] + [n for n in node_ids if n not in order]


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _sequence(value: object) -> list[Any]:
    return list(value) if isinstance(value, list) else []
