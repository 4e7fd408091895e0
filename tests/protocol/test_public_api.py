"""piwf.protocol exports a small, sorted, importable surface with no I/O in it."""

from __future__ import annotations

import ast
from pathlib import Path

import piwf.protocol
from piwf.errors import PiwfError

PROTOCOL_DIR = Path(piwf.protocol.__file__).parent
IO_MODULES = {"socket", "selectors", "threading", "asyncio", "multiprocessing", "subprocess"}


def _ruff_order(name: str) -> tuple[int, str]:
    # ruff RUF022 ("isort-style"): SCREAMING_CASE, then CamelCase, then the rest.
    if name.isupper():
        return 0, name
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted_unique_and_importable() -> None:
    names = piwf.protocol.__all__
    assert names == sorted(names, key=_ruff_order)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(piwf.protocol, name), name


def test_exported_errors_belong_to_the_piwf_tree_with_distinct_codes() -> None:
    errors = [
        value
        for value in vars(piwf.protocol).values()
        if isinstance(value, type) and issubclass(value, BaseException)
    ]
    assert errors
    assert all(issubclass(error, PiwfError) for error in errors)
    assert len({error.code for error in errors}) == len(errors)


def test_protocol_package_does_no_io() -> None:
    for module in PROTOCOL_DIR.glob("*.py"):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not imported & IO_MODULES, f"{module.name} imports {imported & IO_MODULES}"
