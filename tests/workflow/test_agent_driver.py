"""The engine hands committed agent requests to an injected driver (piwf.workflow.agent_driver).

Every test runs the real engine on the in-memory port; the drivers here answer the way the
runner's command driver does (through the port's own request, never around it).
"""

from __future__ import annotations

import pytest

from piwf.errors import WorkflowDefinitionError
from piwf.lifecycle import RunStatus
from piwf.workflow import agent, compute, define_workflow
from piwf.workflow.agent_driver import (
    AgentAccepted,
    AgentExpired,
    AgentFailed,
    AgentOutcome,
    AgentTurn,
)
from piwf.workflow.compiler import compile_workflow
from piwf.workflow.definition import WorkflowDefinition
from piwf.workflow.memory import MemoryPort, run_in_memory


def routed(command: list[str] | None = None) -> WorkflowDefinition:
    return define_workflow(
        name="ask",
        start_at="ask",
        nodes={
            "ask": agent(prompt="Summarise.", expected_output='{"summary": str}', command=command),
            "done": compute(lambda ctx: {"got": ctx.outputs["ask"]}),
            "recover": compute(lambda ctx: {"error": ctx.results["ask"].error}),
        },
        edges=[
            {
                "from": "ask",
                "switch": {
                    "on": "$result.outcome",
                    "cases": {"ok": "done", "failed": "recover", "timed_out": "recover"},
                },
            }
        ],
    )


class Driver:
    """Records every turn; answers the port's request first when it accepts, like a submit."""

    def __init__(self, port: MemoryPort, outcome: AgentOutcome | None) -> None:
        self.port = port
        self.outcome = outcome
        self.turns: list[AgentTurn] = []

    def drive(self, turn: AgentTurn) -> AgentOutcome | None:
        self.turns.append(turn)
        if isinstance(self.outcome, AgentAccepted):
            self.port.answer(turn.request_id, self.outcome.value)
        return self.outcome


def test_without_a_driver_an_agent_step_waits_for_an_outside_submission() -> None:
    result, port = run_in_memory(routed())
    assert result.status is RunStatus.WAITING
    assert result.request_id is not None and result.request_id in port.requests


def test_a_driver_with_nothing_to_run_leaves_the_step_waiting() -> None:
    port = MemoryPort()
    driver = Driver(port, None)
    result, _ = run_in_memory(routed(), port=port, agents=driver)
    assert result.status is RunStatus.WAITING
    [turn] = driver.turns
    assert (turn.path, turn.visit, turn.attempt, turn.resumed) == ("ask", 1, 1, False)
    assert turn.request_id == result.request_id
    assert turn.prompt.startswith("Summarise.\n") and turn.request_id in turn.prompt


def test_an_accepted_submission_is_the_node_output_and_the_run_continues() -> None:
    port = MemoryPort()
    driver = Driver(port, AgentAccepted({"summary": "tides"}))
    workflow = routed(["my-agent", "--quiet"])
    result, _ = run_in_memory(workflow, port=port, agents=driver)
    assert result.status is RunStatus.COMPLETED
    assert result.output == {"got": {"summary": "tides"}}
    assert driver.turns[0].command == ("my-agent", "--quiet")


@pytest.mark.parametrize(
    ("outcome", "text"),
    [
        (AgentFailed("missingSubmission: request r ended 3 turns"), "missingSubmission"),
        (AgentExpired("request r reached its active-time deadline"), "deadline"),
    ],
)
def test_a_failed_or_expired_turn_routes_on_the_result_outcome(
    outcome: AgentOutcome, text: str
) -> None:
    port = MemoryPort()
    result, _ = run_in_memory(routed(), port=port, agents=Driver(port, outcome))
    assert result.status is RunStatus.COMPLETED
    assert isinstance(result.output, dict) and text in str(result.output["error"])


def test_the_node_command_is_checked_when_defined_and_is_part_of_the_snapshot() -> None:
    for bad in ([], "claude -p", [""], ["ok", 3], ["nul\x00"]):
        with pytest.raises(WorkflowDefinitionError, match="command"):
            agent(prompt="p", expected_output="{}", command=bad)  # type: ignore[arg-type]
    with_command = compile_workflow(routed(["a", "b"]))
    without = compile_workflow(routed())
    assert with_command.nodes["ask"].node.structure()["command"] == ["a", "b"]
    assert without.nodes["ask"].node.structure()["command"] is None
    assert with_command.digest != without.digest
