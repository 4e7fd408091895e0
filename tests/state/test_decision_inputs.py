"""Choices that carry a text input, at the store: kept with the choices, checked on answer.

The real engine parks the run on a real database (tests/state/test_execution_support.py); the
answers go through ``answer_request`` as the server's handler sends them.
"""

from __future__ import annotations

from piwf import canonical
from piwf.decision_answers import TextInput
from piwf.state import StateDatabase
from piwf.state import decisions as decision_store
from piwf.state import execution as ex
from piwf.state.enums import SubmissionOutcome
from piwf.workflow import choice, compute, define_workflow, human_decision, text_input
from piwf.workflow.compiler import CompiledWorkflow

from .test_decisions import answer, audit, decision_flow, outcome_of, park
from .test_execution_support import compiled, dump, revision, violations

INPUT = TextInput(name="instructions", prompt="What should change?", max_chars=30)


def replan_flow() -> CompiledWorkflow:
    return compiled(
        define_workflow(
            name="replanning",
            start_at="approve",
            nodes={
                "approve": human_decision(
                    choices={
                        "continue": "Continue",
                        "replan": choice(
                            "Replan",
                            input=text_input("instructions", prompt=INPUT.prompt, max_chars=30),
                        ),
                    }
                ),
                "go": compute(lambda ctx: "as planned"),
                "plan": compute(lambda ctx: ctx.outputs["approve"]["instructions"]),
            },
            edges=[
                {
                    "from": "approve",
                    "switch": {
                        "on": "$output.choice",
                        "cases": {"continue": "go", "replan": "plan"},
                    },
                }
            ],
        )
    )


def choices_blob(db: StateDatabase, request_id: str) -> object:
    with db.read() as tx:
        row = tx.one(
            "SELECT b.content FROM human_decisions d JOIN blobs b ON b.blob_hash = d.choices_hash"
            " WHERE d.decision_id = ?",
            (request_id,),
        )
    assert row is not None
    return canonical.parse(bytes(row[0]))


def test_the_inputs_are_stored_with_the_choices_and_read_back(db: StateDatabase) -> None:
    request_id = park(db, replan_flow())
    assert choices_blob(db, request_id) == {
        "continue": "Continue",
        "replan": {"label": "Replan", "input": INPUT.to_json()},
    }
    with db.read() as tx:
        decision = decision_store.get_decision(tx, request_id)
        (listed,) = ex.list_open_requests(tx, "run-1")
    assert decision is not None
    assert decision.choices == {"continue": "Continue", "replan": "Replan"}
    assert dict(decision.inputs) == {"replan": INPUT}
    assert listed.inputs == {"replan": INPUT.to_json()}
    assert audit(db).to_json()["inputs"] == {"replan": INPUT.to_json()}


def test_a_decision_without_inputs_keeps_its_stored_choices_as_before(db: StateDatabase) -> None:
    request_id = park(db, decision_flow())
    assert choices_blob(db, request_id) == {"ship": "Ship it", "hold": "Hold back"}
    with db.read() as tx:
        (listed,) = ex.list_open_requests(tx, "run-1")
    assert listed.inputs is None and listed.to_json()["inputs"] is None


def test_a_refused_input_settles_nothing_and_a_valid_one_wins(db: StateDatabase) -> None:
    request_id = park(db, replan_flow())
    before = revision(db, "run-1")
    for response, reason in [
        ({"choice": "replan"}, "needs its input 'instructions'"),
        ({"choice": "replan", "instructions": "\t"}, "must not be empty"),
        ({"choice": "replan", "instructions": "y" * 31}, "is 31 characters; at most 30"),
        ({"choice": "continue", "instructions": "no"}, "which takes no input"),
    ]:
        refused = outcome_of(answer(db, request_id, response))
        assert refused.outcome is SubmissionOutcome.REJECTED
        assert refused.reason is not None and reason in refused.reason
        assert refused.resolution is None
    assert revision(db, "run-1") == before, "a refused answer does not touch the run"
    state = dump(db)
    assert state["human_decision_resolutions"] == []
    won = outcome_of(answer(db, request_id, {"choice": "replan", "instructions": "smaller"}))
    assert won.outcome is SubmissionOutcome.WON
    assert won.resolution is not None
    assert won.resolution.response == {"choice": "replan", "instructions": "smaller"}
    assert violations(db) == []
