"""The workflow authoring API.

A workflow is a Python module that exposes exactly one definition::

    from piwf.workflow import compute, define_workflow

    workflow = define_workflow(
        name="hello",
        start_at="greet",
        nodes={
            "greet": compute(lambda ctx: {"greeting": f"hello {ctx.input['who']}"}),
            "shout": compute(lambda ctx: ctx.outputs["greet"]["greeting"].upper()),
        },
        edges=[{"from": "greet", "to": "shout"}],
    )

The compiler (:mod:`piwf.workflow.compiler`), file loader (:mod:`piwf.workflow.sources`),
engine (:mod:`piwf.workflow.engine`), port (:mod:`piwf.workflow.port`) and in-memory port
(:mod:`piwf.workflow.memory`) live in their own modules. This package imports no storage and no
server code.
"""

from piwf.decision_answers import TextInput
from piwf.lifecycle import NotifyKind
from piwf.workflow.choices import Choice, choice, text_input
from piwf.workflow.context import (
    CancellationSignal,
    NodeCancelledError,
    NodeContext,
    NodeResult,
    Outcome,
)
from piwf.workflow.control_loops import ControlLoop, control_loop
from piwf.workflow.decisions import DecisionNode, decision, decision_edge
from piwf.workflow.definition import Include, WorkflowDefinition, define_workflow, include
from piwf.workflow.nodes import (
    Effect,
    NodeKind,
    Recovery,
    action,
    agent,
    assistant_message,
    checkpoint,
    compute,
    human_decision,
    idempotent_effect,
    manual_effect,
    notify,
    shell,
)
from piwf.workflow.retries import RetryPolicy, retry_policy
from piwf.workflow.settings import (
    SettingsPath,
    WorkflowSettings,
    allow_path,
    settings_route,
    workflow_settings,
)
from piwf.workflow.timers import sleep, wait_until

__all__ = [
    "CancellationSignal",
    "Choice",
    "ControlLoop",
    "DecisionNode",
    "Effect",
    "Include",
    "NodeCancelledError",
    "NodeContext",
    "NodeKind",
    "NodeResult",
    "NotifyKind",
    "Outcome",
    "Recovery",
    "RetryPolicy",
    "SettingsPath",
    "TextInput",
    "WorkflowDefinition",
    "WorkflowSettings",
    "action",
    "agent",
    "allow_path",
    "assistant_message",
    "checkpoint",
    "choice",
    "compute",
    "control_loop",
    "decision",
    "decision_edge",
    "define_workflow",
    "human_decision",
    "idempotent_effect",
    "include",
    "manual_effect",
    "notify",
    "retry_policy",
    "settings_route",
    "shell",
    "sleep",
    "text_input",
    "wait_until",
    "workflow_settings",
]
