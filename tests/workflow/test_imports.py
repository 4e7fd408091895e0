"""At run time the engine loads no storage or server code; the workflow package's public API.

The static import rules of every package, this one's included, are in
``tests/unit/test_import_rules.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import piwf.workflow

from .conftest import REPO

FORBIDDEN = ("piwf.state", "piwf.server", "piwf.client", "piwf.cli", "sqlite3", "pickle")


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
