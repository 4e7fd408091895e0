"""Checkpoints and protected decisions through real server processes and runner children."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from piwf import Client
from piwf.client import runs as client_runs
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import (
    FAST,
    fast_server,  # noqa: F401 - a fixture used by name
    query,
    run_view,
    start,
    wait_run,
    write_workflow,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "workflows"
CHECKPOINT = str(FIXTURES / "checkpoint_review.py")


def decision_workflow(directory: Path, name: str, after_ms: int) -> str:
    return write_workflow(
        directory,
        name,
        f"""
        from piwf.workflow import compute, define_workflow, human_decision

        workflow = define_workflow(
            name={name!r},
            start_at="approve",
            nodes={{
                "approve": human_decision(
                    choices={{"ship": "Ship it", "hold": "Hold back"}},
                    on_timeout={{"after_ms": {after_ms}, "response": {{"choice": "hold"}}}},
                ),
                "ship": compute(lambda ctx: "shipped"),
                "hold": compute(lambda ctx: "held"),
            }},
            edges=[{{"from": "approve",
                     "switch": {{"on": "$output.choice",
                                 "cases": {{"ship": "ship", "hold": "hold"}}}}}}],
        )
        """,
    )


def waiting_request(client: RawClient, run_id: str) -> dict[str, Any]:
    def waiting() -> dict[str, Any] | None:
        view = run_view(client, run_id)
        return view.get("waitingOn") if view["run"]["status"] == "waiting" else None

    request: dict[str, Any] = wait_for(waiting, timeout_s=30, what="the run to wait")
    return request


def answer(
    client: RawClient, request_id: str, response: Any, key: str, operation: str = "decision.answer"
) -> Any:
    return client.request(operation, {"requestId": request_id, "response": response}, key=key)


def winners(server: ServerProcess, decision_id: str) -> list[tuple[Any, ...]]:
    return query(
        server,
        "SELECT provenance FROM human_decision_resolutions WHERE decision_id = ?",
        (decision_id,),
    )


def test_a_checkpoint_is_listed_answered_and_completes_the_same_run(
    fast_server: ServerProcess,  # noqa: F811
) -> None:
    with raw_client(fast_server) as client:
        run_id = start(client, CHECKPOINT, {"steps": ["a", "b"]}, "cp")
        request = waiting_request(client, run_id)
        assert request["kind"] == "checkpoint"
        listed = client.request("requests.list", {"runId": run_id}).receipt
        assert listed is not None
        assert [r["requestId"] for r in listed["requests"]] == [request["requestId"]]
        won = answer(client, request["requestId"], {"ok": True}, "a1", "checkpoint.answer")
        assert won.outcome == "accepted" and won.receipt["outcome"] == "won", won
        late = answer(client, request["requestId"], {"ok": False}, "a2")
        assert late.receipt["outcome"] == "already_resolved"
        assert late.receipt["resolution"]["response"] == {"ok": True}
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert run["status"] == "completed"
    assert view["output"] == {"applied": ["a", "b"], "note": {"ok": True}}
    assert view["decisions"][0]["resolution"]["provenance"] == "client"
    assert query(fast_server, "SELECT count(*) FROM runs") == [(1,)]


def test_a_protected_decision_refuses_the_checkpoint_path_and_takes_a_human_answer(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    workflow = decision_workflow(tmp_path, "guarded", 600_000)
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "guarded")
        request = waiting_request(client, run_id)
        assert request["choices"] == {"ship": "Ship it", "hold": "Hold back"}
        refused = answer(
            client, request["requestId"], {"choice": "ship"}, "c1", "checkpoint.answer"
        )
        assert refused.outcome == "rejected" and refused.error.code == "answerRejected"
        invalid = answer(client, request["requestId"], {"choice": "later"}, "h0")
        assert invalid.outcome == "rejected"
        won = answer(client, request["requestId"], {"choice": "ship"}, "h1")
        assert won.receipt["outcome"] == "won"
        retry = answer(client, request["requestId"], {"choice": "ship"}, "h1")
        assert retry.outcome == "adopted"
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
    assert (run["status"], view["output"]) == ("completed", "shipped")
    audit = view["decisions"][0]
    assert audit["resolution"]["provenance"] == "human"
    assert [s["outcome"] for s in audit["submissions"]] == ["rejected", "rejected", "won"]


def test_the_timeout_policy_settles_a_decision_across_a_server_crash(
    servers: ServerFactory, tmp_path: Path
) -> None:
    workflow = decision_workflow(tmp_path, "timed", 1_500)
    first = servers.start(env=FAST)
    with raw_client(first) as client:
        run_id = start(client, workflow, {}, "timed")
        request = waiting_request(client, run_id)
    first.kill()
    deadline_s = request["deadlineAt"] / 1000
    wait_for(lambda: time.time() > deadline_s, timeout_s=10, what="the deadline to pass")
    second = servers.start(env=FAST)
    with raw_client(second) as client:
        run = wait_run(client, run_id)
        view = run_view(client, run_id)
        late = answer(client, request["requestId"], {"choice": "ship"}, "late")
    assert (run["status"], view["output"]) == ("completed", "held")
    resolution = view["decisions"][0]["resolution"]
    assert resolution["provenance"] == "timeout_policy"
    assert resolution["response"] == {"choice": "hold"}
    assert resolution["resolvedAt"] >= request["deadlineAt"]
    assert late.receipt["outcome"] == "already_resolved"
    assert late.receipt["resolution"]["provenance"] == "timeout_policy"


# conformance: S10
def test_answers_race_the_deadline_and_cancel_to_one_winner(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A human answer sent at the deadline (and, every other time, a cancel from a second
    client at once) leaves exactly one winner, which every answer reports back."""
    workflow = decision_workflow(tmp_path, "raced", 300)
    with (
        raw_client(fast_server, "human") as human,
        raw_client(fast_server, "operator") as operator,
    ):
        for iteration in range(4):
            run_id = start(human, workflow, {}, f"race-{iteration}")
            request = waiting_request(human, run_id)
            deadline_s = request["deadlineAt"] / 1000
            wait_for(lambda: time.time() >= deadline_s - 0.01, what="the deadline")  # noqa: B023
            payload = {"requestId": request["requestId"], "response": {"choice": "ship"}}
            human.send("decision.answer", payload, key=f"answer-{iteration}")
            cancelled = bool(iteration % 2)
            if cancelled:
                operator.send("run.cancel", {}, key=f"cancel-{iteration}", run_id=run_id)
                assert operator.response().outcome in ("accepted", "rejected")
            answered = human.response()
            run = wait_run(human, run_id)
            (winner,) = winners(fast_server, request["requestId"])
            assert answered.outcome == "accepted", answered
            assert answered.receipt["resolution"]["provenance"] == winner[0]
            if winner[0] == "explicit_cancel":
                assert run["status"] == "cancelled"
            elif cancelled:  # the cancel landed after the winner resumed the run
                assert run["status"] in ("completed", "cancelled")
            else:
                assert run["status"] == "completed"
            won = query(
                fast_server,
                "SELECT count(*) FROM human_decision_submissions"
                " WHERE decision_id = ? AND outcome = 'won'",
                (request["requestId"],),
            )
            assert won == [(1,)]
        verify = human.request("state.verify").receipt
    assert verify is not None and verify["valid"] is True, verify


