"""The compiler: mount expansion, full node paths, the definition snapshot and its digest.

Compiling flattens a definition and every workflow it mounts into one graph keyed by full
paths. A node ``inspect`` of a workflow mounted as ``workspace`` inside a workflow mounted as
``docs`` has the path ``docs/workspace/inspect``; that path, not the local id, is the node's
durable identity (visits, effect keys, request ids).

Routing keeps the scope it was written in: an edge declared by a workflow is attached to the
compiled node it leaves from (for ``<mount>.<exit>`` that is the exit node deep inside the mount)
together with the depth of the declaring scope, so the engine knows which mounts a transition
leaves and which it enters.

The snapshot is structure only (ids, kinds, effect types and recovery, edges, switches, choices,
exits, mounts, ``max_steps``, static timeouts), never function code. Its canonical JSON gives the
definition digest; the same file yields the same digest in any interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import WorkflowDefinitionError
from piwf.workflow.definition import Include, WorkflowDefinition
from piwf.workflow.edges import Edge
from piwf.workflow.nodes import Node

SNAPSHOT_SCHEMA = "piwf.workflow-definition.v1"

#: Resolves a path include: ``(reference, including definition) -> mounted definition``.
IncludeResolver = Callable[[str, WorkflowDefinition], WorkflowDefinition]


@dataclass(frozen=True)
class Route:
    """The outgoing edge of a compiled node.

    ``targets`` maps each local target named by ``edge`` to the full path of the node that the
    transition enters. ``scope_depth`` is the number of mount levels of the scope that declared
    the edge: a transition leaves every mount of the source deeper than it and enters every
    mount of the target deeper than it.
    """

    edge: Edge
    targets: Mapping[str, str]
    scope_depth: int


@dataclass(frozen=True)
class CompiledNode:
    """One node of the flattened graph.

    ``scope`` lists the mount paths enclosing the node, outermost first; ``workflow`` is the
    definition that declares it; ``exits`` maps each mount this node is an exit of to the exit
    name; ``route`` is ``None`` when the node ends the run.
    """

    path: str
    node_id: str
    node: Node
    scope: tuple[str, ...]
    workflow: WorkflowDefinition
    route: Route | None
    exits: Mapping[str, str]


@dataclass(frozen=True)
class CompiledMount:
    """One mounted workflow: its full ``path``, local ``name`` and the definition it runs."""

    path: str
    name: str
    include: Include
    workflow: WorkflowDefinition


@dataclass(frozen=True)
class CompiledWorkflow:
    """A definition flattened through its mounts, with its snapshot and digest.

    ``definitions`` lists every distinct definition in the tree, root first; the loader uses
    it to record the source identity of every mounted file.
    """

    definition: WorkflowDefinition
    entry: str
    nodes: Mapping[str, CompiledNode]
    mounts: Mapping[str, CompiledMount]
    snapshot: JsonValue
    digest: str
    definitions: tuple[WorkflowDefinition, ...]

    def scope_workflow(self, mount_path: str | None) -> WorkflowDefinition:
        """Return the definition that runs at ``mount_path`` (``None`` for the root)."""
        return self.definition if mount_path is None else self.mounts[mount_path].workflow


def compile_workflow(
    definition: WorkflowDefinition, *, resolve: IncludeResolver | None = None
) -> CompiledWorkflow:
    """Flatten ``definition`` and everything it mounts; compute the snapshot and digest.

    Path includes need ``resolve`` (the loader provides one). Raises
    :class:`WorkflowDefinitionError` for include cycles, unresolvable includes and edges that
    name an exit the mounted workflow does not declare.
    """
    if not isinstance(definition, WorkflowDefinition):
        raise WorkflowDefinitionError(
            "compile_workflow() needs a definition from define_workflow()"
        )
    builder = _Builder(resolve)
    tree = builder.walk(definition, None, (), (definition,))
    snapshot: JsonValue = {"schema": SNAPSHOT_SCHEMA, "workflow": tree}
    entry = builder.entry_path(None, definition, definition.start_at)
    return CompiledWorkflow(
        definition=definition,
        entry=entry,
        nodes=MappingProxyType(builder.build_nodes()),
        mounts=MappingProxyType(builder.mounts),
        snapshot=snapshot,
        digest=canonical.digest_hex(snapshot),
        definitions=tuple(builder.definitions),
    )


def _edge_source(structure: Mapping[str, JsonValue]) -> str:
    return str(structure["from"])


def join_path(prefix: str | None, name: str) -> str:
    """Return the full path of ``name`` inside the mount at ``prefix``."""
    return f"{prefix}/{name}" if prefix else name


class _Builder:
    def __init__(self, resolve: IncludeResolver | None) -> None:
        self.resolve = resolve
        self.mounts: dict[str, CompiledMount] = {}
        self.declared: dict[str, tuple[str, Node, tuple[str, ...], WorkflowDefinition]] = {}
        self.routes: dict[str, Route] = {}
        self.exits: dict[str, dict[str, str]] = {}
        self.definitions: list[WorkflowDefinition] = []

    def walk(
        self,
        definition: WorkflowDefinition,
        prefix: str | None,
        scope: tuple[str, ...],
        stack: tuple[WorkflowDefinition, ...],
    ) -> dict[str, JsonValue]:
        if definition not in self.definitions:
            self.definitions.append(definition)
        includes: dict[str, JsonValue] = {}
        for name, mount in definition.includes.items():
            child = self.child(definition, name, mount)
            if child in stack:
                chain = " → ".join(item.describe() for item in (*stack, child))
                raise WorkflowDefinitionError(f"include cycle: {chain}")
            mount_path = join_path(prefix, name)
            self.mounts[mount_path] = CompiledMount(mount_path, name, mount, child)
            child_tree = self.walk(child, mount_path, (*scope, mount_path), (*stack, child))
            for exit_name, exit_spec in child.exits.items():
                exit_node = self.source_path(mount_path, child, exit_spec.source)
                self.exits.setdefault(exit_node, {})[mount_path] = exit_name
            includes[name] = {
                "input": "computed" if mount.input is not None else "parent",
                "workflow": child_tree,
            }
        for node_id, node in definition.nodes.items():
            self.declared[join_path(prefix, node_id)] = (node_id, node, scope, definition)
        for edge in definition.edges:
            source = self.source_path(prefix, definition, edge.source)
            targets = {
                target: self.entry_path(prefix, definition, target) for target in edge.targets()
            }
            self.routes[source] = Route(edge, MappingProxyType(targets), len(scope))
        edges = sorted((edge.structure() for edge in definition.edges), key=_edge_source)
        return {
            "name": definition.name,
            "startAt": definition.start_at,
            "maxSteps": definition.max_steps,
            "nodes": {node_id: node.structure() for node_id, node in definition.nodes.items()},
            "edges": list(edges),
            "exits": {
                name: {"from": spec.source, "validates": spec.validate is not None}
                for name, spec in definition.exits.items()
            },
            "includes": includes,
            **(
                {} if definition.settings is None else {"settings": definition.settings.structure()}
            ),
        }

    def child(self, parent: WorkflowDefinition, name: str, mount: Include) -> WorkflowDefinition:
        if isinstance(mount.workflow, WorkflowDefinition):
            return mount.workflow
        if self.resolve is None:
            raise WorkflowDefinitionError(
                f"{parent.describe()}: mount {name!r} refers to {mount.workflow!r}; load the "
                "workflow from its file so path includes can be resolved"
            )
        return self.resolve(mount.workflow, parent)

    def source_path(self, prefix: str | None, definition: WorkflowDefinition, source: str) -> str:
        """Return the full path of the node an edge or exit named ``source`` leaves from."""
        if source in definition.nodes:
            return join_path(prefix, source)
        mount_name, _, exit_name = source.partition(".")
        mount_path = join_path(prefix, mount_name)
        child = self.mounts[mount_path].workflow
        exit_spec = child.exits.get(exit_name)
        if exit_spec is None:
            declared = ", ".join(sorted(child.exits)) or "none"
            raise WorkflowDefinitionError(
                f"{definition.describe()}: {source!r} names exit {exit_name!r}, but "
                f"{child.describe()} declares exits: {declared}"
            )
        return self.source_path(mount_path, child, exit_spec.source)

    def entry_path(self, prefix: str | None, definition: WorkflowDefinition, target: str) -> str:
        """Return the full path of the node entered by a transition to local ``target``."""
        if target in definition.nodes:
            return join_path(prefix, target)
        mount_path = join_path(prefix, target)
        child = self.mounts[mount_path].workflow
        return self.entry_path(mount_path, child, child.start_at)

    def build_nodes(self) -> dict[str, CompiledNode]:
        return {
            path: CompiledNode(
                path=path,
                node_id=node_id,
                node=node,
                scope=scope,
                workflow=definition,
                route=self.routes.get(path),
                exits=MappingProxyType(self.exits.get(path, {})),
            )
            for path, (node_id, node, scope, definition) in sorted(self.declared.items())
        }
