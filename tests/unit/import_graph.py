"""What every module of a package imports, read from its source with ``ast`` (no tests here).

An import is any ``import``/``from ... import`` statement anywhere in a module (module level,
inside functions, under ``if TYPE_CHECKING``) and any ``importlib.import_module("name")`` or
``__import__("name")`` call with a literal name, so an edge cannot hide behind a lazy or
by-name import. Relative imports are resolved; ``from pkg import name`` is an import of
``pkg.name`` when that is a module of the tree, else of ``pkg``.

:func:`package_cycles` reads the package-level graph: at each package, the units are its
subpackages (and, at the top, its modules as well); an import between modules of two sibling
units is an edge between those units. Imports between a package and its own subpackages (a
facade importing its parts, a part using its parent's shared modules) are not edges between
packages.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: SQL statements as the before-stop hook finds them: a string that begins with one.
SQL = re.compile(r"\s*(SELECT|INSERT INTO|UPDATE [a-z_]+ SET|DELETE FROM) ")

_BY_NAME = {("importlib", "import_module"), ("", "import_module"), ("", "__import__")}


@dataclass(frozen=True)
class Module:
    """One source file of the tree: its dotted name, path and whether it is a package."""

    name: str
    path: Path
    package: bool

    @property
    def package_name(self) -> str:
        """The package a relative import of this module starts from."""
        return self.name if self.package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Import:
    """One import in ``module``: ``target`` is the dotted name imported, ``line`` its line."""

    module: Module
    target: str
    line: int
    by_name: bool = False

    def where(self, root: Path) -> str:
        """``path:line`` relative to the tree's parent, for failure messages."""
        return f"{self.module.path.relative_to(root.parent)}:{self.line}"


def modules(root: Path) -> dict[str, Module]:
    """Every module under the package directory ``root``, by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        name = ".".join(parts)
        found[name] = Module(name, path, package)
    return found


def imports(root: Path) -> list[Import]:
    """Every import of every module under ``root``, in file and line order."""
    tree = modules(root)
    return [found for module in tree.values() for found in _imports_of(module, tree)]


def _imports_of(module: Module, tree: dict[str, Module]) -> Iterator[Import]:
    for node in ast.walk(ast.parse(module.path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node.module, node.level)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield Import(module, candidate if candidate in tree else base, node.lineno)
        elif isinstance(node, ast.Call) and _calls_by_name(node):
            argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                yield Import(module, argument.value, node.lineno, by_name=True)


def _absolute(module: Module, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = module.package_name.split(".")
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, name] if name else parts)


def _calls_by_name(node: ast.Call) -> bool:
    function = node.func
    if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
        return (function.value.id, function.attr) in _BY_NAME
    return isinstance(function, ast.Name) and ("", function.id) in _BY_NAME


def within(name: str, *prefixes: str) -> bool:
    """Whether dotted ``name`` is one of ``prefixes`` or inside one of them."""
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def sql_strings(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, first words)`` of every string constant in ``path`` that begins with SQL."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found = SQL.match(node.value)
            if found:
                yield node.lineno, found.group(1)


# Package-level cycles ----------------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    """Units that import each other in a ring, with one import that makes each step."""

    units: tuple[str, ...]
    steps: tuple[Import, ...]

    def describe(self, root: Path) -> str:
        ring = " -> ".join([*self.units, self.units[0]])
        why = "; ".join(f"{step.where(root)} imports {step.target}" for step in self.steps)
        return f"{ring} ({why})"


def package_cycles(root: Path) -> list[Cycle]:
    """One cycle for every group of sibling units that import each other (none: no cycle)."""
    tree = modules(root)
    packages = {name for name, module in tree.items() if module.package}
    edges: dict[str, dict[str, dict[str, Import]]] = {}
    for found in imports(root):
        target = _module_of(found.target, tree)
        if target is None or target == found.module.name:
            continue
        step = _sibling_units(found.module.name, target, root.name, packages)
        if step is not None:
            level, source_unit, target_unit = step
            edges.setdefault(level, {}).setdefault(source_unit, {}).setdefault(target_unit, found)
    return [
        _ring(component, graph)
        for graph in edges.values()
        for component in _strongly_connected(graph)
    ]


def _module_of(target: str, tree: dict[str, Module]) -> str | None:
    parts = target.split(".")
    while parts and ".".join(parts) not in tree:
        parts.pop()
    return ".".join(parts) or None


def _sibling_units(
    source: str, target: str, top: str, packages: set[str]
) -> tuple[str, str, str] | None:
    left, right = source.split("."), target.split(".")
    common = 0
    while common < min(len(left), len(right)) and left[common] == right[common]:
        common += 1
    if common in (len(left), len(right)):
        return None  # one contains the other: a package and its own part
    level = ".".join(left[:common])
    units = (".".join(left[: common + 1]), ".".join(right[: common + 1]))
    if level != top and not all(unit in packages for unit in units):
        return None  # below the top, only subpackages are units
    return level, units[0], units[1]


def _strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph.get(node, {})):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(_nodes(graph)):
        if node not in index:
            visit(node)
    return found


def _nodes(graph: dict[str, dict[str, Import]]) -> Iterable[str]:
    return set(graph) | {target for targets in graph.values() for target in targets}


def _ring(component: list[str], graph: dict[str, dict[str, Import]]) -> Cycle:
    """A shortest way from the component's first unit back to itself, inside the component."""
    start, members = component[0], set(component)
    paths: dict[str, list[str]] = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph.get(node, {})):
                if successor == start:
                    ring = paths[node]
                    steps = [graph[a][b] for a, b in zip(ring, [*ring[1:], start], strict=True)]
                    return Cycle(tuple(ring), tuple(steps))
                if successor in members and successor not in paths:
                    paths[successor] = [*paths[node], successor]
                    following.append(successor)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")  # pragma: no cover