# conformance: recovery step 9 (a provisional answer resumes in a new supervised child)
def test_an_answer_committed_just_before_a_server_kill_is_consumed_after_restart(
    servers: ServerFactory,
) -> None:
    """The answer commits, the server dies before replying (the client learns nothing), and
    the restarted server resumes the run with that answer; the client's retry adopts it."""
    armed = servers.start(env={**FAST, "PIWF_FAULTS": "cmd.after_commit_before_reply@2=kill"})
    with raw_client(armed) as client:
        run_id = start(client, CHECKPOINT, {"steps": ["a"]}, "cp")  # durable command 1
        request = waiting_request(client, run_id)
        try:  # durable command 2: committed, then the server dies before its reply
            answer(client, request["requestId"], {"ok": True}, "a1", "checkpoint.answer")
        except (OSError, ConnectionError):
            pass
        else:
            raise AssertionError("the server answered although it was armed to die")
    armed.process.wait(timeout=15)
    survivor = servers.start(env=FAST)
    assert survivor.ready["ok"] is True
    with raw_client(survivor) as client:
        run = wait_run(client, run_id)
        retried = answer(client, request["requestId"], {"ok": True}, "a1", "checkpoint.answer")
        view = run_view(client, run_id)
    assert run["status"] == "completed"
    assert view["output"] == {"applied": ["a"], "note": {"ok": True}}
    assert retried.outcome == "adopted"
    assert query(survivor, "SELECT count(*) FROM human_decision_submissions") == [(1,)]


