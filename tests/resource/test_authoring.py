"""The authoring API, ``effects.ensure`` against a recording port, discovery, and the
resource-runner protocol models (bytes in, typed messages or refusals out)."""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from piwf.canonical import JsonValue
from piwf.protocol.resource_v1 import ChildFrame, ReconcileFinish
from piwf.resource import (
    EffectIndeterminateError,
    EffectOutcome,
    EffectRecord,
    ManagedResource,
    ReconcileContext,
    ResultKind,
    WorkflowRef,
    condition_true,
    define_resource_manager,
    requeue_after,
    settled,
)
from piwf.resource.discovery import discovered_path, find_and_load
from piwf.resource.errors import ResourceManagerDefinitionError, ResourceManagerLoadError
from piwf.workflow.context import CancellationSignal, NodeCancelledError


def test_definitions_check_their_arguments() -> None:
    manager = define_resource_manager("pull-request", lambda spec: {}, lambda c, r: settled())
    assert (manager.name, manager.timeout_ms) == ("pull-request", 60_000)
    assert manager.source_file == str(Path(__file__).resolve())
    for bad in ("Upper", "1x", "", "a" * 65, "a_b"):
        with pytest.raises(ResourceManagerDefinitionError):
            define_resource_manager(bad, lambda spec: {}, lambda c, r: settled())
    with pytest.raises(ResourceManagerDefinitionError, match="timeout_ms"):
        define_resource_manager("x", lambda spec: {}, lambda c, r: settled(), timeout_ms=0)
    with pytest.raises(ResourceManagerDefinitionError, match="callable"):
        define_resource_manager("x", {}, lambda c, r: settled())  # type: ignore[arg-type]


