"""A protected decision whose choice carries a text input, through a real server and runner.

The server checks the input when the answer arrives: a missing, empty, oversized or unknown
input is refused with ``answerRejected`` and the run, its request and the decision's winner stay
as they were (the refused candidate is kept in the decision's audit, as every refused answer
is). An answer with its input wins, and the input reaches the node output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ServerProcess, raw_client
from tests.server.test_decisions import answer, waiting_request, winners
from tests.server.test_execution import (
    fast_server,  # noqa: F401 - a fixture used by name
    query,
    run_view,
    start,
    wait_run,
)

REPLAN = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "replan_decision.py")


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ({"choice": "replan"}, "choice 'replan' needs its input 'instructions'"),
        ({"choice": "replan", "instructions": " \n "}, "must not be empty"),
        ({"choice": "replan", "instructions": "x" * 201}, "is 201 characters; at most 200"),
        ({"choice": "replan", "instructions": "ok", "urgent": True}, "unknown input(s) 'urgent'"),
        ({"choice": "continue", "instructions": "ok"}, "which takes no input"),
    ],
    ids=["missing", "empty", "oversized", "unknown", "not-taken"],
)
def test_an_answer_without_a_valid_input_is_refused_and_changes_nothing(
    fast_server: ServerProcess,  # noqa: F811
    response: dict[str, Any],
    reason: str,
) -> None:
    with raw_client(fast_server) as client:
        run_id = start(client, REPLAN, {}, "replan")
        request = waiting_request(client, run_id)
        assert request["inputs"] == {
            "replan": {
                "kind": "text",
                "name": "instructions",
                "prompt": "What should change?",
                "maxChars": 200,
            }
        }
        before = run_view(client, run_id)["run"]
        refused = answer(client, request["requestId"], response, "bad")
        assert refused.outcome == "rejected", refused
        assert refused.error is not None and refused.error.code == "answerRejected"
        assert reason in refused.error.message
        assert "xxxx" not in refused.error.message, "the refusal never echoes the text sent"
        after = run_view(client, run_id)
        listed = client.request("requests.list", {"runId": run_id}).receipt
    assert (after["run"]["status"], after["run"]["revision"]) == ("waiting", before["revision"])
    assert after["waitingOn"]["requestId"] == request["requestId"]
    assert listed is not None and [r["requestId"] for r in listed["requests"]] == [
        request["requestId"]
    ]
    assert winners(fast_server, request["requestId"]) == []
    status = query(
        fast_server,
        "SELECT status, answer_hash IS NULL FROM interactive_requests WHERE request_id = ?",
        (request["requestId"],),
    )
    assert status == [("pending", 1)]


def test_an_answer_with_its_input_wins_and_the_input_reaches_the_output(
    fast_server: ServerProcess,  # noqa: F811
) -> None:
    response = {"choice": "replan", "instructions": "split step 2 in two"}
    with raw_client(fast_server) as client:
        run_id = start(client, REPLAN, {}, "replan")
        request = waiting_request(client, run_id)
        refused = answer(client, request["requestId"], {"choice": "replan"}, "h0")
        assert refused.outcome == "rejected"
        won = answer(client, request["requestId"], response, "h1")
        assert won.outcome == "accepted" and won.receipt["outcome"] == "won", won
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert (run["status"], view["output"]) == ("completed", {"plan": "split step 2 in two"})
    audit = view["decisions"][0]
    assert audit["inputs"]["replan"]["name"] == "instructions"
    assert audit["resolution"]["response"] == response
    assert [s["outcome"] for s in audit["submissions"]] == ["rejected", "won"]
    outputs = query(
        fast_server,
        "SELECT b.content FROM node_attempts a JOIN blobs b ON b.blob_hash = a.output_hash"
        " WHERE a.run_id = ? AND a.node_path = 'approve' AND a.status = 'completed'",
        (run_id,),
    )
    assert [json.loads(content) for (content,) in outputs] == [response]
