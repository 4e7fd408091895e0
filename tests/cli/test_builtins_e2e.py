"""The built-in workflows, started by name through the installed ``piwf`` script against a real
server (the fixture of tests/cli/test_cli_e2e.py: a private ``PIWF_HOME``, autostarted on the
first command, stopped and reaped afterwards).

Agent steps run headless with a scripted agent command: a small Python script written into the
test's directory that records every prompt it is given and submits a fixed output chosen by
what the prompt contains. Protected decisions are answered with ``piwf answer``, as a person
would.
"""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.cli.test_cli_e2e import Piwf, piwf  # noqa: F401 - a fixture used by name
from tests.server.harness import wait_for

BUILTINS = ("plain-summary", "plan-approval", "sanity-check")

AGENT = """
import json, os, subprocess, sys

log, replies = sys.argv[1], json.loads(sys.argv[2])
prompt = sys.stdin.read()
with open(log, "a", encoding="utf-8") as seen:
    seen.write(json.dumps(prompt) + "\\n")
# The first reply whose key is in the prompt; the key "" matches any prompt.
output = next(reply for key, reply in replies if key in prompt)
submit = [sys.executable, "-m", "piwf", "submit", os.environ["PIWF_REQUEST_ID"], json.dumps(output)]
raise SystemExit(subprocess.run(submit, check=False).returncode)
"""


class ScriptedAgent:
    """An agent command that submits ``replies`` (``[(text in the prompt, output), ...]``)."""

    def __init__(self, directory: Path, replies: list[tuple[str, Any]]) -> None:
        self.script = directory / "agent.py"
        self.script.write_text(textwrap.dedent(AGENT).lstrip(), encoding="utf-8")
        self.log = directory / "prompts.jsonl"
        self.replies = replies

    @property
    def command(self) -> str:
        """The ``--agent-command`` text."""
        return shlex.join(
            [sys.executable, str(self.script), str(self.log), json.dumps(self.replies)]
        )

    def prompts(self) -> list[str]:
        """Every prompt the agent was given, oldest first (none if it never ran)."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines()]


def start(
    cli: Piwf, name: str, value: Any, agent: ScriptedAgent, *wait: str, exit_code: int = 0
) -> Any:
    """``piwf run start NAME --input VALUE --agent-command ... [--wait ...] --json``."""
    return cli.json(
        "run",
        "start",
        name,
        "--input",
        json.dumps(value),
        "--agent-command",
        agent.command,
        *wait,
        exit_code=exit_code,
    )


def completed(cli: Piwf, name: str, value: Any, agent: ScriptedAgent) -> Any:
    """Start a run of ``name`` and wait for it; it must complete, from the built-in file.
    Returns its final output."""
    finished = start(cli, name, value, agent, "--wait", "--timeout", "60")
    assert finished["run"]["status"] == "completed", finished
    shown = cli.json("run", "show", finished["run"]["runId"])
    assert [source["sourceRef"] for source in shown["sources"]] == [f"builtin:{name}"]
    return finished["output"]


def next_decision(cli: Piwf, run_id: str, after: str | None = None) -> dict[str, Any]:
    """The run's pending protected decision, once it is not the request ``after``."""

    def pending() -> dict[str, Any] | None:
        for request in cli.json("requests", "--run", run_id)["requests"]:
            if request["kind"] == "human_decision" and request["requestId"] != after:
                return dict(request)
        return None

    found: dict[str, Any] = wait_for(pending, timeout_s=60, what="a pending decision")
    return found


def node_paths(cli: Piwf, run_id: str) -> list[str]:
    return [step["path"] for step in cli.json("run", "steps", run_id)["steps"]]


def test_the_builtins_are_listed_with_their_input_models(piwf: Piwf) -> None:  # noqa: F811
    listing = piwf.json("workflows", "list")["workflows"]
    origins = {entry["name"]: entry["origin"] for entry in listing}
    assert {name: origins.get(name) for name in BUILTINS} == dict.fromkeys(BUILTINS, "builtin")
    for name in BUILTINS:
        shown = piwf.json("workflows", "show", name)
        assert (shown["name"], shown["source"]) == (name, f"builtin:{name}")
        assert shown["input"]["kind"] == "model", shown["input"]
    approval = piwf.json("workflows", "show", "plan-approval")["input"]["jsonSchema"]
    assert approval["required"] == ["goal"]
    assert approval["properties"]["max_rounds"]["default"] == 3


