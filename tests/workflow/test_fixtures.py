"""Fixtures the contract suite does not run: the builtin, the agent step, the mounted children.

The other fixtures of ``fixtures/workflows`` run in ``tests/contract`` on both ports. An agent
request is submitted to on the memory port here (in-process ``validate``); through the server,
in ``tests/server/test_submissions.py``.
"""

from __future__ import annotations

from piwf.workflow.commands import ContinueCommand
from piwf.workflow.engine import execute
from piwf.workflow.memory import run_in_memory
from piwf.workflow.port import AnsweredBy, InteractionKind, RunStatus
from piwf.workflow.sources import BUILTIN_DIR, load_workflow
from piwf.workflow.validation import Accepted, Rejected

from .conftest import load_fixture


def test_builtin_noop() -> None:
    result, _ = run_in_memory(load_workflow(BUILTIN_DIR / "noop.py").compiled, {"x": 1})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"input": {"x": 1}})


def test_agent_validate_rejects_then_normalises() -> None:
    loaded = load_fixture("agent_validate")
    result, port = run_in_memory(loaded.compiled, {"topic": "tides"})
    request_id = result.request_id
    assert request_id is not None
    request = port.requests[request_id]
    assert request.kind is InteractionKind.AGENT
    assert isinstance(request.content, dict)
    prompt = str(request.content["prompt"])
    assert prompt.startswith("Summarise tides in one sentence.\n\nWorkflow step contract")
    assert request.timeout_ms == 15 * 60_000
    rejected = port.submit(loaded.compiled, request_id, {"summary": "   "})
    assert isinstance(rejected, Rejected) and "non-empty text" in rejected.error
    pending = port.read_run("dry-run")
    assert pending is not None and pending.pending is not None
    assert pending.pending.answered is False  # a rejection leaves the same request open
    accepted = port.submit(loaded.compiled, request_id, {"summary": "  The moon pulls the sea.  "})
    assert accepted == Accepted({"summary": "The moon pulls the sea."})
    assert [type(s.verdict) for s in port.submissions] == [Rejected, Accepted]
    done = execute(ContinueCommand("dry-run", request_id), loaded.compiled, port)
    assert (done.status, done.output) == (
        RunStatus.COMPLETED,
        {"summary": "The moon pulls the sea."},
    )


def test_the_engine_returns_an_answered_agent_request_without_validating_it() -> None:
    loaded = load_fixture("agent_validate")
    result, port = run_in_memory(loaded.compiled, {"topic": "tides"})
    assert result.request_id is not None
    # An answer that validate would refuse: the engine consumes it as stored (the server's
    # validation child, or MemoryPort.submit, is where validate runs).
    port.answer(result.request_id, {"summary": "   "}, answered_by=AnsweredBy.CLIENT)
    done = execute(ContinueCommand("dry-run", result.request_id), loaded.compiled, port)
    assert (done.status, done.output) == (RunStatus.COMPLETED, {"summary": "   "})


def test_mounted_child_fixtures_run_on_their_own() -> None:
    result, _ = run_in_memory(load_fixture("docs").compiled, {"root": "/r"})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"documented": "/r"})
    result, _ = run_in_memory(load_fixture("workspace").compiled, {"root": "/w"})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"inspected": "/w"})
