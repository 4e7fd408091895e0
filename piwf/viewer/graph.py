"""The run's graph as lines of text: its nodes from the start, each marked by what the view says.

Nodes are listed in the order a walk from ``start_at`` along the edges first reaches them (the
rest after, by name), each with its kind, its latest step's outcome and a marker::

    ▶ running now    … waited on (a request, a timer, a resume)    ✓ completed
    ✗ failed, timed out or cancelled    · not yet

followed by where it leads: ``→ next`` or ``on $output.route: revise → draft, accept → publish``.
Only the view's topology, steps and display are read.
"""

from __future__ import annotations

from collections import deque

from piwf.protocol.view_payloads import RunView, TopologyEdge

_MARKS = {"completed": "✓", "failed": "✗", "timed_out": "✗", "cancelled": "✗"}


def graph_lines(view: RunView) -> list[str]:
    """The graph of ``view`` (empty when the view has no topology)."""
    topology = view.topology
    if topology is None:
        return []
    leads: dict[str, list[TopologyEdge]] = {}
    for edge in topology.edges:
        leads.setdefault(edge.source, []).append(edge)
    outcome = {step.path: step.outcome for step in view.steps.steps}
    display = view.display
    node = display.current_node
    # Only an executing run has a node that runs: a sleeping run's ``currentNode`` is its
    # timer (or retry back-off) and a paused or parked run's the attempt it stopped, both
    # waited on.
    now = node.path if node is not None and display.activity == "executing" else None
    waited = display.waiting_on.path if display.waiting_on is not None else None
    if waited is None and node is not None and now is None:
        waited = node.path
    lines = []
    for path in _walk(topology.start_at, [node.path for node in topology.nodes], leads):
        kind = next(node.kind for node in topology.nodes if node.path == path)
        if path == now:
            mark = "▶"
        elif path == waited:
            mark = "…"
        else:
            mark = _MARKS.get(outcome.get(path, ""), "·")
        where = "; ".join(_lead(edge) for edge in leads.get(path, []))
        lines.append(f"{mark} {path} ({kind})" + (f"  {where}" if where else ""))
    if topology.truncated:
        lines.append("… (the graph is larger than the view shows)")
    return lines


def _walk(start: str, paths: list[str], leads: dict[str, list[TopologyEdge]]) -> list[str]:
    known = set(paths)
    order: list[str] = []
    queue = deque([start] if start in known else [])
    while queue:
        path = queue.popleft()
        if path in order:
            continue
        order.append(path)
        for edge in leads.get(path, []):
            targets = [edge.to] if edge.to is not None else list((edge.cases or {}).values())
            queue.extend(target for target in targets if target in known)
    return order + sorted(known - set(order))


def _lead(edge: TopologyEdge) -> str:
    if edge.to is not None:
        return f"→ {edge.to}"
    cases = ", ".join(f"{case} → {target}" for case, target in (edge.cases or {}).items())
    return f"on {edge.on}: {cases}"
