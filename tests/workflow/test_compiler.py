"""Compiler: full paths through mounts, the structure-only snapshot and a stable digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from piwf import canonical
from piwf.errors import WorkflowDefinitionError
from piwf.workflow import compute, define_workflow, include
from piwf.workflow.compiler import SNAPSHOT_SCHEMA, compile_workflow
from piwf.workflow.sources import load_workflow

from .conftest import FIXTURES, REPO, load_fixture

FIXTURE_FILES = sorted(FIXTURES.glob("*.py"))

DIGEST_SCRIPT = """
import json, sys
from piwf.workflow.sources import load_workflow
print(json.dumps({path: load_workflow(path).compiled.digest for path in sys.argv[1:]}))
"""


def digests_in_fresh_interpreter(paths: list[Path], hash_seed: str, cwd: Path) -> Any:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": hash_seed}
    completed = subprocess.run(
        [sys.executable, "-c", DIGEST_SCRIPT, *map(str, paths)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(completed.stdout)


def test_every_fixture_has_the_same_digest_in_two_fresh_interpreters(tmp_path: Path) -> None:
    assert len(FIXTURE_FILES) >= 10
    first = digests_in_fresh_interpreter(FIXTURE_FILES, "1", tmp_path)
    second = digests_in_fresh_interpreter(FIXTURE_FILES, "2", tmp_path)
    assert first == second
    assert set(first) == {str(path) for path in FIXTURE_FILES}
    here = {str(path): load_workflow(path).compiled.digest for path in FIXTURE_FILES}
    assert here == first
    assert len(set(first.values())) == len(FIXTURE_FILES)


def test_composition_compiles_full_paths_through_mounts() -> None:
    compiled = load_fixture("composition").compiled
    assert set(compiled.nodes) == {
        "workspace/inspect",
        "docs/workspace/inspect",
        "docs/write",
        "summary",
    }
    assert set(compiled.mounts) == {"workspace", "docs", "docs/workspace"}
    assert compiled.entry == "workspace/inspect"
    inner = compiled.nodes["docs/workspace/inspect"]
    assert inner.node_id == "inspect"
    assert inner.scope == ("docs", "docs/workspace")
    assert dict(inner.exits) == {"docs/workspace": "ready"}
    assert inner.route is not None
    assert dict(inner.route.targets) == {"write": "docs/write"}
    outer = compiled.nodes["workspace/inspect"]
    assert outer.route is not None
    assert dict(outer.route.targets) == {"docs": "docs/workspace/inspect"}
    assert outer.route.scope_depth == 0
    assert compiled.nodes["summary"].route is None


def test_snapshot_is_structure_only_canonical_json() -> None:
    compiled = load_fixture("decision_timeout").compiled
    snapshot = compiled.snapshot
    assert isinstance(snapshot, dict)
    assert snapshot["schema"] == SNAPSHOT_SCHEMA
    assert compiled.digest == canonical.sha256(canonical.encode(snapshot)).hex()
    text = canonical.encode_text(snapshot)
    assert "lambda" not in text
    assert "0x" not in text
    approve = snapshot["workflow"]["nodes"]["approve"]  # type: ignore[call-overload,index]
    assert approve == {
        "kind": "human_decision",
        "audience": "operator",
        "choices": {"ship": "Ship it", "hold": "Hold back"},
        "onTimeout": {"afterMs": 600000, "response": {"choice": "hold"}},
    }


BASE = """
from piwf.workflow import (action, compute, define_workflow, human_decision,
                           idempotent_effect, manual_effect)

