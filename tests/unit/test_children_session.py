"""The fork server's session: led only by a process the server marked, and the mark not kept.

Each case runs in a fresh interpreter started by ``subprocess`` (in this test's process group,
so not a group leader: ``setsid`` can succeed there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from piwf.processes import CHILDREN_SESSION, CHILDREN_SESSION_VARIABLE, FORKSERVER_PRELOAD

PROGRAM = textwrap.dedent(
    f"""
    import json, os, importlib
    before = os.getsid(0)
    importlib.import_module({CHILDREN_SESSION!r})
    print(json.dumps({{"pid": os.getpid(), "before": before, "after": os.getsid(0),
                       "mark": os.environ.get({CHILDREN_SESSION_VARIABLE!r})}}))
    """
)


def run_import(mark: str | None) -> dict[str, object]:
    environment = {k: v for k, v in os.environ.items() if k != CHILDREN_SESSION_VARIABLE}
    if mark is not None:
        environment[CHILDREN_SESSION_VARIABLE] = mark
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=environment, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    facts: dict[str, object] = json.loads(result.stdout)
    return facts


def test_a_marked_process_leads_a_new_session_and_drops_the_mark() -> None:
    facts = run_import("1")
    assert facts["after"] == facts["pid"] != facts["before"]
    assert facts["mark"] is None


def test_an_import_without_the_mark_changes_nothing() -> None:
    for mark in (None, "0", "yes"):
        facts = run_import(mark)
        assert facts["after"] == facts["before"] != facts["pid"], mark


def test_the_fork_server_imports_it_before_anything_else() -> None:
    assert FORKSERVER_PRELOAD[0] == CHILDREN_SESSION
