"""The JSON codec of port messages: exact round trips, strict refusals."""

from __future__ import annotations

import pytest

from piwf.protocol.runner_v1 import PORT_OPERATIONS
from piwf.workflow import port
from piwf.workflow.context import Outcome
from piwf.workflow.failure import FailureKind, NodeFailure
from piwf.workflow.nodes import Recovery
from piwf.workflow.port_codec import PortCodecError, from_json, to_json

SAVED = port.SavedRun(
    run_id="run-1",
    status=port.RunStatus.RUNNING,
    input={"who": "ada"},
    steps=(port.StepRecord("a", 1, 1, Outcome.OK, {"x": [1, 2]}, None, 1, 2),),
    visits={"a": 1, "b": 2},
    active=port.ActiveVisit("b", 2, 3, 5, None),
    pending=port.PendingRequest(
        "request-1",
        "b",
        2,
        port.InteractionKind.CHECKPOINT,
        {"q": 1},
        True,
        {"a": 1},
        port.AnsweredBy.HUMAN,
    ),
)

MESSAGES = [
    port.NodeStarted("run-1", "a", 1, 2, "compute", 10, 500, 510),
    port.EffectReservation("run-1", "a", 1, "key", "svc.apply", Recovery.MANUAL, {"r": 1}, "ab"),
    port.RunFinished("run-1", port.RunStatus.COMPLETED, {"out": True}, None, "a"),
    port.NodeFailed("run-1", "a", 1, 1, Outcome.TIMED_OUT, "too slow", 9),
    port.NodeFailed(
        "run-1",
        "a",
        2,
        1,
        Outcome.FAILED,
        "KeyError: 'missing'",
        9,
        NodeFailure(
            FailureKind.EXCEPTION,
            "'missing'",
            "KeyError",
            traceback='  File "flow.py", line 3, in a\n    return t["missing"]\n',
        ),
    ),
]


@pytest.mark.parametrize("message", [SAVED, *MESSAGES], ids=lambda m: type(m).__name__)
def test_messages_round_trip_exactly(message: object) -> None:
    assert from_json(type(message), to_json(message)) == message


def test_every_port_method_is_a_declared_operation() -> None:
    methods = {name for name in dir(port.WorkflowPort) if not name.startswith("_")}
    assert methods == {op.name for op in PORT_OPERATIONS}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"visit": True}, "integer"),
        ({"visit": "1"}, "integer"),
        ({"kind": 7}, "string"),
        ({"surprise": 1}, "unknown field"),
    ],
)
def test_wrong_shapes_are_refused(change: dict[str, object], problem: str) -> None:
    value = to_json(MESSAGES[0])
    assert isinstance(value, dict)
    with pytest.raises(PortCodecError, match=problem):
        from_json(port.NodeStarted, {**value, **change})


def test_missing_fields_and_bad_enums_are_refused() -> None:
    value = to_json(MESSAGES[1])
    assert isinstance(value, dict)
    with pytest.raises(PortCodecError, match="missing field"):
        from_json(port.EffectReservation, {k: v for k, v in value.items() if k != "effect_key"})
    with pytest.raises(PortCodecError, match="not a Recovery"):
        from_json(port.EffectReservation, {**value, "recovery": "sometimes"})


def test_a_failure_record_of_another_kind_or_shape_is_refused() -> None:
    value = to_json(MESSAGES[-1])
    assert isinstance(value, dict) and isinstance(value["failure"], dict)
    with pytest.raises(PortCodecError, match="not a FailureKind"):
        from_json(port.NodeFailed, {**value, "failure": {**value["failure"], "kind": "oops"}})
    with pytest.raises(PortCodecError, match="unknown field 'locals'"):
        from_json(port.NodeFailed, {**value, "failure": {**value["failure"], "locals": {}}})
