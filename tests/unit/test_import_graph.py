"""The import reader behind the import rules finds what it must, on a small tree of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from .import_graph import imports, package_cycles, sql_strings


def tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (paths relative to the package ``pkg``) and return the package dir."""
    package = root / "pkg"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    for directory in [package, *(p for p in package.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    return package


def edges(package: Path) -> set[tuple[str, str, bool]]:
    return {(found.module.name, found.target, found.by_name) for found in imports(package)}


def test_imports_at_any_depth_relative_and_by_name_are_all_found(tmp_path: Path) -> None:
    package = tree(
        tmp_path,
        {
            "a/one.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.b import two\n"
                "def later():\n    import pkg.c.three\n    from ..b.two import thing\n"
                "    from . import sibling\n"
                "import importlib\n"
                "def by_name():\n    return importlib.import_module('pkg.c.three')\n"
                "def dynamic(name):\n    return importlib.import_module(name)\n"
            ),
            "a/sibling.py": "",
            "b/two.py": "thing = 1\n",
            "c/three.py": "",
        },
    )
    assert edges(package) >= {
        ("pkg.a.one", "pkg.b.two", False),
        ("pkg.a.one", "pkg.c.three", False),
        ("pkg.a.one", "pkg.a.sibling", False),
        ("pkg.a.one", "pkg.c.three", True),
    }
    # ``from ..b.two import thing``: thing is no module, so the import is of pkg.b.two.
    assert ("pkg.a.one", "pkg.b.two.thing", False) not in edges(package)


def test_a_cycle_between_sibling_packages_is_found_with_the_imports_that_make_it(
    tmp_path: Path,
) -> None:
    package = tree(
        tmp_path,
        {
            "server/runs/recovery.py": "from pkg.server.resources import calls\n",
            "server/resources/calls.py": "def f():\n    from pkg.server.runs import handlers\n",
            "server/runs/handlers.py": "",
        },
    )
    (cycle,) = package_cycles(package)
    assert cycle.units == ("pkg.server.resources", "pkg.server.runs")
    assert cycle.describe(package) == (
        "pkg.server.resources -> pkg.server.runs -> pkg.server.resources "
        "(pkg/server/resources/calls.py:2 imports pkg.server.runs.handlers; "
        "pkg/server/runs/recovery.py:1 imports pkg.server.resources.calls)"
    )


def test_a_top_level_cycle_through_a_module_is_found(tmp_path: Path) -> None:
    package = tree(
        tmp_path,
        {
            "errors.py": "from pkg.state import records\n",
            "state/records.py": "from pkg.errors import Failure\n",
            "workflow/engine.py": "from pkg.state import records\n",
        },
    )
    assert [cycle.units for cycle in package_cycles(package)] == [("pkg.errors", "pkg.state")]


@pytest.mark.parametrize(
    "files",
    [
        # A package and its own parts: a facade and a part using its parent's shared module.
        {
            "server/__init__.py": "from pkg.server.runs import pool\n",
            "server/runs/pool.py": ("from pkg.server import context\n"),
            "server/context.py": "",
        },
        # Modules of one package importing each other are that package's own affair.
        {"state/a.py": "from pkg.state import b\n", "state/b.py": "from pkg.state import a\n"},
        # One direction only.
        {"cli/main.py": "from pkg.client import api\n", "client/api.py": "import json\n"},
    ],
)
def test_imports_that_are_not_a_cycle_between_packages(
    tmp_path: Path, files: dict[str, str]
) -> None:
    assert package_cycles(tree(tmp_path, files)) == []


def test_sql_is_found_at_the_start_of_any_string_and_only_there(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        '_ONE = """\nSELECT run_id FROM runs\n"""\n'
        "_TWO = ('UPDATE runs SET status = ?' ' WHERE run_id = ?')\n"
        "_THREE = f'DELETE FROM {table} WHERE x = 1'\n"
        '"""Select the next run; INSERT INTO is how it is stored."""\n'
        "_NOT = 'UPDATE the view'\n"
    )
    assert list(sql_strings(path)) == [(1, "SELECT"), (4, "UPDATE runs SET"), (5, "DELETE FROM")]