workflow = define_workflow(
    name="structure",
    start_at="plan",
    max_steps=MAX_STEPS,
    nodes={
        "plan": compute(lambda ctx: {"n": CODE}, timeout_ms=TIMEOUT),
        "act": action(effect=EFFECT("deploy.TYPE"), run=lambda ctx: {"ok": True}),
        "ask": human_decision(choices={"yes": "LABEL", "no": "No"}),
        "yes": compute(lambda ctx: None),
        "no": compute(lambda ctx: None),
        EXTRA_NODE
    },
    edges=[
        {"from": "plan", "to": "act"},
        {"from": "act", "to": "ask"},
        {"from": "ask", "switch": {"on": "$output.choice", "cases": {"yes": "yes", "no": "no"}}},
        EXTRA_EDGE
    ],
)
"""
DEFAULTS = {
    "MAX_STEPS": "100",
    "CODE": "1",
    "TIMEOUT": "1000",
    "EFFECT": "idempotent_effect",
    "TYPE": "preview",
    "LABEL": "Yes",
    "EXTRA_NODE": "",
    "EXTRA_EDGE": "",
}


def render(tmp_path: Path, name: str, **changes: str) -> Path:
    text = BASE
    for key, value in {**DEFAULTS, **changes}.items():
        text = text.replace(key, value)
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "change",
    [
        {"MAX_STEPS": "50"},
        {"TIMEOUT": "2000"},
        {"TIMEOUT": "lambda ctx: 5"},
        {"EFFECT": "manual_effect"},
        {"TYPE": "production"},
        {"LABEL": "Yes please"},
        {"EXTRA_NODE": '"late": compute(lambda ctx: None),', "EXTRA_EDGE": ""},
    ],
)
def test_any_structural_change_changes_the_digest(tmp_path: Path, change: dict[str, str]) -> None:
    base = load_workflow(render(tmp_path, "base"))
    if "EXTRA_NODE" in change:
        change = {**change, "EXTRA_EDGE": '{"from": "yes", "to": "late"},'}
    changed = load_workflow(render(tmp_path, "changed", **change))
    assert changed.compiled.digest != base.compiled.digest


def test_a_code_change_keeps_the_digest_but_changes_the_source_hash(tmp_path: Path) -> None:
    base = load_workflow(render(tmp_path, "base"))
    edited = load_workflow(render(tmp_path, "edited", CODE="2 + 40"))
    assert edited.compiled.digest == base.compiled.digest
    assert edited.sources.root.sha256 != base.sources.root.sha256


def test_include_cycles_are_rejected_by_the_compiler() -> None:
    leaf = define_workflow(
        name="leaf",
        start_at="x",
        nodes={"x": compute(lambda ctx: None)},
        edges=[],
        exits={"out": {"from": "x"}},
    )
    # A definition cannot mount itself directly; a path resolver that hands back an ancestor
    # is the only way to build a cycle.
    parent = define_workflow(
        name="parent",
        start_at="child",
        includes={"child": include("./self.py")},
        nodes={"end": compute(lambda ctx: None)},
        edges=[{"from": "child.out", "to": "end"}],
        exits={"out": {"from": "end"}},
    )
    with pytest.raises(WorkflowDefinitionError, match="include cycle: workflow 'parent'"):
        compile_workflow(parent, resolve=lambda reference, including: parent)
    compiled = compile_workflow(parent, resolve=lambda reference, including: leaf)
    assert set(compiled.nodes) == {"child/x", "end"}


def test_path_includes_need_the_loader() -> None:
    parent = define_workflow(
        name="parent",
        start_at="child",
        includes={"child": include("./child.py")},
        nodes={"end": compute(lambda ctx: None)},
        edges=[{"from": "child.out", "to": "end"}],
    )
    with pytest.raises(WorkflowDefinitionError, match="load the workflow from its file"):
        compile_workflow(parent)


def test_an_exit_unknown_to_a_path_include_fails_at_compile_time() -> None:
    leaf = define_workflow(
        name="leaf",
        start_at="x",
        nodes={"x": compute(lambda ctx: None)},
        edges=[],
        exits={"out": {"from": "x"}},
    )
    parent = define_workflow(
        name="parent",
        start_at="child",
        includes={"child": include("./leaf.py")},
        nodes={"end": compute(lambda ctx: None)},
        edges=[{"from": "child.elsewhere", "to": "end"}],
    )
    with pytest.raises(WorkflowDefinitionError, match="declares exits: out"):
        compile_workflow(parent, resolve=lambda reference, including: leaf)
