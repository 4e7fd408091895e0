"""``control_loop``: a decision that either sends work round again or leaves, as plain edges.

A control loop is a decision node (``decide``) whose routes either continue the loop, starting
work that comes back to ``return_to``, or are terminal and leave it::

    loop = control_loop(
        decide="assess",
        return_to="assess",
        routes={
            "continue": {"to": "experiment", "returns": ["experiment"]},
            "plateau": {"to": "conclude", "terminal": True},
        },
    )

    setup ──▶ experiment ──▶ assess ── plateau ──▶ conclude    (terminal: leaves)
                  ▲            │
                  └─ continue ─┘    (experiment returns to assess)

``loop.choices`` (``("continue", "plateau")``) are the ``choices=`` of the decision the author
puts at ``decide`` (a :func:`~piwf.workflow.decision`, or a
:func:`~piwf.workflow.human_decision` when the loop has ``field="choice"``); ``loop.edges`` are
ordinary edges: the switch from ``decide`` on ``$output.<field>`` to each route's ``to`` (as
:func:`~piwf.workflow.decision_edge` writes it) and one ``{"from": source, "to": return_to}`` per
return source. Nothing else exists: no node kind, no run-time state, so a workflow written
with a control loop has the same definition digest as the one written out by hand.

The shape is checked when the loop is written; what only the whole graph can tell (unknown node
ids, a node with a second outgoing edge, an unreachable node) is left to
:func:`~piwf.workflow.define_workflow`, which refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, TypeAlias, TypedDict

from piwf.errors import WorkflowDefinitionError
from piwf.workflow.choices import CHOICE_PATTERN
from piwf.workflow.context import Outcome
from piwf.workflow.decisions import FIELD_PATTERN, REASON_KEY, decision_edge

#: Route names that may only leave the loop: a cancelled run must never go round again.
TERMINAL_ONLY_ROUTES = frozenset({Outcome.CANCELLED.value})
_ROUTE_KEYS = frozenset({"to", "returns", "terminal"})
_ROUTE_SHAPE = "{'to': node, 'returns': [node, ...]} or {'to': node, 'terminal': True}"


class ContinueRoute(TypedDict):
    """A route that starts work at ``to``; every node in ``returns`` comes back to the loop."""

    to: str
    returns: Sequence[str]


class TerminalRoute(TypedDict):
    """A route that leaves the loop at ``to``."""

    to: str
    terminal: Literal[True]


LoopRoute: TypeAlias = ContinueRoute | TerminalRoute


@dataclass(frozen=True)
class ControlLoop:
    """A checked control loop: the choices of its decision and the edges that wire it.

    ``cases`` pairs each route with its target, in declaration order; ``return_sources`` are
    the nodes that come back to ``return_to``, in declaration order.
    """

    decide: str
    return_to: str
    field: str
    cases: tuple[tuple[str, str], ...]
    return_sources: tuple[str, ...]

    @property
    def choices(self) -> tuple[str, ...]:
        """Return the route names, the ``choices=`` of the decision at ``decide``."""
        return tuple(name for name, _ in self.cases)

    @property
    def edges(self) -> list[dict[str, Any]]:
        """Return fresh edge mappings for ``define_workflow(edges=...)``: the switch first."""
        switch = decision_edge(
            from_=self.decide, choices=self.choices, cases=dict(self.cases), field=self.field
        )
        returns = [{"from": source, "to": self.return_to} for source in self.return_sources]
        return [switch, *returns]


def control_loop(
    *,
    decide: str,
    return_to: str,
    routes: Mapping[str, LoopRoute],
    field: str = "route",
) -> ControlLoop:
    """Return the choices and edges of a loop decided at node ``decide``.

    Each route is ``{"to": node, "returns": [node, ...]}`` (a continuation: every listed node
    gets an edge back to ``return_to``) or ``{"to": node, "terminal": True}`` (it leaves the
    loop). ``field`` is the output field the decision routes on: ``route`` for a default
    :func:`~piwf.workflow.decision`, ``choice`` for a :func:`~piwf.workflow.human_decision`.

    Raises :class:`WorkflowDefinitionError` naming the loop and the rule for: no routes, a route
    name that is no valid choice, ``cancelled`` as a continuation, a terminal route with
    returns or whose target leads back (a return source or ``return_to``), a continuation
    without returns, a return source listed twice or that is ``decide`` or ``return_to``, a
    route to ``decide``, unknown route keys and wrong types. Unknown node ids and second
    outgoing edges are for :func:`~piwf.workflow.define_workflow`.
    """
    if not isinstance(decide, str) or not decide:
        raise WorkflowDefinitionError("control_loop(): decide must be a non-empty node id")
    check = _LoopCheck(f"control_loop({decide!r})", decide, return_to)
    if not isinstance(return_to, str) or not return_to:
        check.fail("return_to must be a non-empty node id")
    if not isinstance(field, str) or not FIELD_PATTERN.match(field) or field == REASON_KEY:
        check.fail(f"field must match {FIELD_PATTERN.pattern} and not be {REASON_KEY!r}")
    if not isinstance(routes, Mapping):
        check.fail(f"routes must map route names to {_ROUTE_SHAPE}")
    if not routes:
        check.fail("declare at least one route")
    cases: list[tuple[str, str]] = []
    owners: dict[str, str] = {}
    terminal: list[tuple[str, str]] = []
    for name, raw in routes.items():
        target, returns = check.route(name, raw)
        for source in returns:
            if source in owners:
                first = owners[source]
                where = f"route {name!r}" if first == name else f"routes {first!r} and {name!r}"
                check.fail(f"return source {source!r} is listed twice ({where})")
            owners[source] = name
        if not returns:
            terminal.append((name, target))
        cases.append((name, target))
    for name, target in terminal:
        if target in owners or target == return_to:
            check.fail(
                f"terminal route {name!r} goes to {target!r}, which leads back to "
                f"{return_to!r}; a terminal route must leave the loop"
            )
    return ControlLoop(
        decide=decide,
        return_to=return_to,
        field=field,
        cases=tuple(cases),
        return_sources=tuple(owners),
    )


class _LoopCheck:
    """The rules of one loop's routes; every failure names the loop and raises at once."""

    def __init__(self, label: str, decide: str, return_to: str) -> None:
        self.label = label
        self.decide = decide
        self.return_to = return_to

    def fail(self, message: str) -> NoReturn:
        raise WorkflowDefinitionError(f"{self.label}: {message}")

    def route(self, name: object, raw: object) -> tuple[str, tuple[str, ...]]:
        """Return a route's target and return sources (none for a terminal route)."""
        if not isinstance(name, str) or not CHOICE_PATTERN.match(name):
            self.fail(f"route name {name!r} must match {CHOICE_PATTERN.pattern}")
        if not isinstance(raw, Mapping):
            self.fail(f"route {name!r} must be {_ROUTE_SHAPE}")
        unknown = sorted(str(key) for key in raw if key not in _ROUTE_KEYS)
        if unknown:
            self.fail(
                f"route {name!r} has unknown key(s) {', '.join(unknown)}; a route takes 'to' "
                "and either 'returns' or 'terminal'"
            )
        target = raw.get("to")
        if not isinstance(target, str) or not target:
            self.fail(f"route {name!r} needs a 'to' node id")
        if target == self.decide:
            self.fail(
                f"route {name!r} goes straight back to the deciding node {self.decide!r}; "
                "route it to the work, which returns"
            )
        if "terminal" in raw:
            if raw["terminal"] is not True:
                self.fail(f"route {name!r}: 'terminal' must be True (leave it out to continue)")
            if "returns" in raw:
                self.fail(f"terminal route {name!r} leaves the loop and takes no 'returns'")
            return target, ()
        if name in TERMINAL_ONLY_ROUTES:
            self.fail(f"route {name!r} may only leave the loop; mark it 'terminal': True")
        return target, self.returns(name, raw.get("returns"))

    def returns(self, name: str, raw: object) -> tuple[str, ...]:
        """Return a continuation's return sources, in order."""
        if raw is None or (isinstance(raw, (list, tuple)) and not raw):
            self.fail(
                f"route {name!r} continues the loop but lists no 'returns'; name the node(s) "
                f"that come back to {self.return_to!r}, or mark it 'terminal': True"
            )
        if not isinstance(raw, (list, tuple)) or not all(
            isinstance(source, str) and source for source in raw
        ):
            self.fail(f"route {name!r}: 'returns' must be a list of node ids")
        for source in raw:
            if source == self.decide:
                self.fail(f"route {name!r} lists the deciding node {source!r} as a return source")
            if source == self.return_to:
                self.fail(f"route {name!r} lists return_to {source!r} as a return source")
        return tuple(raw)
