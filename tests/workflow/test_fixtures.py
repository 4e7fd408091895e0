"""Fixtures the contract suite does not run: the builtin, the agent step, the mounted children.

The other fixtures of ``fixtures/workflows`` run in ``tests/contract`` on both ports. An agent
request can only be answered on the memory port until sessions land.
"""

from __future__ import annotations

from piwf.workflow.commands import ContinueCommand
from piwf.workflow.engine import execute
from piwf.workflow.memory import run_in_memory
from piwf.workflow.port import AnsweredBy, InteractionKind, RunStatus
from piwf.workflow.sources import BUILTIN_DIR, load_workflow

from .conftest import load_fixture


def test_builtin_noop() -> None:
    result, _ = run_in_memory(load_workflow(BUILTIN_DIR / "noop.py").compiled, {"x": 1})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"input": {"x": 1}})


def test_agent_validate_rejects_then_normalises() -> None:
    loaded = load_fixture("agent_validate")
    result, port = run_in_memory(loaded.compiled, {"topic": "tides"})
    assert result.request_id is not None
    request = port.requests[result.request_id]
    assert request.kind is InteractionKind.AGENT
    assert isinstance(request.content, dict)
    assert request.content["prompt"] == "Summarise tides in one sentence."
    assert request.timeout_ms == 15 * 60_000
    port.answer(result.request_id, {"summary": "   "}, answered_by=AnsweredBy.SESSION)
    rejected = execute(ContinueCommand("dry-run", result.request_id), loaded.compiled, port)
    assert rejected.status is RunStatus.WAITING
    assert rejected.request_id == result.request_id
    assert rejected.detail is not None and "non-empty text" in rejected.detail
    assert [r.request_id for r in port.rejections] == [result.request_id]
    port.answer(result.request_id, {"summary": "  The moon pulls the sea.  "})
    done = execute(ContinueCommand("dry-run", result.request_id), loaded.compiled, port)
    assert (done.status, done.output) == (
        RunStatus.COMPLETED,
        {"summary": "The moon pulls the sea."},
    )


def test_mounted_child_fixtures_run_on_their_own() -> None:
    result, _ = run_in_memory(load_fixture("docs").compiled, {"root": "/r"})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"documented": "/r"})
    result, _ = run_in_memory(load_fixture("workspace").compiled, {"root": "/w"})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"inspected": "/w"})
