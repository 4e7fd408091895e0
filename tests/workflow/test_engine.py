"""Engine behaviour that needs no second port: a port that raises, and the shell executor.

Everything the engine proposes through a port (routing, limits, deadlines, effects, requests,
notifications, updates, resume and restart) is in the contract suite, ``tests/contract``, which
runs it on the memory port and on the server's store alike.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from piwf.errors import ClaimLostError
from piwf.workflow import compute, define_workflow, idempotent_effect, include, shell
from piwf.workflow.memory import EffectStatus, MemoryPort, run_in_memory
from piwf.workflow.port import (
    NodeFailed,
    NodeFinished,
    PortResult,
    RunFinished,
    RunStatus,
    UpdatePublished,
)


def single(name: str, node: Any) -> Any:
    return define_workflow(name="single", start_at=name, nodes={name: node}, edges=[])


class ClaimLosingPort(MemoryPort):
    def publish_update(self, message: UpdatePublished) -> PortResult:
        raise ClaimLostError("generationChanged", message.run_id, 2)


def test_port_errors_stop_the_run_even_when_workflow_code_swallows_them() -> None:
    def careless(ctx: Any) -> Any:
        try:
            ctx.publish_update("progress", "k", 1)
        except Exception:
            return "swallowed"
        return "unreachable"

    port = ClaimLosingPort()
    with pytest.raises(ClaimLostError):
        run_in_memory(single("a", compute(careless)), port=port)
    assert not [m for m in port.messages if isinstance(m, (NodeFinished, NodeFailed))]


PRINT_MANY = "import sys; sys.stdout.write('x' * 100); sys.stderr.write('e'); sys.exit(CODE)"


def shell_node(code: int, **options: Any) -> Any:
    return shell(
        effect=idempotent_effect("shell.test"),
        command=[sys.executable, "-c", PRINT_MANY.replace("CODE", str(code))],
        **options,
    )


def test_a_nonzero_exit_completes_when_allowed() -> None:
    allowed, port = run_in_memory(single("run", shell_node(3, allow_nonzero_exit=True)))
    assert allowed.status is RunStatus.COMPLETED
    assert isinstance(allowed.output, dict) and allowed.output["exit_code"] == 3
    (effect,) = port.effects_of("dry-run")
    assert effect.status is EffectStatus.APPLIED


def test_shell_output_is_capped() -> None:
    result, _ = run_in_memory(single("run", shell_node(0, max_output_chars=10)))
    assert isinstance(result.output, dict)
    assert result.output["stdout"] == "x" * 10
    assert result.output["stdout_truncated"] is True
    assert (result.output["stderr"], result.output["stderr_truncated"]) == ("e", False)


def test_shell_deadline_kills_the_process_group() -> None:
    node = shell(
        effect=idempotent_effect("shell.sleep"),
        command=[sys.executable, "-c", "import threading; threading.Event().wait(30)"],
        timeout_ms=200,
    )
    result, port = run_in_memory(single("run", node))
    assert result.status is RunStatus.TIMED_OUT
    (effect,) = port.effects_of("dry-run")
    assert effect.status is EffectStatus.REJECTED


def test_shell_command_that_cannot_start_fails_the_node() -> None:
    node = shell(effect=idempotent_effect("shell.none"), command=["/nonexistent/piwf-binary"])
    result, _ = run_in_memory(single("run", node))
    assert result.status is RunStatus.FAILED
    assert result.error is not None and "cannot start '/nonexistent/piwf-binary'" in result.error


def _refuses(raw: Any) -> Any:
    raise ValueError("a release needs a 'service'")


def test_only_a_refused_run_input_finishes_as_input_rejected() -> None:
    """The root workflow's refusal of the run's input is ``input_rejected`` (the server's
    ``inputRejected``); a mounted workflow refusing what its include mapped for it is a
    failure of the workflow itself (``nodeFailed``), which no other input would change."""
    child = define_workflow(
        name="child", start_at="go", input=_refuses, nodes={"go": compute(lambda c: 1)}, edges=[]
    )
    parent = define_workflow(
        name="parent",
        start_at="first",
        nodes={"first": compute(lambda ctx: {})},
        includes={"sub": include(child, input=lambda ctx: {})},
        edges=[{"from": "first", "to": "sub"}],
    )
    cases = {"root": define_workflow(**{**_SINGLE, "input": _refuses}), "mount": parent}
    finishes = {}
    for where, workflow in cases.items():
        result, port = run_in_memory(workflow, {"service": None})
        assert result.status is RunStatus.FAILED
        (finished,) = [m for m in port.messages if isinstance(m, RunFinished)]
        finishes[where] = (finished.input_rejected, finished.error)
    assert finishes["root"] == (
        True,
        "input rejected by workflow 'single': ValueError: a release needs a 'service'",
    )
    assert finishes["mount"] == (
        False,
        "input rejected by workflow 'child': ValueError: a release needs a 'service'",
    )


_SINGLE: dict[str, Any] = {
    "name": "single",
    "start_at": "a",
    "nodes": {"a": compute(lambda ctx: 1)},
    "edges": [],
}
