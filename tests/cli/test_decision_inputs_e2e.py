"""``piwf requests`` / ``piwf answer`` for a decision whose choice carries an input, end to end.

The installed script against a real server (the fixture of tests/cli/test_cli_e2e.py starts
nothing itself; the first command autostarts the server, and the fixture stops and reaps it).
"""

from __future__ import annotations

import json
from typing import Any

from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 - a fixture used by name
from tests.server.harness import wait_for

REPLAN = "fixtures/workflows/replan_decision.py"
CHECKPOINT = "fixtures/workflows/checkpoint_review.py"
DECISION = "fixtures/workflows/decision_timeout.py"


def pending(cli: Piwf, run_id: str) -> dict[str, Any]:
    def listed() -> dict[str, Any] | None:
        found = cli.json("requests", "--run", run_id)["requests"]
        return found[0] if found else None

    request: dict[str, Any] = wait_for(listed, timeout_s=30, what="the decision request")
    return request


def test_a_person_answers_a_choice_with_its_input_through_the_cli(piwf: Piwf) -> None:  # noqa: F811
    run_id = piwf.json("run", "start", REPLAN)["run"]["runId"]
    request = pending(piwf, run_id)
    request_id = request["requestId"]
    assert request["inputs"]["replan"]["prompt"] == "What should change?"

    table = piwf.run("requests", "--run", run_id)
    assert table.returncode == 0, table.stderr
    assert 'replan (Replan; +"instructions": What should change?)' in table.stdout
    shown = piwf.run("run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "What should change?" in shown.stdout
    assert f'piwf answer {request_id} \'{{"choice":"replan","instructions":"..."}}\'' in (
        shown.stdout
    )

    refused = piwf.json("answer", request_id, '{"choice": "replan"}', exit_code=1)
    assert refused["error"]["code"] == "answerRejected"
    assert "needs its input 'instructions'" in refused["error"]["message"]
    plain = piwf.run("answer", request_id, '{"choice": "replan", "instructions": ""}')
    assert plain.returncode == 1 and "must not be empty" in plain.stderr
    assert pending(piwf, run_id)["requestId"] == request_id, "a refused answer changes nothing"

    won = piwf.json("answer", request_id, '{"choice": "replan", "instructions": "do less"}')
    assert won["outcome"] == "won"
    finished = piwf.json("run", "wait", run_id, "--timeout", "30")
    assert finished["run"]["status"] == "completed"
    assert piwf.json("run", "show", run_id)["output"] == {"plan": "do less"}


def test_piwf_requests_shows_what_a_checkpoint_asks(piwf: Piwf) -> None:  # noqa: F811
    """A person deciding from `piwf requests` sees the request's content (a plan to approve),
    not only its id and choices."""
    started = piwf.json("run", "start", CHECKPOINT, "--input", '{"steps": ["build", "ship"]}')
    run_id = started["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]

    listed = piwf.run("requests", "--run", run_id)
    assert listed.returncode == 0, listed.stderr
    block = listed.stdout.split("checkpoints and decisions:\n", 1)[1]
    assert f"  request  {request_id}\n" in block, listed.stdout
    assert (
        '  content  {"content":{"plan":{"steps":["build","ship"]}},"summary":"Review the plan"}'
        in block
    ), listed.stdout
    piwf.json("run", "cancel", run_id)


def test_request_content_and_answers_print_with_their_control_characters_escaped(
    piwf: Piwf,  # noqa: F811
) -> None:
    """JSON escapes only the C0 controls: a bidirectional override, a Unicode line separator
    or a C1 control (CSI) in a request's content or an answer would reach the terminal raw
    (reordering or driving it), so the human form shows them as escapes; --json keeps them."""
    raw = "a\u202eb\u2028c\x9b2J"
    escaped = "a\\u202eb\\u2028c\\x9b2J"
    started = piwf.json("run", "start", CHECKPOINT, "--input", json.dumps({"steps": [raw]}))
    run_id = started["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]

    listed = piwf.run("requests", "--run", run_id)
    assert listed.returncode == 0, listed.stderr
    assert f'{{"content":{{"plan":{{"steps":["{escaped}"]}}}}' in listed.stdout, listed.stdout
    answered = piwf.run("answer", request_id, json.dumps({"note": raw}))
    assert answered.returncode == 0, answered.stderr
    assert f'{{"note":"{escaped}"}}' in answered.stdout, answered.stdout
    piwf.json("run", "wait", run_id, "--timeout", "30")
    shown = piwf.run("run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    for output in (listed.stdout, answered.stdout, shown.stdout):
        assert not {"\u202e", "\u2028", "\x9b"} & set(output), output
    assert piwf.json("run", "show", run_id)["output"]["note"] == {"note": raw}


def test_a_refused_answer_does_not_repeat_what_was_sent(piwf: Piwf) -> None:  # noqa: F811
    """A refusal is returned, stored with the submission and shown by `run show`: a huge or
    odd choice is described, not echoed, so none of them carries the answer's text."""
    started = piwf.json("run", "start", DECISION, "--input", '{"release": "1.4"}')
    run_id = started["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]

    huge = json.dumps({"choice": "x" * 100_000})
    refused = piwf.json("answer", request_id, huge, exit_code=1)
    assert refused["error"] == {
        "code": "answerRejected",
        "message": "choice (a string of 100,000 characters) is not one of hold, ship",
    }
    refused = piwf.run("answer", request_id, '{"choice": null}')
    assert refused.returncode == 1 and "choice null is not one of hold, ship" in refused.stderr
    reasons = [s["reason"] for s in piwf.json("run", "show", run_id)["decisions"][0]["submissions"]]
    assert reasons == [
        "choice (a string of 100,000 characters) is not one of hold, ship",
        "choice null is not one of hold, ship",
    ]
    piwf.json("run", "cancel", run_id)


def test_the_suggested_answer_command_is_json_and_a_bare_choice_is_pointed_at_it(
    piwf: Piwf,  # noqa: F811
) -> None:
    """`run explain` suggested `piwf answer REQ CHOICE`; typing a choice's name there failed as
    'not JSON: Expecting value: line 1 column 1'."""
    started = piwf.json("run", "start", DECISION, "--input", '{"release": "1.4"}')
    run_id = started["run"]["runId"]
    request_id = pending(piwf, run_id)["requestId"]

    suggested = f"""piwf answer {request_id} '{{"choice": "<choice>"}}'"""
    explained = piwf.run("run", "explain", run_id)
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.splitlines()[1] == f"  {suggested}"
    assert piwf.json("run", "show", run_id)["display"]["waitingOn"]["command"] == suggested

    bare = piwf.run("answer", request_id, "ship")
    assert bare.returncode == 2, bare.stderr
    assert (
        """the answer is JSON, not a bare word: a decision takes '{"choice": "ship"}', """
        """a checkpoint any JSON value ('"ship"' for a string)"""
    ) in bare.stderr
    assert pending(piwf, run_id)["submissions"] == 0, "nothing was sent"
    assert piwf.json("answer", request_id, '{"choice": "ship"}')["outcome"] == "won"