def test_answers_are_refused_while_the_run_is_paused_and_taken_after_resume(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Seed 001 "Pause and cancellation": while its run is paused, answers are rejected."""
    workflow = decision_workflow(tmp_path, "paused", 600_000)
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "paused")
        request = waiting_request(client, run_id)
        assert client.request("run.pause", run_id=run_id, key="pause").outcome == "accepted"
        submissions_before = query(fast_server, "SELECT count(*) FROM human_decision_submissions")
        for key, operation in (("h1", "decision.answer"), ("c1", "checkpoint.answer")):
            refused = answer(client, request["requestId"], {"choice": "ship"}, key, operation)
            assert refused.outcome == "rejected", refused
            assert refused.error.code == "runPaused"
            assert "piwf run resume" in refused.error.message
        # Nothing was settled or audited as a submission; the request is still open.
        assert query(fast_server, "SELECT count(*) FROM human_decision_submissions") == (
            submissions_before
        )
        assert query(fast_server, "SELECT count(*) FROM human_decision_resolutions") == [(0,)]
        assert client.request("run.resume", run_id=run_id, key="resume").outcome == "accepted"
        won = answer(client, request["requestId"], {"choice": "ship"}, "h2")
        assert won.outcome == "accepted" and won.receipt["outcome"] == "won", won
        assert wait_run(client, run_id)["status"] == "completed"
        assert run_view(client, run_id)["output"] == "shipped"


def test_a_deadline_that_passes_during_a_pause_settles_and_the_run_stays_paused(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The deadline is absolute, so it falls due while the run is paused too: the timeout
    policy's winner is recorded, but nothing of the run executes until it is resumed."""
    workflow = decision_workflow(tmp_path, "paused_deadline", 1_500)
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "paused_deadline")
        request = waiting_request(client, run_id)
        assert client.request("run.pause", run_id=run_id, key="pause").outcome == "accepted"
        runners_before = query(
            fast_server, "SELECT count(*) FROM run_runners WHERE run_id = ?", (run_id,)
        )
        wait_for(
            lambda: winners(fast_server, request["requestId"]) == [("timeout_policy",)],
            timeout_s=20,
            what="the timeout default, recorded while the run is paused",
        )
        # The settling pass admits what is eligible before the loop serves this request, so
        # a launch of the paused run would show as a second runner generation by now.
        view = run_view(client, run_id)
        assert view["run"]["paused"] is True, view["run"]
        assert (
            query(fast_server, "SELECT count(*) FROM run_runners WHERE run_id = ?", (run_id,))
            == runners_before
        ), "a paused run was launched"
        assert query(fast_server, "SELECT paused FROM runs WHERE run_id = ?", (run_id,)) == [(1,)]
        assert query(
            fast_server,
            "SELECT count(*) FROM node_attempts WHERE run_id = ? AND node_path = 'hold'",
            (run_id,),
        ) == [(0,)], "the timeout's route ran while the run was paused"
        assert client.request("run.resume", run_id=run_id, key="resume").outcome == "accepted"
        assert wait_run(client, run_id)["status"] == "completed"
        assert run_view(client, run_id)["output"] == "held"


def test_an_idle_server_stays_up_for_a_pending_decision_deadline(
    servers: ServerFactory, tmp_path: Path
) -> None:
    """Seed 001 "Server lifecycle": a scheduled wake keeps the server alive, so a timeout
    default fires on time and not when some later command happens to start a server."""
    server = servers.start(env={**FAST, "PIWF_IDLE_EXIT_S": "0.4"})
    workflow = decision_workflow(tmp_path, "deadline", 2_500)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "deadline")
        request = waiting_request(client, run_id)
    # No client, no runner, nothing queued: only the deadline is left, many idle periods away.
    wait_for(
        lambda: winners(server, request["requestId"]) == [("timeout_policy",)],
        timeout_s=20,
        what="the timeout default, fired by the same server",
    )
    wait_for(
        lambda: (
            query(server, "SELECT status FROM runs WHERE run_id = ?", (run_id,)) == [("completed",)]
        ),
        what="the run to complete on the default",
    )
    assert server.ready["pid"] == server.process.pid
    # With nothing scheduled any more, the idle server exits by itself.
    wait_for(lambda: not server.alive(), timeout_s=20, what="idle exit once nothing is due")
    assert server.process.returncode == 0


def test_pending_requests_come_a_page_at_a_time_and_the_client_reads_every_page(
    fast_server: ServerProcess,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five runs wait on a checkpoint: pages of two come oldest first, each with the cursor of
    the next, the last without one; ``Client.list_requests`` reads them all (one frame holds
    one page, however many runs wait)."""
    with raw_client(fast_server) as client:
        runs = [start(client, CHECKPOINT, {"steps": ["a"]}, f"cp-{n}") for n in range(5)]
        waiting = [waiting_request(client, run_id)["requestId"] for run_id in runs]
        pages: list[list[str]] = []
        after = None
        while True:
            payload: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
            page = client.request("requests.list", payload).receipt
            assert page is not None
            pages.append([request["requestId"] for request in page["requests"]])
            after = page.get("nextCursor")
            if after is None:
                break
            assert after["requestId"] == pages[-1][-1]
        whole = client.request("requests.list", {}).receipt
    listed = [request_id for page in pages for request_id in page]
    assert [len(page) for page in pages] == [2, 2, 1]
    assert whole is not None and [r["requestId"] for r in whole["requests"]] == listed
    assert sorted(listed) == sorted(waiting)
    monkeypatch.setattr(client_runs, "REQUEST_PAGE", 2)
    with Client(fast_server.home, autostart=False) as reader:
        assert [item.request_id for item in reader.list_requests()] == listed
