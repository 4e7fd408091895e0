"""Agent submissions through real servers: validation children, crashes, repeats and refusals.

Each generated workflow's ``validate`` appends one JSON line per call to a marker file (its pid,
its process title as ``/proc/self/cmdline`` shows it, and ``sys.argv``) and may block on a gate
file the test opens, so the test knows exactly which process validated what, and when.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf.client import Client
from piwf.errors import InvalidArgumentError, SubmissionRejectedCommandError
from piwf.protocol.agent_payloads import MAX_UPDATE_DATA_BYTES
from tests.server.harness import (
    RawClient,
    ServerFactory,
    ServerProcess,
    raw_client,
    runner_processes,
    wait_for,
)
from tests.server.test_execution import (
    FAST,
    fast_server,  # noqa: F401 - a fixture used by name
    query,
    run_view,
    start,
    wait_run,
    write_workflow,
)


def agent_workflow(directory: Path, *, gate: Path | None = None, name: str = "count") -> str:
    """An agent step whose validate records its process, may wait for ``gate``, refuses a
    non-integer ``n`` and doubles a good one; the next node reports what it got."""
    marker = directory / f"{name}.validations"
    wait = "" if gate is None else f"_wait_for({str(gate)!r})"
    return write_workflow(
        directory,
        name,
        f"""
        import json, os, pathlib, sys, time
        from piwf.workflow import agent, checkpoint, compute, define_workflow

        def _wait_for(path):
            deadline = time.monotonic() + 60
            while not pathlib.Path(path).exists() and time.monotonic() < deadline:
                time.sleep(0.01)

        def check(output, ctx):
            title = pathlib.Path("/proc/self/cmdline").read_bytes().replace(b"\\0", b" ")
            record = {{"pid": os.getpid(), "title": title.decode().strip(), "argv": sys.argv,
                       "output": output, "outputs": dict(ctx.outputs)}}
            with open({str(marker)!r}, "a") as handle:
                handle.write(json.dumps(record) + "\\n")
            {wait}
            if not isinstance(output, dict) or not isinstance(output.get("n"), int):
                raise ValueError("submit {{'n': <an integer>}}, for example {{'n': 3}}")
            return {{"n": output["n"] * 2}}

        workflow = define_workflow(
            name={name!r},
            start_at="prepare",
            nodes={{
                "prepare": compute(lambda ctx: {{"what": ctx.input["what"]}}),
                "ask": agent(
                    prompt=lambda ctx: f"Count the {{ctx.outputs['prepare']['what']}}.",
                    expected_output='{{"n": <integer>}}',
                    validate=check,
                ),
                "done": compute(lambda ctx: {{"doubled": ctx.outputs["ask"]["n"]}}),
            }},
            edges=[{{"from": "prepare", "to": "ask"}}, {{"from": "ask", "to": "done"}}],
        )
        """,
    )


def validations(directory: Path, name: str = "count") -> list[dict[str, Any]]:
    path = directory / f"{name}.validations"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def waiting_agent_request(client: RawClient, run_id: str) -> dict[str, Any]:
    def waiting() -> dict[str, Any] | None:
        view = run_view(client, run_id)
        request = view.get("waitingOn")
        return request if view["run"]["status"] == "waiting" and request else None

    request: dict[str, Any] = wait_for(waiting, timeout_s=30, what="the run to wait")
    assert request["kind"] == "agent"
    return request


def submit(client: RawClient, request_id: str, output: Any, key: str, **kw: Any) -> Any:
    payload = {"requestId": request_id, "output": output}
    return client.request("interaction.submit", payload, key=key, **kw)


def send_submit(client: RawClient, request_id: str, output: Any, key: str) -> str:
    payload = {"requestId": request_id, "output": output}
    return client.send("interaction.submit", payload, key=key)


def runner_pids(server: ServerProcess) -> set[int]:
    return {row[0] for row in query(server, "SELECT pid FROM run_runners WHERE pid IS NOT NULL")}


def submission_rows(server: ServerProcess) -> list[tuple[Any, ...]]:
    return query(
        server,
        "SELECT idempotency_key, outcome, validation_id FROM interactive_submissions"
        " ORDER BY submitted_at, idempotency_key",
    )


# conformance: I3
# conformance: X8
def test_validate_runs_only_in_validation_children_and_a_rejection_keeps_the_request(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = agent_workflow(tmp_path)
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {"what": "sheep"}, "s1")
        request = waiting_agent_request(client, run_id)
        prompt = request["content"]["prompt"]
        assert prompt.startswith("Count the sheep.\n\nWorkflow step contract (workflow: count,")
        assert f"piwf submit {request['requestId']} '<your output as JSON>'" in prompt
        assert prompt.endswith('Expected output: {"n": <integer>}')
        assert request["timeoutMs"] == 15 * 60_000
        rejected = submit(client, request["requestId"], {"n": "three"}, "k1")
        assert rejected.outcome == "rejected", rejected
        assert rejected.error.code == "submissionRejected"
        assert (
            rejected.error.message == "ValueError: submit {'n': <an integer>}, for example {'n': 3}"
        )
        still = client.request("requests.list", {"runId": run_id}).receipt
        assert [r["requestId"] for r in still["requests"]] == [request["requestId"]]
        assert still["requests"][0]["latestRejection"] == rejected.error.message
        assert still["requests"][0]["submissions"] == 1
        accepted = submit(client, request["requestId"], {"n": 3}, "k2")
        assert accepted.outcome == "accepted", accepted
        assert accepted.receipt["value"] == {"n": 6}
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert (run["status"], view["output"]) == ("completed", {"doubled": 6})
    (audit,) = view["agentRequests"]
    assert [(s["outcome"], s.get("value"), s.get("error")) for s in audit["submissions"]] == [
        ("rejected", None, rejected.error.message),
        ("accepted", {"n": 6}, None),
    ]
    seen = validations(tmp_path)
    assert [record["output"] for record in seen] == [{"n": "three"}, {"n": 3}]
    # validate saw the context the engine gives the visit: the outputs of earlier nodes.
    assert all(record["outputs"] == {"prepare": {"what": "sheep"}} for record in seen)
    runners = runner_pids(fast_server)
    assert runners and fast_server.process.pid not in runners
    for record in seen:
        assert record["pid"] not in runners | {fast_server.process.pid}
        assert record["title"].startswith("piwf validator "), record["title"]
        assert record["argv"][0].endswith("validator.py"), record["argv"]  # its entry
    assert len({record["pid"] for record in seen}) == 2  # one child per candidate


def test_a_killed_validation_child_rejects_its_candidate_and_a_retry_succeeds(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    workflow = agent_workflow(tmp_path, gate=gate)
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {"what": "goats"}, "s1")
        request_id = waiting_agent_request(client, run_id)["requestId"]
        send_submit(client, request_id, {"n": 2}, "k1")
        (record,) = wait_for(lambda: validations(tmp_path), what="validate to start")
        os.kill(record["pid"], signal.SIGKILL)
        stopped = client.response()
        assert stopped.outcome == "rejected", stopped
        assert stopped.error.code == "submissionRejected"
        assert stopped.error.message.startswith("validation stopped before it reported:")
        assert "killed by signal 9" in stopped.error.message
        assert stopped.error.message.endswith("submit again")
        assert run_view(client, run_id)["run"]["status"] == "waiting"
        gate.touch()
        retried = submit(client, request_id, {"n": 2}, "k2")
        assert retried.outcome == "accepted", retried
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert (run["status"], view["output"]) == ("completed", {"doubled": 4})
    assert [row[:2] for row in submission_rows(fast_server)] == [
        ("k1", "rejected"),
        ("k2", "accepted"),
    ]


# conformance: X3
def test_a_candidate_validating_when_the_server_dies_is_validated_once_after_restart(
    servers: ServerFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    workflow = agent_workflow(tmp_path, gate=gate)
    first = servers.start(env=FAST)
    with raw_client(first) as client:
        run_id = start(client, workflow, {"what": "cows"}, "s1")
        request_id = waiting_agent_request(client, run_id)["requestId"]
        send_submit(client, request_id, {"n": 5}, "k1")
        (record,) = wait_for(lambda: validations(tmp_path), what="validate to start")
    first.kill()
    # The child dies with its server (its lifeline); only then may the gate open.
    assert wait_for(lambda: not psutil.pid_exists(record["pid"]) or _zombie(record["pid"]))
    assert [row[:2] for row in submission_rows(first)] == [("k1", "validating")]
    gate.touch()
    second = servers.start(env=FAST)
    with raw_client(second, "reconnected") as client:
        # A reconnect that repeats the key waits for (or finds) the same outcome.
        again = submit(client, request_id, {"n": 5}, "k1")
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert again.outcome in ("accepted", "adopted"), again
    assert again.receipt["value"] == {"n": 10}
    assert (run["status"], view["output"]) == ("completed", {"doubled": 10})
    after = validations(tmp_path)[1:]
    assert len(after) == 1, after  # validated once after the restart
    assert after[0]["pid"] != record["pid"]
    assert [row[:2] for row in submission_rows(second)] == [("k1", "accepted")]
    (validation_id,) = [row[2] for row in submission_rows(second)]
    assert validation_id is not None


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# conformance: X6
def test_an_identical_repeat_adopts_and_a_different_output_must_wait(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    workflow = agent_workflow(tmp_path, gate=gate)
    with (
        raw_client(fast_server, "one") as one,
        raw_client(fast_server, "two") as two,
        raw_client(fast_server, "three") as three,
    ):
        run_id = start(one, workflow, {"what": "ducks"}, "s1")
        request_id = waiting_agent_request(one, run_id)["requestId"]
        send_submit(one, request_id, {"n": 7}, "k1")
        wait_for(lambda: validations(tmp_path), what="validate to start")
        send_submit(two, request_id, {"n": 7}, "k1")  # a reconnect repeating its key
        other = submit(three, request_id, {"n": 8}, "k2")
        assert other.outcome == "rejected" and other.error.code == "validationPending", other
        assert "wait for its outcome" in other.error.message
        reused = submit(three, request_id, {"n": 9}, "k1")
        assert reused.outcome == "conflict" and reused.error.code == "idempotencyConflict"
        send_submit(three, request_id, {"n": 7}, "k3")  # same output, another key: adopts
        gate.touch()
        answers = [one.response(), two.response(), three.response()]
        late = submit(one, request_id, {"n": 7}, "k4")
        assert wait_run(one, run_id)["status"] == "completed"
    assert [a.outcome for a in answers] == ["accepted", "adopted", "adopted"]
    assert len({a.receipt["submissionId"] for a in answers}) == 1
    assert (late.outcome, late.receipt["submissionId"]) == (
        "adopted",
        answers[0].receipt["submissionId"],
    )
    assert len(validations(tmp_path)) == 1  # one candidate, validated once
    assert [row[:2] for row in submission_rows(fast_server)] == [("k1", "accepted")]


CHECKPOINT = str(
    Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "checkpoint_review.py"
)


# conformance: I3
def test_refusals_are_typed_and_a_request_belongs_to_its_own_run(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = agent_workflow(tmp_path)
    with raw_client(fast_server) as client:
        run_a = start(client, workflow, {"what": "a"}, "sa")
        run_b = start(client, workflow, {"what": "b"}, "sb")
        request_a = waiting_agent_request(client, run_a)["requestId"]
        request_b = waiting_agent_request(client, run_b)["requestId"]
        gate_run = start(client, CHECKPOINT, {"steps": ["x"]}, "sc")
        checkpoint = wait_for(lambda: run_view(client, gate_run).get("waitingOn"))
        unknown = submit(client, "request-unknown", {"n": 1}, "u")
        assert (unknown.outcome, unknown.error.code) == ("notFound", "requestNotFound")
        wrong_kind = submit(client, checkpoint["requestId"], {"n": 1}, "c")
        assert wrong_kind.error.code == "notAgentRequest"
        assert f"piwf answer {checkpoint['requestId']}" in wrong_kind.error.message
        answered_as_checkpoint = client.request(
            "decision.answer", {"requestId": request_a, "response": {"n": 1}}, key="d"
        )
        assert answered_as_checkpoint.outcome == "rejected"
        assert answered_as_checkpoint.error.code == "notDecisionRequest"
        assert f"piwf submit {request_a}" in answered_as_checkpoint.error.message
        mismatch = submit(client, request_a, {"n": 1}, "m", run_id=run_b)
        assert mismatch.error.code == "requestRunMismatch"
        paused = client.request("run.pause", run_id=run_a, key="p")
        assert paused.outcome == "accepted", paused
        refused = submit(client, request_a, {"n": 1}, "p1")
        assert (refused.outcome, refused.error.code) == ("rejected", "runPaused")
        assert client.request("run.resume", run_id=run_a, key="r").outcome == "accepted"
        done = submit(client, request_a, {"n": 1}, "a1", run_id=run_a)
        assert done.outcome == "accepted", done
        assert wait_run(client, run_a)["status"] == "completed"
        stale = submit(client, request_a, {"n": 2}, "a2")
        assert (stale.outcome, stale.error.code) == ("rejected", "requestNotOpen")
        view_b = run_view(client, run_b)
    # Submitting to run A changed nothing of run B.
    assert view_b["run"]["status"] == "waiting"
    assert view_b["waitingOn"]["requestId"] == request_b
    assert view_b["agentRequests"] == []
    assert {row[0] for row in submission_rows(fast_server)} == {"a1"}


def test_an_update_is_recorded_on_the_attempt_and_completes_nothing(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = agent_workflow(tmp_path)
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {"what": "owls"}, "s1")
        request_id = waiting_agent_request(client, run_id)["requestId"]
        data = {"status": "counting", "completed": 2, "total": 5}
        updated = client.request(
            "interaction.update", {"requestId": request_id, "data": data}, key="u1"
        )
        assert updated.outcome == "accepted", updated
        again = client.request(
            "interaction.update", {"requestId": request_id, "data": data}, key="u1"
        )
        assert again.outcome == "adopted"
        too_big = {"status": "x" * MAX_UPDATE_DATA_BYTES}
        refused = client.request(
            "interaction.update", {"requestId": request_id, "data": too_big}, key="u2"
        )
        assert refused.outcome == "rejected" and "at most 65,536 bytes" in refused.error.message
        assert "xxxx" not in refused.error.message
        assert run_view(client, run_id)["run"]["status"] == "waiting"
    rows = query(
        fast_server,
        "SELECT a.node_path, u.update_type FROM workflow_updates u"
        " JOIN node_attempts a ON a.attempt_id = u.attempt_id",
    )
    assert rows == [("ask", "piwf.agent.update")]


@pytest.mark.parametrize("size", [600_000])
def test_a_run_whose_state_passes_one_frame_is_validated_by_content_reference(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
    size: int,
) -> None:
    workflow = write_workflow(
        tmp_path,
        "big",
        f"""
        from piwf.workflow import agent, compute, define_workflow

        def check(output, ctx):
            if len(ctx.outputs["a"]) + len(ctx.outputs["b"]) != {2 * size}:
                raise ValueError("the earlier outputs did not arrive whole")
            return {{"ok": output}}

        workflow = define_workflow(
            name="big",
            start_at="a",
            nodes={{
                "a": compute(lambda ctx: "x" * {size}),
                "b": compute(lambda ctx: "y" * {size}),
                "ask": agent(prompt="p", expected_output="anything", validate=check),
            }},
            edges=[{{"from": "a", "to": "b"}}, {{"from": "b", "to": "ask"}}],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "s1")
        request_id = waiting_agent_request(client, run_id)["requestId"]
        accepted = submit(client, request_id, 1, "k1")
        assert accepted.outcome == "accepted", accepted
        assert accepted.receipt["value"] == {"ok": 1}
        assert wait_run(client, run_id)["status"] == "completed"


