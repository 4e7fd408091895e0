"""One vocabulary: each lifecycle and result declared once, the runner operations derived.

The enums that mirror a table's CHECK list are compared with the DDL in
``tests/state/test_schema.py``; this module checks what the DDL cannot see: that no lifecycle or
result class is declared twice, that the narrower vocabularies stay inside the wider ones, that
the wire literals mirror their enums, and that every list of runner operations (codec, store
dispatch, runner port, docs) is the declaration's.
"""

from __future__ import annotations

import ast
import enum
import importlib
import importlib.util
import inspect
import pkgutil
import re
import types
import typing
from collections import defaultdict
from pathlib import Path

import pytest

import piwf
from piwf import lifecycle
from piwf.protocol import client_v1, payloads, runner_v1
from piwf.protocol.runner_v1 import (
    AGENT_OPERATIONS,
    BATCH_OPERATION,
    CONTENT_OPERATIONS,
    OPERATIONS,
    PORT_OPERATIONS,
    STEPS_OPERATION,
)
from piwf.resource.definition import ResultKind
from piwf.runner.workflow_runner import PipePort
from piwf.state import enums
from piwf.state.execution import calls
from piwf.workflow import port
from piwf.workflow.failure import FailureKind
from piwf.workflow.nodes import Recovery

PACKAGE = Path(piwf.__file__).parent
DOCS = PACKAGE.parent / "docs"


#: Modules that import an optional extra's package (module -> that package): read only where
#: the extra is installed (the ``mcp`` and ``view`` tox environments install them).
NEEDS_EXTRA = {
    "piwf.mcp.server": "mcp",
    "piwf.viewer": "textual",
    "piwf.viewer.answer": "textual",
    "piwf.viewer.app": "textual",
    "piwf.viewer.graph": "textual",  # the package imports its app first
    "piwf.viewer.run_list": "textual",
    "piwf.viewer.run_screen": "textual",
    "piwf.relay.bridge": "websockets",
    "piwf.relay.server": "websockets",
}


def piwf_modules() -> list[types.ModuleType]:
    return [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(piwf.__path__, "piwf.")
        if not info.name.startswith("piwf.cli")  # click commands import nothing of this
        and (
            info.name not in NEEDS_EXTRA
            or importlib.util.find_spec(NEEDS_EXTRA[info.name]) is not None
        )
    ]


def test_no_result_class_is_declared_twice() -> None:
    declared: dict[str, list[str]] = defaultdict(list)
    for module in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name in lifecycle.__all__:
                declared[node.name].append(str(module.relative_to(PACKAGE)))
    doubled = {name: where for name, where in declared.items() if where != ["lifecycle.py"]}
    assert not doubled, f"lifecycle names declared outside piwf/lifecycle.py: {doubled}"


def test_no_two_enums_have_the_same_values() -> None:
    by_values: dict[frozenset[str], list[str]] = defaultdict(list)
    for module in piwf_modules():
        for name, value in vars(module).items():
            declared_here = inspect.isclass(value) and value.__module__ == module.__name__
            if declared_here and issubclass(value, enum.Enum):
                by_values[frozenset(str(m.value) for m in value)].append(
                    f"{module.__name__}.{name}"
                )
    doubled = [names for names in by_values.values() if len(names) > 1]
    assert not doubled, f"one lifecycle declared twice: {doubled}"


@pytest.mark.parametrize(
    ("narrow", "wide"),
    [
        # What a workflow effect may declare; the store also knows a resource manager's observe.
        (Recovery, enums.EffectRecovery),
        # How a runner may settle an attempt; recovery also closes attempts ``interrupted``.
        (port.EffectOutcome, enums.EffectAttemptOutcome),
        # What a reconcile may return; the store also records what became of it.
        (ResultKind, enums.ReconcileOutcome),
    ],
)
def test_a_boundary_vocabulary_stays_inside_its_lifecycle(
    narrow: type[enum.Enum], wide: type[enum.Enum]
) -> None:
    assert {m.value for m in narrow} < {m.value for m in wide}


@pytest.mark.parametrize(
    ("literal", "mirrored"),
    [
        (runner_v1.CallResponse.model_fields["outcome"].annotation, enums.RunnerMessageOutcome),
        (client_v1.Outcome, enums.CommandOutcome),
        (payloads.FailureKindName, FailureKind),
    ],
)
def test_wire_literals_mirror_their_enums(literal: object, mirrored: type[enum.Enum]) -> None:
    assert set(typing.get_args(literal)) == {m.value for m in mirrored}


def test_str_enums_read_as_their_values() -> None:
    assert str(lifecycle.RunStatus.TIMED_OUT) == "timed_out"
    assert f"{enums.FailureClass.CLAIM_LOST}" == "claimLost"
    assert lifecycle.RunStatus("parked") is lifecycle.RunStatus.PARKED


def test_the_port_is_the_declared_operations() -> None:
    methods = {
        name
        for name, _ in inspect.getmembers(port.WorkflowPort, inspect.isfunction)
        if not name.startswith("_")
    }
    assert methods == {op.name for op in PORT_OPERATIONS}
    agent_calls = tuple(op.name for op in AGENT_OPERATIONS)
    declared = (
        tuple(op.name for op in PORT_OPERATIONS)
        + CONTENT_OPERATIONS
        + (STEPS_OPERATION,)
        + agent_calls
    )
    assert (*declared, BATCH_OPERATION) == OPERATIONS
    messages = [op.message for op in PORT_OPERATIONS]
    assert len(set(messages)) == len(messages), "each operation carries its own message type"


def test_the_runner_port_implements_every_declared_operation() -> None:
    for op in PORT_OPERATIONS:
        assert callable(getattr(PipePort, op.name, None)), op.name


def test_the_store_applies_exactly_the_state_changing_operations() -> None:
    changing = [op for op in PORT_OPERATIONS if op.changes_state]
    assert set(calls._APPLY) == {op.name for op in changing}
    for op in changing:
        assert calls._APPLY[op.name].__name__ == f"apply_{op.name}"


def _table_rows(document: str, heading: str) -> list[list[str]]:
    text = (DOCS / document).read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_docs_operations_table_is_the_declaration() -> None:
    rows = _table_rows("EXECUTION.md", "Runner operations")
    documented = [(row[0].strip("`"), row[1].strip("`"), row[2]) for row in rows]
    declared = [
        (op.name, op.message.__name__, "change" if op.changes_state else "read")
        for op in PORT_OPERATIONS
    ]
    assert documented[: len(declared)] == declared
    rest = documented[len(declared) :]
    assert {name for name, _, kind in rest if kind == "transfer"} == set(CONTENT_OPERATIONS)
    paged = [(name, message) for name, message, kind in rest if kind == "read (paged)"]
    assert [name for name, _ in paged] == [STEPS_OPERATION]
    assert paged[0][1].startswith(f"{runner_v1.StepsRead.__name__}`:")
    agent_calls = [(name, message) for name, message, kind in rest if kind.startswith("agent")]
    assert agent_calls == [(op.name, op.message.__name__) for op in AGENT_OPERATIONS]
    assert len(documented) == len(OPERATIONS)


def test_the_store_transition_table_names_every_applier() -> None:
    rows = _table_rows("EXECUTION_STATE.md", "The transaction contract of a port message")
    documented = [re.sub(r"^apply_", "", row[0].strip("`")) for row in rows]
    assert documented == [op.name for op in PORT_OPERATIONS if op.changes_state]
