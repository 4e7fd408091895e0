"""Every fixture runs to its expected end on the in-memory port."""

from __future__ import annotations

from piwf import canonical
from piwf.workflow.commands import ContinueCommand, ResumeCommand
from piwf.workflow.engine import execute
from piwf.workflow.memory import EffectStatus, MemoryPort, run_in_memory
from piwf.workflow.port import (
    AnsweredBy,
    InteractionKind,
    NodeStarted,
    ParkReason,
    RunStatus,
    message_to_json,
)

from .conftest import load_fixture


def started_paths(port: MemoryPort) -> list[tuple[str, int]]:
    return [(m.path, m.visit) for m in port.messages if isinstance(m, NodeStarted)]


def every_message_is_canonical_json(port: MemoryPort) -> None:
    for message in port.messages:
        canonical.encode(message_to_json(message))


def test_hello() -> None:
    result, port = run_in_memory(load_fixture("hello").compiled, {"who": "ada"})
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"shouted": "HELLO ADA"}
    assert started_paths(port) == [("greet", 1), ("shout", 1)]
    every_message_is_canonical_json(port)


def test_builtin_noop() -> None:
    from piwf.workflow.sources import BUILTIN_DIR, load_workflow

    result, _ = run_in_memory(load_workflow(BUILTIN_DIR / "noop.py").compiled, {"x": 1})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"input": {"x": 1}})


def test_loop_decision_visits_each_node_per_round() -> None:
    result, port = run_in_memory(load_fixture("loop_decision").compiled, {"rounds": 3})
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"published": 3}
    assert started_paths(port) == [
        ("draft", 1),
        ("review", 1),
        ("draft", 2),
        ("review", 2),
        ("draft", 3),
        ("review", 3),
        ("publish", 1),
    ]


def test_loop_decision_is_bounded_by_max_steps() -> None:
    result, port = run_in_memory(load_fixture("loop_decision").compiled, {"rounds": 50})
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert "exceeded max_steps=20" in result.error
    assert len(started_paths(port)) == 20


def test_composition_runs_both_mounts_with_distinct_effects() -> None:
    result, port = run_in_memory(load_fixture("composition").compiled, {"repo": "/repo"})
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"workspace": "/repo", "docs": "/repo/docs"}
    effects = port.effects_of("dry-run")
    assert [effect.path for effect in effects] == ["workspace/inspect", "docs/workspace/inspect"]
    assert effects[0].key != effects[1].key
    assert all(effect.status is EffectStatus.APPLIED for effect in effects)


def test_effects_idempotent_then_manual() -> None:
    result, port = run_in_memory(
        load_fixture("effects").compiled, {"service": "api", "change": "c-1"}
    )
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"posted": "deployed https://preview.invalid/api"}
    deploy, announce = port.effects_of("dry-run")
    assert (deploy.effect_type, deploy.recovery.value) == ("preview.deploy", "idempotent")
    assert deploy.request == {"service": "api", "key": "c-1"}
    assert (announce.effect_type, announce.recovery.value) == ("chat.post", "manual")


def test_shell_status_runs_a_subprocess() -> None:
    result, port = run_in_memory(load_fixture("shell_status").compiled)
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"major": 3}
    (effect,) = port.effects_of("dry-run")
    assert isinstance(effect.result, dict)
    assert effect.result["exit_code"] == 0
    assert effect.result["stdout"] == "3\n"


def test_checkpoint_parks_then_continue_completes() -> None:
    loaded = load_fixture("checkpoint_review")
    result, port = run_in_memory(loaded.compiled, {"steps": ["a", "b"]})
    assert result.status is RunStatus.WAITING
    assert result.park_reason is ParkReason.WAITING
    assert result.request_id is not None
    request = port.requests[result.request_id]
    assert request.kind is InteractionKind.CHECKPOINT
    assert request.content == {
        "summary": "Review the plan",
        "content": {"plan": {"steps": ["a", "b"]}},
    }
    port.answer(result.request_id, {"approved": True})
    done = execute(ContinueCommand("dry-run", result.request_id), loaded.compiled, port)
    assert done.status is RunStatus.COMPLETED
    assert done.output == {"applied": ["a", "b"], "note": {"approved": True}}


def test_decision_answered_by_a_person() -> None:
    loaded = load_fixture("decision_timeout")
    result, port = run_in_memory(loaded.compiled, {"release": "1.2"})
    assert result.status is RunStatus.WAITING
    assert result.request_id is not None
    assert port.requests[result.request_id].on_timeout == {
        "afterMs": 600000,
        "response": {"choice": "hold"},
    }
    port.answer(result.request_id, {"choice": "ship"})
    done = execute(ContinueCommand("dry-run", result.request_id), loaded.compiled, port)
    assert (done.status, done.output) == (RunStatus.COMPLETED, {"shipped": "1.2"})


def test_decision_settled_by_its_timeout_policy() -> None:
    loaded = load_fixture("decision_timeout")
    result, port = run_in_memory(loaded.compiled, {"release": "1.2"})
    assert result.request_id is not None
    port.answer_by_timeout_policy(result.request_id)
    saved = port.read_run("dry-run")
    assert saved is not None and saved.pending is not None
    assert saved.pending.answered_by is AnsweredBy.TIMEOUT_POLICY
    done = execute(ResumeCommand("dry-run"), loaded.compiled, port)
    assert (done.status, done.output) == (RunStatus.COMPLETED, {"held": "1.2"})


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


def test_failure_routes_on_result_outcome() -> None:
    compiled = load_fixture("failure_route").compiled
    broken, _ = run_in_memory(compiled, {"break": True})
    assert broken.status is RunStatus.COMPLETED
    assert broken.output == {"recovered_from": "RuntimeError: the fragile step broke"}
    fine, _ = run_in_memory(compiled, {})
    assert (fine.status, fine.output) == (RunStatus.COMPLETED, {"result": {"fine": True}})


def test_mounted_child_fixtures_run_on_their_own() -> None:
    result, _ = run_in_memory(load_fixture("docs").compiled, {"root": "/r"})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"documented": "/r"})
    result, _ = run_in_memory(load_fixture("workspace").compiled, {"root": "/w"})
    assert (result.status, result.output) == (RunStatus.COMPLETED, {"inspected": "/w"})