HELLO = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py")


# conformance: X15
def test_a_validation_child_holds_a_slot_of_the_pool(
    servers: ServerFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    workflow = agent_workflow(tmp_path, gate=gate)
    server = servers.start(env={**FAST, "PIWF_MAX_WORKERS": "1"})
    with raw_client(server) as client:
        run_id = start(client, workflow, {"what": "bees"}, "s1")
        request_id = waiting_agent_request(client, run_id)["requestId"]
        wait_for(lambda: runner_processes_of(server) == [], what="the run's runner to exit")
        send_submit(client, request_id, {"n": 1}, "k1")
        wait_for(lambda: validations(tmp_path), what="validate to start")
        with raw_client(server, "observer") as observer:
            status = observer.request("server.status").receipt
            assert status["activeRunners"] == 1  # the validation child, and no runner
            other = start(observer, HELLO, {"who": "ada"}, "s2")
            assert run_view(observer, other)["run"]["status"] == "queued"  # no free slot
            gate.touch()
            assert client.response().outcome == "accepted"
            assert wait_run(observer, other)["status"] == "completed"
        assert wait_run(client, run_id)["status"] == "completed"


def runner_processes_of(server: ServerProcess) -> list[psutil.Process]:
    return runner_processes(server.home)


def test_the_python_client_submits_updates_and_raises_the_stored_rejection(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = agent_workflow(tmp_path)
    with Client(fast_server.home, autostart=False) as client:
        run = client.start_run(workflow, input={"what": "hens"})
        waiting = wait_for(lambda: client.list_requests(run.run_id), timeout_s=30)
        request_id = waiting[0].request_id
        assert waiting[0].kind == "agent" and waiting[0].timeout_ms == 15 * 60_000
        assert client.update(request_id, {"step": 1}).request_id == request_id
        with pytest.raises(
            InvalidArgumentError,
            match="invalid argument: data: a progress update is at most 65,536 bytes",
        ):
            client.update(request_id, "x" * MAX_UPDATE_DATA_BYTES)
        for call in (lambda: client.update(None, 1), lambda: client.submit(7, 1)):  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match="request_id: Input should be a valid"):
                call()
        with pytest.raises(SubmissionRejectedCommandError) as rejected:
            client.submit(request_id, {"n": None})
        assert str(rejected.value) == "ValueError: submit {'n': <an integer>}, for example {'n': 3}"
        assert rejected.value.error_code == "submissionRejected"
        (listed,) = client.list_requests(run.run_id)
        assert (listed.submissions, listed.latest_rejection) == (1, str(rejected.value))
        receipt = client.submit(request_id, {"n": 21}, idempotency_key="final")
        assert (receipt.outcome, receipt.value) == ("accepted", {"n": 42})
        assert client.submit(request_id, {"n": 21}, idempotency_key="final") == receipt
        final = client.wait_run(run.run_id, timeout_s=30)
    assert (final.run.status, final.output) == ("completed", {"doubled": 42})
