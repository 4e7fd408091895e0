"""``define_workflow``: the authoring entry point and its eager validation.

A definition is checked completely when it is created, so a broken workflow file fails when it
is loaded and never in the middle of a run. Each :class:`WorkflowDefinitionError` names the
workflow, the node or edge, and the rule:

- names and node ids match ``[A-Za-z_][A-Za-z0-9_-]*``; reserved workflow names are refused;
- nodes and mounts share one namespace; ``start_at`` names one of them;
- every node has at most one outgoing edge, every target exists, every node is reachable;
- from every node some path leads to an end (a node without an outgoing edge, or a mount): a
  loop needs a way out, or a run that enters it could only fail at ``max_steps``;
- a mount is left only through ``<mount>.<exit>`` edges naming a declared exit;
- a switch on ``$output.choice`` after a ``human_decision``, or on ``$output.<field>`` after a
  ``decision``, names every declared choice and nothing else;
- an exit leaves from a node (or a nested mount exit) that has no outgoing edge.

Included workflows referenced by text (a path, a name or ``builtin:NAME``) are checked by the
compiler once the loader has resolved them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

from piwf.canonical import JsonValue
from piwf.errors import WorkflowDefinitionError
from piwf.workflow.decisions import DecisionNode, missing_cases
from piwf.workflow.edges import Edge, SwitchEdge, parse_edge
from piwf.workflow.nodes import NODE_TYPES, HumanDecisionNode, Node
from piwf.workflow.settings import WorkflowSettings

if TYPE_CHECKING:
    from piwf.workflow.context import NodeContext

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
MAX_NAME_CHARS = 128
RESERVED_NAMES = frozenset({"answer", "cancel", "list", "pause", "resume", "status"})
DEFAULT_MAX_STEPS = 100
MAX_STEPS_LIMIT = 100_000
#: ``include("builtin:NAME")`` names a built-in; a recorded built-in is ``builtin:NAME`` too.
BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class Include:
    """A mount of another workflow.

    ``workflow`` is a definition object or text the loader resolves
    (:mod:`piwf.workflow.sources`): a path relative to the including file (ending in ``.py``
    or containing ``/``), ``builtin:NAME``, or a bare name discovered as ``run start NAME``
    discovers it (the run's project, then ``$PIWF_HOME``, then the built-ins). The run records
    how each mount was referenced and the file (and hash) it resolved to. ``input(ctx)``
    computes the child input from the parent context when the mount is entered (default: the
    parent's input).
    """

    workflow: WorkflowDefinition | str
    input: Callable[[NodeContext], Any] | None = None


def include(
    workflow: WorkflowDefinition | str, *, input: Callable[[NodeContext], Any] | None = None
) -> Include:
    """Return a mount of ``workflow``; enter it by its mount name, leave by ``<mount>.<exit>``.

    Raises :class:`WorkflowDefinitionError` for anything but a definition, a path, a name or
    ``builtin:NAME``; whether the file exists is the loader's question."""
    if not isinstance(workflow, (WorkflowDefinition, str)) or workflow == "":
        raise WorkflowDefinitionError(
            "include(): workflow must be a definition, a path such as './child.py', a name "
            "such as 'child' or a built-in such as 'builtin:noop'"
        )
    if isinstance(workflow, str) and workflow.startswith(BUILTIN_PREFIX):
        name = workflow[len(BUILTIN_PREFIX) :]
        if not NAME_PATTERN.match(name):
            raise WorkflowDefinitionError(
                f"include({workflow!r}): a built-in is named as 'builtin:NAME', NAME matching "
                f"{NAME_PATTERN.pattern}"
            )
    if _not_callable(input):
        raise WorkflowDefinitionError("include(): input must be callable")
    return Include(workflow=workflow, input=input)


@dataclass(frozen=True)
class Exit:
    """A named successful way out of a workflow when it is mounted.

    ``source`` is a local node id (or ``<mount>.<exit>``); ``validate(output)`` may raise to
    refuse the value or return a normalised one (``None`` keeps the value).
    """

    source: str
    validate: Callable[[JsonValue], Any] | None = None


@dataclass(frozen=True, eq=False)
class WorkflowDefinition:
    """A validated workflow definition; create it with :func:`define_workflow`.

    Definitions compare by identity. ``source_file`` is the absolute path of the module that
    called :func:`define_workflow`, or ``None`` when it was not created from a file.
    """

    name: str
    start_at: str
    nodes: Mapping[str, Node]
    includes: Mapping[str, Include]
    edges: tuple[Edge, ...]
    exits: Mapping[str, Exit]
    input: Callable[[Any], Any] | type[Any] | None
    max_steps: int
    title: str | Callable[[Any], str] | None
    source_file: str | None
    outgoing: Mapping[str, Edge] = field(repr=False)
    #: Live settings (:func:`~piwf.workflow.settings.workflow_settings`), or ``None``.
    settings: WorkflowSettings | None = None

    def describe(self) -> str:
        """Return ``workflow 'name'`` plus its file when known, for error messages."""
        where = f" ({self.source_file})" if self.source_file else ""
        return f"workflow {self.name!r}{where}"


def define_workflow(
    *,
    name: str,
    start_at: str,
    nodes: Mapping[str, Node | Include],
    edges: Sequence[Mapping[str, Any]],
    includes: Mapping[str, Include] | None = None,
    exits: Mapping[str, Mapping[str, Any]] | None = None,
    input: Callable[[Any], Any] | type[Any] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    title: str | Callable[[Any], str] | None = None,
    settings: WorkflowSettings | None = None,
) -> WorkflowDefinition:
    """Validate and return a workflow definition.

    ``nodes`` maps node ids to node objects (an :func:`include` there is a mount, like one in
    ``includes``). ``edges`` are ``{"from", "to"}`` or ``{"from", "switch": {"on", "cases"}}``
    mappings. ``exits`` maps exit names to ``{"from": node, "validate": callable}``. ``input``
    parses the raw JSON input (a pydantic model class works). ``max_steps`` bounds node visits
    per run. ``settings`` (:func:`~piwf.workflow.settings.workflow_settings`) declares live
    settings. Raises :class:`WorkflowDefinitionError` naming the broken rule.
    """
    caller = sys._getframe(1).f_globals.get("__file__")
    source_file = str(Path(caller).resolve()) if isinstance(caller, str) else None
    label = f"workflow {name!r}" if isinstance(name, str) else "workflow"
    checker = _Checker(label)
    checker.check_name(name)
    node_map, mounts = checker.split_nodes(nodes, includes)
    checker.check_ids(node_map, mounts)
    if not isinstance(start_at, str) or (start_at not in node_map and start_at not in mounts):
        checker.fail(f"start_at {start_at!r} is not a node or mount of this workflow")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        checker.fail("max_steps must be an integer")
    if not 1 <= max_steps <= MAX_STEPS_LIMIT:
        checker.fail(f"max_steps must lie in 1..{MAX_STEPS_LIMIT}, got {max_steps}")
    if input is not None and not callable(input):
        checker.fail("input must be a parser callable or a pydantic model class")
    if not isinstance(title, str) and _not_callable(title):
        checker.fail("title must be a string or a callable of the input")
    if settings is not None and not isinstance(settings, WorkflowSettings):
        checker.fail("settings must be created with workflow_settings()")
    parsed_edges, outgoing = checker.check_edges(edges, node_map, mounts)
    exit_map = checker.check_exits(exits or {}, node_map, mounts, outgoing)
    checker.check_reachable(start_at, node_map, mounts, outgoing)
    checker.check_loops_end(node_map, mounts, outgoing)
    return WorkflowDefinition(
        name=name,
        start_at=start_at,
        nodes=MappingProxyType(node_map),
        includes=MappingProxyType(mounts),
        edges=parsed_edges,
        exits=MappingProxyType(exit_map),
        input=input,
        max_steps=max_steps,
        title=title,
        source_file=source_file,
        outgoing=MappingProxyType(outgoing),
        settings=settings,
    )


def _not_callable(value: object) -> bool:
    """Return whether ``value`` is set but not callable (checks untyped callers)."""
    return value is not None and not callable(value)


class _Checker:
    """Collects the validation rules of one definition; every failure raises at once."""

    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, message: str) -> NoReturn:
        raise WorkflowDefinitionError(f"{self.label}: {message}")

    def check_name(self, name: object) -> None:
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            self.fail(f"name must match {NAME_PATTERN.pattern}")
        assert isinstance(name, str)
        if len(name) > MAX_NAME_CHARS:
            self.fail(f"name is longer than {MAX_NAME_CHARS} characters")
        if name in RESERVED_NAMES:
            self.fail(f"name {name!r} is reserved ({', '.join(sorted(RESERVED_NAMES))})")

    def split_nodes(
        self, nodes: object, includes: object
    ) -> tuple[dict[str, Node], dict[str, Include]]:
        if not isinstance(nodes, Mapping) or not nodes:
            self.fail("nodes must be a non-empty mapping of node ids to nodes")
        assert isinstance(nodes, Mapping)
        if includes is not None and not isinstance(includes, Mapping):
            self.fail("includes must be a mapping of mount names to include(...)")
        node_map: dict[str, Node] = {}
        mounts: dict[str, Include] = {}
        for node_id, node in nodes.items():
            if isinstance(node, Include):
                mounts[node_id] = node
            elif isinstance(node, NODE_TYPES):
                node_map[node_id] = node  # type: ignore[assignment]
            else:
                hint = (
                    "; wrap a plain function in compute(...), or action(...) if it has side effects"
                )
                self.fail(
                    f"node {node_id!r} must be created with compute(), action(), shell(), "
                    f"notify(), checkpoint(), human_decision(), agent(), sleep(), wait_until() "
                    f"or include(); got {type(node).__name__}" + (hint if callable(node) else "")
                )
        extra: Mapping[str, object] = includes if isinstance(includes, Mapping) else {}
        for mount, value in extra.items():
            if not isinstance(value, Include):
                self.fail(f"mount {mount!r} must be created with include()")
            if mount in mounts or mount in node_map:
                self.fail(f"mount {mount!r} is declared twice")
            mounts[mount] = value
        return node_map, mounts

    def check_ids(self, node_map: Mapping[str, Node], mounts: Mapping[str, Include]) -> None:
        for node_id in [*node_map, *mounts]:
            if not isinstance(node_id, str) or not NAME_PATTERN.match(node_id):
                self.fail(f"node id {node_id!r} must match {NAME_PATTERN.pattern}")
            if len(node_id) > MAX_NAME_CHARS:
                self.fail(f"node id {node_id!r} is longer than {MAX_NAME_CHARS} characters")

    def check_edges(
        self,
        edges: object,
        node_map: Mapping[str, Node],
        mounts: Mapping[str, Include],
    ) -> tuple[tuple[Edge, ...], dict[str, Edge]]:
        if not isinstance(edges, Sequence) or isinstance(edges, (str, bytes)):
            self.fail("edges must be a list of mappings")
        assert isinstance(edges, Sequence)
        parsed: list[Edge] = []
        outgoing: dict[str, Edge] = {}
        for index, raw in enumerate(edges):
            edge = parse_edge(raw, index)
            if isinstance(edge, str):
                self.fail(edge)
            assert not isinstance(edge, str)
            self.check_source(edge.source, node_map, mounts)
            if edge.source in outgoing:
                self.fail(
                    f"node {edge.source!r} has more than one outgoing edge; use one switch "
                    "edge to branch"
                )
            for target in edge.targets():
                if target not in node_map and target not in mounts:
                    self.fail(f"edge from {edge.source!r} targets unknown node {target!r}")
            if isinstance(edge, SwitchEdge):
                self.check_decision_cases(edge, node_map)
            outgoing[edge.source] = edge
            parsed.append(edge)
        return tuple(parsed), outgoing

    def check_source(
        self, source: str, node_map: Mapping[str, Node], mounts: Mapping[str, Include]
    ) -> None:
        if source in node_map:
            return
        if source in mounts:
            self.fail(
                f"edge from mount {source!r}: leave a mount through one of its exits, "
                f"as {source!r}.<exit>"
            )
        mount, dot, exit_name = source.partition(".")
        if not dot or mount not in mounts:
            self.fail(f"edge from unknown node {source!r}")
        child = mounts[mount].workflow
        if isinstance(child, WorkflowDefinition) and exit_name not in child.exits:
            declared = ", ".join(sorted(child.exits)) or "none"
            self.fail(
                f"edge from {source!r}: {child.describe()} has no exit {exit_name!r} "
                f"(exits: {declared})"
            )

    def check_decision_cases(self, edge: SwitchEdge, node_map: Mapping[str, Node]) -> None:
        node = node_map.get(edge.source)
        if isinstance(node, HumanDecisionNode):
            routed = ("choice",)
        elif isinstance(node, DecisionNode):
            routed = (node.output_field,)
        else:
            return
        if edge.on.outcome or edge.on.segments != routed:
            return
        problem = missing_cases(f"decision {edge.source!r}", node.choice_names, dict(edge.cases))
        if problem is not None:
            self.fail(problem)

    def check_exits(
        self,
        exits: object,
        node_map: Mapping[str, Node],
        mounts: Mapping[str, Include],
        outgoing: Mapping[str, Edge],
    ) -> dict[str, Exit]:
        if not isinstance(exits, Mapping):
            self.fail("exits must map exit names to {'from': node}")
        assert isinstance(exits, Mapping)
        result: dict[str, Exit] = {}
        sources: dict[str, str] = {}
        for exit_name, spec in exits.items():
            if not isinstance(exit_name, str) or not NAME_PATTERN.match(exit_name):
                self.fail(f"exit name {exit_name!r} must match {NAME_PATTERN.pattern}")
            if not isinstance(spec, Mapping) or not set(spec) <= {"from", "validate"}:
                self.fail(f"exit {exit_name!r} must be {{'from': node, 'validate': callable}}")
            source = spec.get("from")
            validate = spec.get("validate")
            if not isinstance(source, str):
                self.fail(f"exit {exit_name!r} needs a 'from' node id")
            if validate is not None and not callable(validate):
                self.fail(f"exit {exit_name!r}: validate must be callable")
            self.check_source(source, node_map, mounts)
            if source in outgoing:
                self.fail(
                    f"exit {exit_name!r} leaves from {source!r}, which also has an outgoing "
                    "edge; an exit node must end this workflow"
                )
            if source in sources:
                self.fail(f"exits {sources[source]!r} and {exit_name!r} both leave from {source!r}")
            sources[source] = exit_name
            result[exit_name] = Exit(source=source, validate=validate)
        return result

    def check_reachable(
        self,
        start_at: str,
        node_map: Mapping[str, Node],
        mounts: Mapping[str, Include],
        outgoing: Mapping[str, Edge],
    ) -> None:
        successors = _successors(node_map, mounts, outgoing)
        seen = _closure([start_at], successors)
        unreachable = [name for name in successors if name not in seen]
        if unreachable:
            self.fail(f"node(s) {', '.join(unreachable)} cannot be reached from {start_at!r}")

    def check_loops_end(
        self,
        node_map: Mapping[str, Node],
        mounts: Mapping[str, Include],
        outgoing: Mapping[str, Edge],
    ) -> None:
        """Refuse nodes from which no path of edges leads to an end: a run ends (completes)
        only at a node without an outgoing edge, so one that enters such a loop can only fail
        (max_steps, a routing error) or be cancelled. Every switch case counts as a path, so
        nothing a run could take is missed; a mount counts as an end (its workflow may be
        left through an exit with no edge here, and is checked on its own)."""
        successors = _successors(node_map, mounts, outgoing)
        predecessors: dict[str, list[str]] = {name: [] for name in successors}
        for source, targets in successors.items():
            for target in targets:
                predecessors[target].append(source)
        ends = [name for name, targets in successors.items() if not targets or name in mounts]
        ending = _closure(ends, predecessors)
        trapped = [name for name in successors if name not in ending]
        if not trapped:
            return
        # Each trapped node has a trapped successor, so some of them form a cycle: name it,
        # and the nodes that only lead into it apart.
        looping = [name for name in trapped if name in _closure(successors[name], successors)]
        leading = [name for name in trapped if name not in looping]
        into = f" ({', '.join(leading)} only lead(s) into it)" if leading else ""
        self.fail(
            f"node(s) {', '.join(looping)} loop with no way out{into}: no path from them"
            " reaches a node without an outgoing edge, so a run there could only fail at"
            " max_steps; give the loop an exit (a switch case to a node that ends the run)"
        )


def _successors(
    node_map: Mapping[str, Node], mounts: Mapping[str, Include], outgoing: Mapping[str, Edge]
) -> dict[str, list[str]]:
    """Each node's and mount's local targets (a mount's: those of its ``<mount>.<exit>``
    edges), in declaration order."""
    successors: dict[str, list[str]] = {name: [] for name in [*node_map, *mounts]}
    for source, edge in outgoing.items():
        owner = source if source in node_map else source.partition(".")[0]
        successors[owner].extend(edge.targets())
    return successors


def _closure(starts: Sequence[str], links: Mapping[str, Sequence[str]]) -> set[str]:
    """``starts`` and everything reachable from them through ``links``."""
    seen = set(starts)
    pending = list(starts)
    while pending:
        for target in links[pending.pop()]:
            if target not in seen:
                seen.add(target)
                pending.append(target)
    return seen
