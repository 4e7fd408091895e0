"""Every failure class a run can meet, side by side on one real server, each reported as itself.

Eight runs each meet one way of going wrong: a node that raises, an input the workflow refuses
before any step (``inputRejected``, never ``nodeFailed``), a runner that exits before any
progress, one that exits after progress (an update), one frozen past its node deadline after
progress (a runner that fails without progress is ``runnerNoProgress`` whatever else it did),
one that breaks the runner protocol, a manual effect interrupted mid-call, and a source changed
while the run waits for an answer. Each must end with its own class in ``run.get``
(``errorCode``), the same class in ``server.status``'s parked counts, and only the node that
failed may leave a failed run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import FAST, run_view, start, write_workflow

#: Each workflow body, by the failure class its run must be reported with.
WORKFLOWS = {
    "nodeFailed": """
        from piwf.workflow import compute, define_workflow

        def fail(ctx):
            raise ValueError("no such customer")

        workflow = define_workflow(
            name="fails", start_at="fail", nodes={"fail": compute(fail)}, edges=[],
        )
        """,
    "inputRejected": """
        from piwf.workflow import compute, define_workflow

        def parse(raw):
            raise ValueError("a release needs a 'service'")

        workflow = define_workflow(
            name="refuses", start_at="plan", input=parse,
            nodes={"plan": compute(lambda ctx: {})}, edges=[],
        )
        """,
    "runnerNoProgress": """
        import os
        from piwf.workflow import compute, define_workflow

        workflow = define_workflow(
            name="no_progress", start_at="die",
            nodes={"die": compute(lambda ctx: os._exit(23))}, edges=[],
        )
        """,
    "runnerCrashed": """
        import os
        from piwf.workflow import compute, define_workflow

        def die(ctx):
            ctx.publish_update("progress", "main", {"stage": "about to crash"})
            os._exit(23)

        workflow = define_workflow(
            name="crashes", start_at="die", nodes={"die": compute(die)}, edges=[],
        )
        """,
    "runnerTimedOut": """
        import os, signal
        from piwf.workflow import compute, define_workflow

        def freeze(ctx):
            ctx.publish_update("progress", "main", {"stage": "about to freeze"})
            os.kill(os.getpid(), signal.SIGSTOP)  # the engine's own watchdog stops with it

        workflow = define_workflow(
            name="frozen", start_at="freeze",
            nodes={"freeze": compute(freeze, timeout_ms=200)}, edges=[],
        )
        """,
    "protocolRejected": """
        import gc
        from piwf.workflow import compute, define_workflow

        def attack(ctx):
            from piwf.runner.workflow_runner import PipePort
            found = next(o for o in gc.get_objects() if isinstance(o, PipePort))
            found.call("drop_tables", {"run_id": ctx.run_id})
            return {}

        workflow = define_workflow(
            name="hostile", start_at="attack", nodes={"attack": compute(attack)}, edges=[]
        )
        """,
    "effectAmbiguous": """
        import os
        from piwf.workflow import action, define_workflow, manual_effect

        def post(ctx):
            os._exit(23)

        workflow = define_workflow(
            name="manual", start_at="post",
            nodes={"post": action(effect=manual_effect("chat.post"), run=post)}, edges=[],
        )
        """,
    "sourceChanged": """
        from piwf.workflow import checkpoint, compute, define_workflow

        workflow = define_workflow(
            name="changed", start_at="ask",
            nodes={"ask": checkpoint(summary="go on?"), "after": compute(lambda ctx: 1)},
            edges=[{"from": "ask", "to": "after"}],
        )
        """,
}

#: The classes that park a run until an operator acts (``needsAction``).
BLOCKING = {"runnerNoProgress", "protocolRejected", "effectAmbiguous", "sourceChanged"}


def error_code(server: ServerProcess, run_id: str) -> str | None:
    with raw_client(server, "observer") as client:
        code: str | None = run_view(client, run_id)["run"].get("errorCode")
    return code


def change_source_under_its_waiting_run(server: ServerProcess, run_id: str, path: str) -> None:
    """Wait for the checkpoint, change the file, then answer: the run resumes in a new child."""
    with raw_client(server, "human") as client:

        def pending() -> list[dict[str, Any]]:
            receipt = client.request("requests.list", {"runId": run_id}).receipt
            assert receipt is not None
            return list(receipt["requests"])

        wait_for(lambda: bool(pending()), timeout_s=30, what="the checkpoint")
        (request,) = pending()
        Path(path).write_text(Path(path).read_text() + "\n# changed after the run began\n")
        answer = {"requestId": request["requestId"], "response": {"ok": True}}
        assert client.request("checkpoint.answer", answer, key="answer").outcome == "accepted"


# conformance: X14
def test_each_failure_class_is_reported_as_itself(servers: ServerFactory, tmp_path: Path) -> None:
    server = servers.start(env=FAST)
    assert server.ready["ok"] is True, server.ready
    paths = {
        failure: write_workflow(tmp_path, failure, body) for failure, body in WORKFLOWS.items()
    }
    with raw_client(server, "operator") as client:
        runs = {failure: start(client, path, {}, failure) for failure, path in paths.items()}
    change_source_under_its_waiting_run(server, runs["sourceChanged"], paths["sourceChanged"])

    # Every class each run was ever reported with. A crashed or timed-out run is relaunched
    # after a back-off, and its code is clear while the new runner works: it must come back
    # as the same class, never as another.
    seen: dict[str, set[str]] = {failure: set() for failure in WORKFLOWS}

    def every_run_reported() -> bool:
        for failure, run_id in runs.items():
            code = error_code(server, run_id)
            if code is not None:
                seen[failure].add(code)
        return all(seen.values())

    wait_for(every_run_reported, timeout_s=60, what="every run to meet its failure")
    assert seen == {failure: {failure} for failure in WORKFLOWS}

    with raw_client(server, "observer") as client:
        failed = run_view(client, runs["nodeFailed"])["run"]
        status = client.request("server.status").receipt
        listed = client.request("run.list").receipt
    assert failed["status"] == "failed" and failed["needsAction"] is False
    assert status is not None and listed is not None
    parked = Counter(status["parkedByReason"])
    assert {reason: parked[reason] for reason in BLOCKING} == dict.fromkeys(BLOCKING, 1)
    assert "nodeFailed" not in parked and "inputRejected" not in parked
    # Only the node that failed and the refused input ended their runs: every other run is
    # still unfinished.
    statuses = {run["runId"]: run["status"] for run in listed["runs"]}
    assert [failure for failure, run_id in runs.items() if statuses[run_id] == "failed"] == [
        "nodeFailed",
        "inputRejected",
    ]
