"""Shared helpers for the workflow tests: fixture paths, a recording port, crash markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from piwf.workflow.compiler import CompiledWorkflow, compile_workflow
from piwf.workflow.definition import WorkflowDefinition
from piwf.workflow.memory import MemoryPort
from piwf.workflow.sources import LoadedWorkflow, load_workflow

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "workflows"


class Crash(BaseException):
    """Stands for the runner process dying: it escapes the engine like a kill would."""


def load_fixture(name: str) -> LoadedWorkflow:
    return load_workflow(FIXTURES / f"{name}.py")


def compiled(definition: WorkflowDefinition) -> CompiledWorkflow:
    return compile_workflow(definition)


@pytest.fixture
def port() -> MemoryPort:
    return MemoryPort()


class CrashingPort(MemoryPort):
    """A memory port that 'kills the runner' once, right after committing a chosen message.

    ``arm(kind, path)`` makes the next accepted message of that class (for that path) commit
    and then raise :class:`Crash`, the way a runner dies after the server committed its change.
    """

    def __init__(self) -> None:
        super().__init__()
        self._armed: tuple[type, str | None] | None = None

    def arm(self, kind: type, path: str | None = None) -> None:
        self._armed = (kind, path)

    def _accept(self, message: object) -> Any:
        result = super()._accept(message)
        armed = self._armed
        if (
            armed is not None
            and isinstance(message, armed[0])
            and armed[1] in (None, getattr(message, "path", None))
        ):
            self._armed = None
            raise Crash(f"runner died after {type(message).__name__}")
        return result