def test_plain_summary_completes_with_the_agents_summary(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    agent = ScriptedAgent(tmp_path, [("", {"summary": "  The tides follow the moon.  "})])
    text = "Twice a day the sea rises and falls, pulled by the moon."
    output = completed(
        piwf, "plain-summary", {"text": text, "instructions": "One sentence."}, agent
    )
    assert output == {"summary": "The tides follow the moon."}
    (prompt,) = agent.prompts()
    assert prompt.startswith("Summarise the text between the markers below.")
    assert "Instructions: One sentence." in prompt
    assert f"----- text -----\n{text}\n----- end of text -----" in prompt
    assert "Workflow step contract (workflow: plain-summary, step: summarise" in prompt


def test_plan_approval_replans_with_the_persons_instructions_then_completes_approved(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    first, second = "1. deploy\n2. verify", "1. deploy\n2. verify\n3. roll back on failure"
    instructions = "Add a rollback step."
    agent = ScriptedAgent(tmp_path, [(instructions, {"plan": second}), ("", {"plan": first})])
    goal = {"goal": "Release 1.4 to production", "max_rounds": 3}
    run_id = start(piwf, "plan-approval", goal, agent)["run"]["runId"]

    review = next_decision(piwf, run_id)
    assert review["content"]["request"]["plan"] == first
    assert review["content"]["request"]["round"] == 1
    assert set(review["choices"]) == {"approve", "replan", "reject"}
    assert review["inputs"]["replan"]["name"] == "instructions"
    asked = piwf.json(
        "answer",
        review["requestId"],
        json.dumps({"choice": "replan", "instructions": instructions}),
    )
    assert asked["outcome"] == "won"

    again = next_decision(piwf, run_id, after=review["requestId"])
    assert again["content"]["request"]["plan"] == second
    assert again["content"]["request"]["round"] == 2
    assert piwf.json("answer", again["requestId"], '{"choice": "approve"}')["outcome"] == "won"

    finished = piwf.json("run", "wait", run_id, "--timeout", "60")
    assert finished["run"]["status"] == "completed", finished
    assert piwf.json("run", "show", run_id)["output"] == {
        "approved": True,
        "plan": second,
        "rounds": 2,
    }
    opening, replan = agent.prompts()
    assert "Release 1.4 to production" in opening and "(round 1 of 3;" in opening
    assert instructions not in opening
    # The second request carries the plan the person turned down and their instructions.
    assert "(round 2 of 3;" in replan
    assert f"instead of this one:\n\n{first}\n" in replan
    assert f"instructions for the new plan:\n\n{instructions}\n" in replan


def failing_and_passing(tmp_path: Path) -> list[dict[str, Any]]:
    report = "import os, sys; sys.stderr.write('2 tests failed in ' + os.getcwd()); sys.exit(3)"
    return [
        {"name": "lint", "argv": [sys.executable, "-c", "print('clean')"]},
        {"name": "unit", "argv": [sys.executable, "-c", report], "cwd": str(tmp_path)},
    ]


def test_sanity_check_records_a_failing_check_and_the_agent_summarises_it(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    summary = {"summary": "The unit tests fail.", "checks": {"unit": "two tests fail"}}
    agent = ScriptedAgent(tmp_path, [("", summary)])
    output = completed(piwf, "sanity-check", {"checks": failing_and_passing(tmp_path)}, agent)
    assert output["passed"] == ["lint"]
    (failure,) = output["failed"]
    assert (failure["name"], failure["exit_code"], failure["error"]) == (
        "unit",
        3,
        "exited with code 3",
    )
    assert failure["stderr_tail"] == f"2 tests failed in {tmp_path}"  # ran in its cwd
    assert failure["summary"] == "two tests fail"
    assert (output["summary"], output["summary_error"]) == ("The unit tests fail.", None)
    (prompt,) = agent.prompts()
    assert prompt.startswith("1 of 2 sanity checks failed.")
    assert "== check 'unit': exited with code 3" in prompt
    assert "2 tests failed in" in prompt and "'lint'" not in prompt


def test_sanity_check_with_every_check_passing_runs_no_agent_step(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    agent = ScriptedAgent(tmp_path, [("", {"summary": "not asked for"})])
    checks = [
        {"name": "lint", "argv": [sys.executable, "-c", "print('clean')"]},
        {"name": "unit", "argv": [sys.executable, "-c", "pass"], "timeout_ms": 30_000},
    ]
    finished = start(piwf, "sanity-check", {"checks": checks}, agent, "--wait")
    assert finished["output"] == {
        "passed": ["lint", "unit"],
        "failed": [],
        "summary": None,
        "summary_error": None,
    }
    assert agent.prompts() == []
    assert node_paths(piwf, finished["run"]["runId"]) == [
        "next",
        "run_check",
        "next",
        "run_check",
        "next",
        "report",
    ]


def test_a_bad_input_fails_the_run_before_any_step_with_a_clear_error(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    agent = ScriptedAgent(tmp_path, [("", {"summary": "not asked for"})])
    refused = start(piwf, "sanity-check", {"checks": []}, agent, "--wait", exit_code=1)
    assert refused["run"]["status"] == "failed"
    assert refused["error"].startswith("input rejected by workflow 'sanity-check': ")
    assert "checks\n  List should have at least 1 item" in refused["error"]
    assert node_paths(piwf, refused["run"]["runId"]) == []
    assert agent.prompts() == []
