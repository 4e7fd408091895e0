"""Import rules: the workflow package never reaches storage or the server (DESIGN.md §2)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import piwf.workflow

from .conftest import REPO

FORBIDDEN = ("piwf.state", "piwf.server", "piwf.client", "piwf.cli", "sqlite3", "pickle")
PACKAGE = REPO / "piwf" / "workflow"


def imported_modules(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_module_of_the_package_imports_storage_or_server_code() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        for name in imported_modules(path.read_text()):
            assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"


def test_importing_the_engine_loads_no_sqlite_in_a_fresh_interpreter() -> None:
    script = (
        "import json, sys\n"
        "import piwf.workflow, piwf.workflow.engine, piwf.workflow.memory\n"
        "import piwf.workflow.sources\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(("
        + ", ".join(repr(name) for name in FORBIDDEN)
        + ")))))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(completed.stdout) == []


def test_public_api_is_sorted_and_complete() -> None:
    exported = piwf.workflow.__all__
    assert exported == sorted(exported)
    for name in (
        "define_workflow",
        "compute",
        "action",
        "shell",
        "notify",
        "checkpoint",
        "human_decision",
        "agent",
        "include",
        "idempotent_effect",
        "manual_effect",
        "NodeContext",
    ):
        assert name in exported
        assert hasattr(piwf.workflow, name)
