"""Packaging, the public surface and the import rules of DESIGN.md §2."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import piwf

PACKAGE = Path(piwf.__file__).parent


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules_under(subpackage: str) -> list[Path]:
    root = PACKAGE / subpackage
    if root.suffix == ".py":
        return [root] if root.exists() else []
    return sorted(root.rglob("*.py")) if root.exists() else []


def test_version_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "piwf", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"piwf {piwf.__version__}"


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "piwf"
    assert script.exists(), "install piwf (pip install .) so the `piwf` script exists"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"piwf {piwf.__version__}"


def test_public_api_is_sorted_and_importable() -> None:
    assert piwf.__all__ == sorted(piwf.__all__)
    for name in piwf.__all__:
        assert hasattr(piwf, name), name


def test_package_is_typed() -> None:
    assert (PACKAGE / "py.typed").exists()


FORBIDDEN: list[tuple[str, tuple[str, ...]]] = [
    ("state", ("piwf.server", "piwf.client", "piwf.cli", "piwf.runner")),
    ("workflow", ("piwf.state", "piwf.server", "piwf.client", "piwf.cli", "sqlite3")),
    (
        "resource",
        ("piwf.state", "piwf.server", "piwf.client", "piwf.cli", "piwf.runner", "sqlite3"),
    ),
    ("protocol", ("piwf.state", "piwf.server", "piwf.client", "piwf.cli", "sqlite3")),
    ("client", ("piwf.server", "piwf.state", "sqlite3")),
    # The offline commands read an inactive file through the state package (DESIGN.md §1).
    ("client/offline.py", ("piwf.server", "sqlite3")),
    ("client/restore.py", ("piwf.server", "sqlite3")),
    ("server", ("piwf.client", "piwf.cli")),
    ("cli", ("piwf.server", "piwf.state", "piwf.workflow", "sqlite3")),
]

#: Modules that a package rule above does not cover, because a rule of their own does.
EXEMPT: dict[str, frozenset[str]] = {
    "client": frozenset({"client/offline.py", "client/restore.py"}),
}


@pytest.mark.parametrize(("subpackage", "forbidden"), FORBIDDEN)
def test_import_direction(subpackage: str, forbidden: tuple[str, ...]) -> None:
    modules = modules_under(subpackage)
    assert modules, f"no module at piwf/{subpackage}: update the rule"
    exempt = EXEMPT.get(subpackage, frozenset())
    for module in modules:
        if str(module.relative_to(PACKAGE)) in exempt:
            continue
        for name in imports_of(module):
            assert not any(name == bad or name.startswith(bad + ".") for bad in forbidden), (
                f"{module.relative_to(PACKAGE)} imports {name}"
            )


def test_sqlite_is_used_only_by_the_state_package() -> None:
    # faults.py names sqlite3's exception class to imitate SQLite errors; it opens nothing.
    for module in sorted(PACKAGE.rglob("*.py")):
        if module.is_relative_to(PACKAGE / "state") or module == PACKAGE / "faults.py":
            continue
        assert "sqlite3" not in imports_of(module), module.relative_to(PACKAGE)


def test_no_pickle_anywhere() -> None:
    for module in sorted(PACKAGE.rglob("*.py")):
        names = imports_of(module)
        assert "pickle" not in names and "cloudpickle" not in names, module
