"""A run's audit carries each decision's and agent request's newest submissions and how many
it has: a request refused thousands of times still answers ``run.get`` within one frame.

Real servers; the answers and submissions go through the client protocol, and ``piwf run
show`` (the installed script) reads the audit back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server.harness import RawClient, ServerProcess, raw_client, wait_for
from tests.server.test_content_refs import piwf_cli, raw_receipt, server  # noqa: F401
from tests.server.test_execution import run_view, start, write_workflow
from tests.server.test_submissions import agent_workflow, submit, waiting_agent_request

#: The newest submissions ``run.get`` shows of each decision and agent request.
SHOWN = 20

DECIDE = """
from piwf.workflow import define_workflow, human_decision

workflow = define_workflow(
    name="decide",
    start_at="ask",
    nodes={"ask": human_decision(choices=["ship", "hold"])},
    edges=[],
)
"""


def pending_request(client: RawClient, run_id: str) -> str | None:
    listed = raw_receipt(client, "requests.list", run_id, {"runId": run_id})["requests"]
    return str(listed[0]["requestId"]) if listed else None


def test_a_decision_refused_many_times_shows_its_newest_answers_and_counts_them_all(
    server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = write_workflow(tmp_path, "decide", DECIDE)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "decide")
        request_id = wait_for(lambda: pending_request(client, run_id), what="the decision")
        for number in range(25):
            answer = {"requestId": request_id, "response": {"choice": f"no{number}"}}
            refused = client.request("decision.answer", answer, key=f"wrong-{number}")
            assert refused.outcome == "rejected", refused
        won = {"requestId": request_id, "response": {"choice": "ship"}}
        assert client.request("decision.answer", won, key="right").outcome == "accepted"
        view = run_view(client, run_id)

    [decision] = view["decisions"]
    assert decision["submissionCount"] == 26
    responses = [item["response"] for item in decision["submissions"]]
    # The newest, oldest first: the last 19 refusals, then the winner.
    assert responses == [{"choice": f"no{n}"} for n in range(6, 25)] + [{"choice": "ship"}]
    assert len(responses) == SHOWN

    shown = piwf_cli(server, "run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"submissions  the newest {SHOWN} of 26: rejected, " in shown.stdout


def test_an_agent_request_refused_many_times_shows_its_newest_submissions_numbered(
    server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = agent_workflow(tmp_path)
    with raw_client(server) as client:
        run_id = start(client, workflow, {"what": "sheep"}, "count")
        request_id = waiting_agent_request(client, run_id)["requestId"]
        for number in range(23):
            refused = submit(client, request_id, {"n": f"x{number}"}, key=f"wrong-{number}")
            assert refused.outcome == "rejected", refused
        view = run_view(client, run_id)

    [request] = view["agentRequests"]
    assert request["submissionCount"] == 23
    outputs: list[Any] = [item["output"] for item in request["submissions"]]
    assert outputs == [{"n": f"x{n}"} for n in range(3, 23)]

    shown = piwf_cli(server, "run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"(the newest {SHOWN} of 23 submissions)" in shown.stdout
    assert "    4. rejected at " in shown.stdout and "    23. rejected at " in shown.stdout
    assert "    3. rejected at " not in shown.stdout
