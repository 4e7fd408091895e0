"""Edges and routing: ``{from, to}`` and ``{from, switch: {on, cases}}``.

A switch reads one value and looks its text up in ``cases``:

- ``$output`` / ``$`` is the accepted output; ``$output.a.b`` / ``$.a.b`` walks into it
  (object keys, or list indexes written as digits);
- ``$result.outcome`` is the visit's outcome: ``ok``, ``failed``, ``timed_out``, ``cancelled``.

A string value is looked up as it is; any other JSON value by its canonical text (``true``,
``3``, ``null``). A failed visit routes only through a switch on ``$result.outcome``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.workflow.context import Outcome

OUTCOME_PATH = "$result.outcome"
_SEGMENT = re.compile(r"^[A-Za-z0-9_-]+$")


class MissingValue:
    """Marks a switch path that does not exist in the output."""


MISSING = MissingValue()


@dataclass(frozen=True)
class SwitchOn:
    """A parsed switch path: ``outcome`` for ``$result.outcome``, else output segments."""

    text: str
    outcome: bool
    segments: tuple[str, ...]

    def read(self, output: JsonValue, outcome: Outcome) -> JsonValue | MissingValue:
        """Return the routed value, or :data:`MISSING` when the output has no such path."""
        if self.outcome:
            return outcome.value
        value: JsonValue = output
        for segment in self.segments:
            if isinstance(value, dict) and segment in value:
                value = value[segment]
            elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
                value = value[int(segment)]
            else:
                return MISSING
        return value


@dataclass(frozen=True)
class GotoEdge:
    """An unconditional edge from ``source`` to ``target``."""

    source: str
    target: str

    def targets(self) -> tuple[str, ...]:
        """Return every local target this edge can reach."""
        return (self.target,)

    def structure(self) -> dict[str, JsonValue]:
        """Return the snapshot form."""
        return {"from": self.source, "to": self.target}


@dataclass(frozen=True)
class SwitchEdge:
    """A switch from ``source``: ``cases`` maps a value's text to a local target."""

    source: str
    on: SwitchOn
    cases: tuple[tuple[str, str], ...]

    def targets(self) -> tuple[str, ...]:
        """Return every local target this edge can reach, in case order."""
        return tuple(target for _, target in self.cases)

    def structure(self) -> dict[str, JsonValue]:
        """Return the snapshot form."""
        return {"from": self.source, "switch": {"on": self.on.text, "cases": dict(self.cases)}}


Edge: TypeAlias = GotoEdge | SwitchEdge


def parse_switch_on(text: object) -> SwitchOn | str:
    """Parse a switch path; return the parsed path, or a message saying what is wrong."""
    if not isinstance(text, str):
        return "switch 'on' must be a string such as '$output.route' or '$result.outcome'"
    if text == OUTCOME_PATH:
        return SwitchOn(text=text, outcome=True, segments=())
    for root in ("$output", "$"):
        if text == root:
            return SwitchOn(text=text, outcome=False, segments=())
        if text.startswith(root + "."):
            segments = tuple(text[len(root) + 1 :].split("."))
            if all(_SEGMENT.match(segment) for segment in segments):
                return SwitchOn(text=text, outcome=False, segments=segments)
            return f"switch path {text!r} has an empty or invalid segment"
    return (
        f"switch 'on' must be '$output', '$output.<path>', '$.<path>' or "
        f"'{OUTCOME_PATH}', got {text!r}"
    )


def case_text(value: JsonValue) -> str:
    """Return the text a routed value is looked up by in ``cases``."""
    if isinstance(value, str):
        return value
    return canonical.encode_text(value)


#: Every key an edge mapping can have: from+to, or from+switch.
_EDGE_KEYS = frozenset({"from", "to", "switch"})


def parse_edge(raw: object, index: int) -> Edge | str:
    """Turn one user edge mapping into an :data:`Edge`, or return what is wrong with it."""
    where = f"edge #{index + 1}"
    if not isinstance(raw, Mapping):
        return f"{where} must be a mapping such as {{'from': 'a', 'to': 'b'}}"
    keys = set(raw)
    source = raw.get("from")
    if not isinstance(source, str) or not source:
        unknown = sorted(repr(key) for key in keys - _EDGE_KEYS)
        also = f" (it has {', '.join(unknown)}, which no edge takes)" if unknown else ""
        return f"{where} needs a 'from' node id{also}"
    where = f"edge from {source!r}"
    if keys == {"from", "to"}:
        target = raw["to"]
        if not isinstance(target, str) or not target:
            return f"{where}: 'to' must be a node id"
        return GotoEdge(source=source, target=target)
    if keys != {"from", "switch"}:
        return f"{where} must have exactly the keys from+to or from+switch, got {sorted(keys)}"
    switch = raw["switch"]
    if not isinstance(switch, Mapping) or set(switch) != {"on", "cases"}:
        return f"{where}: switch must be {{'on': path, 'cases': {{value: target}}}}"
    on = parse_switch_on(switch["on"])
    if isinstance(on, str):
        return f"{where}: {on}"
    cases = switch["cases"]
    if not isinstance(cases, Mapping) or not cases:
        return f"{where}: switch cases must be a non-empty mapping"
    pairs: list[tuple[str, str]] = []
    for value, target in cases.items():
        if not isinstance(value, str):
            return f"{where}: case keys must be strings, got {value!r}"
        if not isinstance(target, str) or not target:
            return f"{where}: case {value!r} must name a node id"
        pairs.append((value, target))
    if on.outcome:
        unknown = [value for value, _ in pairs if value not in {o.value for o in Outcome}]
        if unknown:
            return (
                f"{where}: {OUTCOME_PATH} cases must be among ok, failed, timed_out, "
                f"cancelled; got {', '.join(unknown)}"
            )
    return SwitchEdge(source=source, on=on, cases=tuple(pairs))