def test_results_carry_their_patch_on_the_wire() -> None:
    result = settled(
        status={"phase": "ready"},
        conditions=[condition_true("Ready", "Done", "ok")],
        finalizers=["a/b"],
    )
    assert result.to_json() == {
        "kind": "settled",
        "patch": {
            "status": {"phase": "ready"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Done", "message": "ok"}],
            "finalizers": ["a/b"],
        },
    }
    later = requeue_after(5000)
    assert (later.kind, later.to_json()) == (
        ResultKind.REQUEUE_AFTER,
        {"kind": "requeueAfter", "afterMs": 5000, "patch": {}},
    )
    with pytest.raises(ValueError, match="1.."):
        requeue_after(0)
    with pytest.raises(ValueError, match="JSON object"):
        settled(status=["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finalizers"):
        settled(finalizers="a/b")


@dataclass
class RecordingPort:
    """A ReconcilePort in memory that records every call (and what observe/apply did)."""

    stored: str = "pending"
    calls: list[str] = field(default_factory=list)

    def reserve_effect(self, key: str, kind: str, request: JsonValue) -> EffectRecord:
        self.calls.append(f"reserve {key}")
        return EffectRecord(key, kind, f"effect-{key}", self.stored)

    def begin_effect(self, effect_id: str) -> int:
        self.calls.append("begin")
        return 1

    def settle_effect(
        self, effect_id: str, attempt: int, outcome: EffectOutcome, *, observed: bool
    ) -> EffectRecord:
        self.calls.append(f"settle {outcome.status} observed={observed}")
        status = "ambiguous" if outcome.status == "indeterminate" else outcome.status
        return EffectRecord("k", "kind", effect_id, status, outcome.result)

    def ensure_workflow(self, request_key: str, workflow: str, input: JsonValue) -> WorkflowRef:
        raise AssertionError("not used")


def context(port: RecordingPort, signal: CancellationSignal | None = None) -> ReconcileContext:
    resource = ManagedResource.from_json(
        {
            "uid": "mr-1",
            "manager": "m",
            "key": "k",
            "resourceVersion": 1,
            "generation": 1,
            "observedGeneration": 0,
            "spec": {},
            "status": {},
            "conditions": [],
            "finalizers": [],
        }
    )
    return ReconcileContext(resource, port, signal or CancellationSignal(), "rec-1")


def ensure(ctx: ReconcileContext, port: RecordingPort, observed: Any, applied: Any) -> Any:
    def observe(signal: CancellationSignal) -> Any:
        port.calls.append("observe")
        if isinstance(observed, Exception):
            raise observed
        return observed

    def apply(signal: CancellationSignal) -> Any:
        port.calls.append("apply")
        if isinstance(applied, Exception):
            raise applied
        return applied

    return ctx.effects.ensure("k", "kind", {"a": 1}, observe, apply)


def test_ensure_observes_before_it_applies() -> None:
    port = RecordingPort()
    record = ensure(context(port), port, "not_applied", EffectOutcome("applied", {"id": 7}))
    assert port.calls == [
        "reserve k",
        "begin",
        "observe",
        "apply",
        "settle applied observed=False",
    ]
    assert record.applied
    assert record.result == {"id": 7}


def test_an_observed_effect_is_never_applied() -> None:
    port = RecordingPort(stored="ambiguous")
    assert ensure(context(port), port, "applied", "applied").applied
    assert port.calls == ["reserve k", "begin", "observe", "settle applied observed=True"]


def test_a_settled_effect_runs_nothing() -> None:
    port = RecordingPort(stored="applied")
    assert ensure(context(port), port, "not_applied", "applied").applied
    assert port.calls == ["reserve k"]


@pytest.mark.parametrize(
    ("observed", "applied", "expected"),
    [
        ("indeterminate", "applied", ["observe", "settle indeterminate observed=True"]),
        (
            "not_applied",
            "indeterminate",
            ["observe", "apply", "settle indeterminate observed=False"],
        ),
    ],
)
def test_an_indeterminate_outcome_leaves_the_effect_ambiguous_and_raises(
    observed: str, applied: str, expected: list[str]
) -> None:
    port = RecordingPort()
    with pytest.raises(EffectIndeterminateError):
        ensure(context(port), port, observed, applied)
    assert port.calls[2:] == expected


def test_an_apply_that_raises_counts_as_indeterminate() -> None:
    port = RecordingPort()
    with pytest.raises(OSError, match="disk"):
        ensure(context(port), port, "not_applied", OSError("disk"))
    assert port.calls[-1] == "settle indeterminate observed=False"


def test_a_bad_observation_is_refused_and_a_cancelled_reconcile_reserves_nothing() -> None:
    port = RecordingPort()
    with pytest.raises(ValueError, match="expected one of"):
        ensure(context(port), port, "maybe", "applied")
    signal = CancellationSignal()
    signal.cancel("timed_out")
    port = RecordingPort()
    with pytest.raises(NodeCancelledError):
        ensure(context(port, signal), port, "not_applied", "applied")
    assert port.calls == []


MANAGER = """
from piwf.resource import define_resource_manager, settled
manager = define_resource_manager(name={name!r}, initial_status=lambda spec: {{}},
                                  reconcile=lambda ctx, resource: settled())
"""


def test_discovery_prefers_the_project_and_checks_the_name(tmp_path: Path) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    (project / ".piwf" / "resource_managers").mkdir(parents=True)
    (home / "resource_managers").mkdir(parents=True)
    (home / "resource_managers" / "greeting.py").write_text(MANAGER.format(name="greeting"))
    assert discovered_path("greeting", project, home).parent == home / "resource_managers"
    local = project / ".piwf" / "resource_managers" / "greeting.py"
    local.write_text(MANAGER.format(name="greeting"))
    assert discovered_path("greeting", project, home) == local.absolute()
    loaded = find_and_load("greeting", project, home)
    assert loaded.definition.name == "greeting"
    assert len(loaded.sha256) == 64
    local.write_text(MANAGER.format(name="other"))
    with pytest.raises(ResourceManagerLoadError, match="name the file after its manager"):
        find_and_load("greeting", project, home)
    local.write_text("def broken(:\n")
    with pytest.raises(ResourceManagerLoadError, match="compile"):
        find_and_load("greeting", project, home)
    with pytest.raises(ResourceManagerLoadError, match="no resource manager named"):
        discovered_path("missing", project, home)
    with pytest.raises(ResourceManagerLoadError, match="not a resource manager name"):
        discovered_path("../escape", project, home)
    twice = (
        textwrap.dedent(MANAGER.format(name="greeting"))
        + "second = manager.__class__(**vars(manager))\n"
    )
    local.write_text(twice)
    with pytest.raises(ResourceManagerLoadError, match="defines 2"):
        find_and_load("greeting", project, home)


def test_result_frames_are_validated() -> None:
    assert ReconcileFinish.model_validate({"kind": "requeueAfter", "afterMs": 10}).after_ms == 10
    for bad in (
        {"kind": "requeueAfter"},
        {"kind": "settled", "afterMs": 10},
        {"kind": "settled", "extra": 1},
        {"kind": "settled", "patch": {"finalizers": ["bad name"]}},
        {"kind": "settled", "patch": {"status": {"x": "y" * (256 * 1024)}}},
        {
            "kind": "settled",
            "patch": {"conditions": [{"type": "Ready", "status": "yes", "reason": "r"}]},
        },
        {"kind": "done"},
    ):
        with pytest.raises(ValidationError):
            ReconcileFinish.model_validate(bad)
    with pytest.raises(ValidationError):
        ChildFrame.model_validate(
            {
                "schema": "piwf.resource.v1",
                "kind": "ready",
                "reconcileId": "r",
                "generation": 1,
                "surprise": True,
            }
        )


# conformance: X8
def test_the_server_never_loads_manager_code() -> None:
    """Only child entry points may call the manager loader; the server only computes paths
    and hashes (``discovered_path``, ``file_sha256``)."""
    package = Path(__file__).resolve().parents[2] / "piwf"
    loaders = {"load_manager", "find_and_load"}
    for module in sorted((package / "server").rglob("*.py")):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "piwf.resource.discovery":
                assert not loaders & {alias.name for alias in node.names}, module.name
            if isinstance(node, ast.Name):
                assert node.id not in loaders and node.id != "exec", module.name
