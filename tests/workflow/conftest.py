"""Shared helpers for the workflow tests: fixture paths, a crash marker."""

from __future__ import annotations

from pathlib import Path

from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.definition import WorkflowDefinition
from piwf.workflow.sources import LoadedWorkflow, load_workflow

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "workflows"


class Crash(BaseException):
    """Stands for the runner process dying: it escapes the engine like a kill would."""


def load_fixture(name: str) -> LoadedWorkflow:
    return load_workflow(FIXTURES / f"{name}.py")


def compiled(definition: WorkflowDefinition) -> CompiledWorkflow:
    return compile_workflow(definition)
