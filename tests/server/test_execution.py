"""Runs executed by real runner children under a real server (original.md §6.3 acceptance).

Workflows are written into the test's temporary directory; gate files hold a node at a known
point and marker files record what workflow code really did, so assertions never depend on
timing. Every server is started with short poll and renewal intervals.
"""

from __future__ import annotations

import stat
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf.server.children.capture import ATTEMPT_LOG_CAP, drop_marker
from piwf.state import StateDatabase
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for

FAST = {
    "PIWF_IDLE_EXIT_S": "0",
    "PIWF_CLAIM_POLL_S": "0.05",
    "PIWF_RUN_RENEW_S": "0.2",
}

HELLO = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py")


def hold_until_gate() -> str:
    """Source of ``wait_for_gate(entered, gate)`` for a generated workflow: mark that the node
    started, then block (as workflow code may) until the test opens the gate, 60 s at most."""
    return (
        "def wait_for_gate(entered, gate):\n"
        "            import pathlib, time\n"
        "            pathlib.Path(entered).touch()\n"
        "            deadline = time.monotonic() + 60\n"
        "            while not pathlib.Path(gate).exists() and time.monotonic() < deadline:\n"
        "                time.sleep(0.01)"
    )


def write_workflow(directory: Path, name: str, body: str) -> str:
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def start(client: RawClient, workflow: str, payload_input: Any, key: str) -> str:
    response = client.request("run.start", {"workflow": workflow, "input": payload_input}, key=key)
    assert response.outcome == "accepted", response
    assert response.receipt is not None
    return str(response.receipt["run"]["runId"])


def wait_run(client: RawClient, run_id: str, timeout_ms: int = 30_000) -> dict[str, Any]:
    response = client.request("run.wait", {"timeoutMs": timeout_ms}, run_id=run_id)
    assert response.receipt is not None
    run: dict[str, Any] = response.receipt["run"]
    return run


def run_view(client: RawClient, run_id: str) -> dict[str, Any]:
    response = client.request("run.get", run_id=run_id)
    assert response.receipt is not None
    return response.receipt


def query(
    server: ServerProcess, sql: str, params: tuple[object, ...] = ()
) -> list[tuple[Any, ...]]:
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        return [tuple(row) for row in tx.all(sql, params)]


def runner_statuses(server: ServerProcess) -> list[str]:
    return sorted(row[0] for row in query(server, "SELECT status FROM run_runners"))


def runner_children(server: ServerProcess) -> list[psutil.Process]:
    try:
        children = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            # A runner names its run once its launch comes (a child the fork server forked a
            # moment ago still shows the fork server's command line, which names every entry
            # module; a spare runner waiting for a launch is "piwf runner (idle)").
            if " ".join(child.cmdline()).startswith("piwf runner run-"):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture
def fast_server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def test_a_run_completes_through_a_real_child(fast_server: ServerProcess) -> None:
    with raw_client(fast_server) as client:
        run_id = start(client, HELLO, {"who": "ada"}, "hello")
        run = wait_run(client, run_id)
        detail = run_view(client, run_id)
    assert run["status"] == "completed"
    assert detail["output"] == {"shouted": "HELLO ADA"}
    wait_for(lambda: runner_statuses(fast_server) == ["exited"], what="the runner's exit")
    assert runner_children(fast_server) == []


# conformance: X15
def test_ten_runs_never_have_more_than_four_children(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    workflow = write_workflow(
        tmp_path,
        "gated",
        f"""
        import pathlib, time
        from piwf.workflow import compute, define_workflow

        def wait_for_gate(ctx):
            deadline = time.monotonic() + 60
            while not pathlib.Path({str(gate)!r}).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return {{"n": ctx.input["n"]}}

        workflow = define_workflow(
            name="gated", start_at="hold", nodes={{"hold": compute(wait_for_gate)}}, edges=[]
        )
        """,
    )
    most = 0

    def four_running() -> bool:
        nonlocal most
        count = len(runner_children(fast_server))
        most = max(most, count)
        return count == 4

    with raw_client(fast_server) as client:
        run_ids = [start(client, workflow, {"n": n}, f"start-{n}") for n in range(10)]
        wait_for(four_running, timeout_s=60, what="four busy runners")
        gate.touch()

        def all_done() -> bool:
            nonlocal most
            most = max(most, len(runner_children(fast_server)))
            return all(wait_run(client, r, 0)["status"] == "completed" for r in run_ids)

        wait_for(all_done, timeout_s=120, what="all ten runs")
    assert most == 4
    assert len(query(fast_server, "SELECT runner_epoch FROM run_runners")) == 10


# conformance: X7
def test_an_interrupted_idempotent_effect_is_retried_and_adopted(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "first-attempt"
    workflow = write_workflow(
        tmp_path,
        "flaky_deploy",
        f"""
        import os, pathlib
        from piwf.workflow import action, define_workflow, idempotent_effect

        def deploy(ctx):
            marker = pathlib.Path({str(marker)!r})
            if not marker.exists():
                marker.write_text("attempt 1")
                os._exit(23)
            return {{"deployed": True}}

        workflow = define_workflow(
            name="flaky_deploy",
            start_at="deploy",
            nodes={{"deploy": action(effect=idempotent_effect("preview.deploy"), run=deploy)}},
            edges=[],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "flaky")
        run = wait_run(client, run_id)
    assert run["status"] == "completed"
    assert query(fast_server, "SELECT status, attempt_count FROM effects") == [("applied", 2)]
    wait_for(lambda: runner_statuses(fast_server) == ["crashed", "exited"], what="both runners")


# conformance: X7
def test_an_interrupted_manual_effect_parks_ambiguous_and_is_not_retried(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    attempts = tmp_path / "attempts"
    workflow = write_workflow(
        tmp_path,
        "manual_post",
        f"""
        import os, pathlib
        from piwf.workflow import action, define_workflow, manual_effect

        def post(ctx):
            with open({str(attempts)!r}, "a") as log:
                log.write("attempt\\n")
            os._exit(23)

        workflow = define_workflow(
            name="manual_post",
            start_at="post",
            nodes={{"post": action(effect=manual_effect("chat.post"), run=post)}},
            edges=[],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "manual")
        wait_for(
            lambda: run_view(client, run_id)["run"]["displayStatus"] == "ambiguous",
            timeout_s=30,
            what="the run to park ambiguous",
        )
        status = client.request("server.status").receipt
    assert status is not None
    assert status["ambiguousEffects"] == 1
    assert query(fast_server, "SELECT status, attempt_count FROM effects") == [("ambiguous", 1)]
    assert query(fast_server, "SELECT error_code FROM run_queue") == [("effectAmbiguous",)]
    assert len(query(fast_server, "SELECT runner_epoch FROM run_runners")) == 1
    assert attempts.read_text() == "attempt\n", "the manual action ran exactly once"


def never(condition: Callable[[], object], what: str, for_s: float = 1.0) -> None:
    """Fail if ``condition`` becomes true within ``for_s`` (polled, many scheduling rounds)."""
    with pytest.raises(AssertionError, match="timed out"):
        wait_for(condition, timeout_s=for_s, what=what)


# conformance: X9
def test_a_runner_that_dies_before_progress_is_parked_and_not_relaunched(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write_workflow(
        tmp_path,
        "dies_early",
        """
        import os, sys
        from piwf.workflow import compute, define_workflow

        if sys.argv[0].endswith("workflow_runner.py"):  # in a runner child, not the resolver
            os._exit(1)

        workflow = define_workflow(
            name="dies_early", start_at="a", nodes={"a": compute(lambda ctx: 1)}, edges=[]
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "dies")
        wait_for(
            lambda: (
                query(fast_server, "SELECT error_code FROM run_queue") == [("runnerNoProgress",)]
            ),
            timeout_s=30,
            what="the no-progress park",
        )
        # The run needs an operator: a wait on it is answered at once, saying why.
        response = client.request("run.wait", {"timeoutMs": 60_000}, run_id=run_id)
    assert response.receipt is not None
    assert response.receipt["timedOut"] is False
    assert response.receipt["run"]["needsAction"] is True
    assert "exited with code 1 while no node was running" in response.receipt["parkedReason"]
    # Many scheduling rounds pass (poll 0.05 s): the run is never claimed again.
    never(lambda: len(query(fast_server, "SELECT runner_epoch FROM run_runners")) > 1, "a relaunch")


# conformance: X9
def test_a_node_that_kills_every_runner_is_retried_once_then_parked(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    attempts = tmp_path / "attempts"
    workflow = write_workflow(
        tmp_path,
        "always_dies",
        f"""
        import os
        from piwf.workflow import compute, define_workflow

        def die(ctx):
            with open({str(attempts)!r}, "a") as log:
                log.write("attempt\\n")
            os._exit(23)

        workflow = define_workflow(
            name="always_dies", start_at="die", nodes={{"die": compute(die)}}, edges=[]
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "always")
        wait_for(
            lambda: (
                query(fast_server, "SELECT error_code FROM run_queue") == [("runnerNoProgress",)]
            ),
            timeout_s=30,
            what="the no-progress park",
        )
        response = client.request("run.wait", {"timeoutMs": 60_000}, run_id=run_id)
    assert response.receipt is not None
    assert response.receipt["timedOut"] is False, "a run parked until someone acts ends a wait"
    reason = response.receipt["parkedReason"]
    assert 'exited with code 23 while node "die" (visit 1, attempt 2) ran' in reason
    never(lambda: attempts.read_text() != "attempt\n" * 2, "a third relaunch")
    assert runner_statuses(fast_server) == ["crashed", "crashed"]


# conformance: X2
def test_a_node_blocking_longer_than_the_lease_keeps_its_claim(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = servers.start(env={**FAST, "PIWF_RUN_LEASE_MS": "1000", "PIWF_RUN_RENEW_S": "0.1"})
    workflow = write_workflow(
        tmp_path,
        "blocking",
        """
        import time
        from piwf.workflow import compute, define_workflow

        def block(ctx):
            time.sleep(3)  # three leases long, with the interpreter busy in this child
            return {"slept": True}

        workflow = define_workflow(
            name="blocking", start_at="block", nodes={"block": compute(block)}, edges=[]
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "block")
        run = wait_run(client, run_id)
    assert run["status"] == "completed"
    generations = query(
        server,
        "SELECT DISTINCT lease_generation FROM events e JOIN runs r ON r.resource_id ="
        " e.resource_id WHERE lease_generation IS NOT NULL",
    )
    assert generations == [(1,)], "the claim never changed hands"
    wait_for(lambda: runner_statuses(server) == ["exited"], what="the runner's exit")


def test_a_child_that_floods_its_output_is_not_killed_and_the_excess_is_dropped(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    imported = 2 * 1024 * 1024  # at import: the runner's own log (and the resolver's)
    printed = 200 * 65536  # by the node: its attempt's log
    workflow = write_workflow(
        tmp_path,
        "flood",
        f"""
        import os, sys
        from piwf.workflow import compute, define_workflow

        os.write(1, b"i" * {imported})

        def flood(ctx):
            for _ in range(200):
                sys.stdout.write("x" * 65536)
                sys.stdout.flush()
            return {{"ok": True}}

        workflow = define_workflow(
            name="flood", start_at="flood", nodes={{"flood": compute(flood)}}, edges=[]
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "flood")
        run = wait_run(client, run_id)
        assert client.request("server.status").outcome == "accepted"
    assert run["status"] == "completed"
    wait_for(lambda: runner_statuses(fast_server) == ["exited"], what="the one runner's exit")
    [(epoch,)] = query(fast_server, "SELECT runner_epoch FROM run_runners")
    runners = fast_server.home / "server" / "runners"
    # Each log keeps its cap and one marker line; the rest was read, counted and dropped.
    cap = 1024 * 1024
    assert (runners / f"{epoch}.log").read_bytes() == b"i" * cap + drop_marker(cap, "the captured")
    [(stdout, kept, dropped)] = query(
        fast_server, "SELECT stdout_bytes, kept_bytes, dropped_bytes FROM attempt_logs"
    )
    assert (stdout, kept, dropped) == (printed, ATTEMPT_LOG_CAP, printed - ATTEMPT_LOG_CAP)
    server_log = (fast_server.home / "server" / "server.log").read_text(encoding="utf-8")
    assert f"{epoch} wrote more than {cap} bytes of output; the rest is dropped" in server_log
    logs = list(runners.glob("*.log"))
    assert max(log.stat().st_size for log in logs) <= cap + len(drop_marker(cap, "the captured"))
    # Made by their first byte, under the server's own umask: private all the same.
    assert {stat.S_IMODE(log.stat().st_mode) for log in logs} == {0o600}


# conformance: X12
def test_cancel_commits_then_stops_the_child(fast_server: ServerProcess, tmp_path: Path) -> None:
    entered = tmp_path / "entered"
    workflow = write_workflow(
        tmp_path,
        "long",
        f"""
        import pathlib, time
        from piwf.workflow import compute, define_workflow

        def hold(ctx):
            pathlib.Path({str(entered)!r}).touch()
            time.sleep(120)
            return 1

        workflow = define_workflow(
            name="long", start_at="hold", nodes={{"hold": compute(hold)}}, edges=[]
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "long")
        wait_for(entered.exists, timeout_s=30, what="the node to start")
        cancelled = client.request("run.cancel", key="cancel-long", run_id=run_id)
        assert cancelled.outcome == "accepted"
        assert cancelled.receipt is not None
        assert cancelled.receipt["run"]["status"] == "cancelled"
        wait_for(lambda: runner_children(fast_server) == [], timeout_s=15, what="the child")
    assert query(fast_server, "SELECT status FROM node_attempts") == [("cancelled",)]
    wait_for(lambda: runner_statuses(fast_server) == ["cancelled"], what="the runner's exit")


# conformance: X7
def test_an_operator_resolves_an_ambiguous_effect_and_the_run_finishes(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    attempts = tmp_path / "attempts"
    workflow = write_workflow(
        tmp_path,
        "post_once",
        f"""
        import os
        from piwf.workflow import action, compute, define_workflow, manual_effect

        def post(ctx):
            with open({str(attempts)!r}, "a") as log:
                log.write("attempt\\n")
            os._exit(23)

        workflow = define_workflow(
            name="post_once",
            start_at="post",
            nodes={{
                "post": action(effect=manual_effect("chat.post"), run=post),
                "after": compute(lambda ctx: {{"after": True}}),
            }},
            edges=[{{"from": "post", "to": "after"}}],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "post-once")
        wait_for(
            lambda: run_view(client, run_id)["run"]["displayStatus"] == "ambiguous",
            timeout_s=30,
            what="the ambiguous park",
        )
        effect_id = run_view(client, run_id)["effects"][0]["effectId"]
        refused = client.request("run.resume", key="too-early", run_id=run_id)
        assert refused.outcome == "rejected", "an ambiguous effect blocks resume"
        resolved = client.request(
            "effect.resolve",
            {"effectId": effect_id, "resolution": "applied", "note": "seen"},
            key="resolve",
        )
        assert resolved.outcome == "accepted"
        assert resolved.receipt is not None
        assert resolved.receipt["effect"]["status"] == "applied"
        assert client.request("run.resume", key="resume", run_id=run_id).outcome == "accepted"
        run = wait_run(client, run_id)
    assert run["status"] == "completed"
    assert attempts.read_text() == "attempt\n", "the resolved effect was not applied again"
    events = query(
        fast_server,
        "SELECT event_type, actor_type FROM events WHERE event_type LIKE 'effect.resolved%'",
    )
    assert events == [("effect.resolved_applied", "human")]


def test_pause_then_resume_continues_from_the_last_boundary(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    first_runs = tmp_path / "first-runs"
    workflow = write_workflow(
        tmp_path,
        "pausable",
        f"""
        import pathlib, time
        from piwf.workflow import compute, define_workflow

        def first(ctx):
            with open({str(first_runs)!r}, "a") as log:
                log.write("first\\n")
            return 1

        {hold_until_gate()}

        def hold(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return 2

        workflow = define_workflow(
            name="pausable",
            start_at="first",
            nodes={{"first": compute(first), "hold": compute(hold)}},
            edges=[{{"from": "first", "to": "hold"}}],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "pausable")
        wait_for(entered.exists, timeout_s=30, what="the second node")
        paused = client.request("run.pause", key="pause", run_id=run_id)
        assert paused.outcome == "accepted"
        assert paused.receipt is not None
        assert paused.receipt["run"]["displayStatus"] == "paused"
        wait_for(lambda: runner_children(fast_server) == [], timeout_s=15, what="the child")
        gate.touch()
        assert client.request("run.resume", key="resume", run_id=run_id).outcome == "accepted"
        run = wait_run(client, run_id)
    assert run["status"] == "completed"
    assert first_runs.read_text() == "first\n", "the finished first node did not run again"


def test_restart_runs_a_fresh_copy_from_the_first_node(fast_server: ServerProcess) -> None:
    with raw_client(fast_server) as client:
        run_id = start(client, HELLO, {"who": "ada"}, "original")
        assert wait_run(client, run_id)["status"] == "completed"
        restarted = client.request("run.restart", key="restart", run_id=run_id)
        assert restarted.outcome == "accepted"
        assert restarted.receipt is not None
        child = restarted.receipt["run"]
        assert child["parentRunId"] == run_id
        assert child["restartNumber"] == 1
        assert wait_run(client, child["runId"])["status"] == "completed"
        assert run_view(client, child["runId"])["output"] == {"shouted": "HELLO ADA"}
        again = client.request("run.restart", key="restart-again", run_id=run_id)
    assert again.receipt is not None
    assert again.receipt["run"]["runId"] == child["runId"], "one restart per terminal run"


def runner_pid(server: ServerProcess) -> int:
    children = wait_for(lambda: runner_children(server), timeout_s=30, what="a runner")
    return int(children[0].pid)


# conformance: X10
def test_a_changed_mounted_source_never_runs(fast_server: ServerProcess, tmp_path: Path) -> None:
    entered, marker = tmp_path / "entered", tmp_path / "changed-code-ran"
    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent(
            """
            from piwf.workflow import compute, define_workflow

            workflow = define_workflow(
                name="child", start_at="work", nodes={"work": compute(lambda ctx: 1)},
                edges=[], exits={"done": {"from": "work"}},
            )
            """
        )
    )
    workflow = write_workflow(
        tmp_path,
        "parent",
        f"""
        import pathlib, time
        from piwf.workflow import compute, define_workflow, include

        def hold(ctx):
            pathlib.Path({str(entered)!r}).touch()
            time.sleep(120)

        workflow = define_workflow(
            name="parent",
            start_at="hold",
            nodes={{"hold": compute(hold)}},
            includes={{"child": include("./child.py")}},
            edges=[{{"from": "hold", "to": "child"}}],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "parent")
        wait_for(entered.exists, timeout_s=30, what="the first node")
        child.write_text(
            child.read_text().replace(
                "compute(lambda ctx: 1)",
                f"compute(lambda ctx: open({str(marker)!r}, 'w').write('ran'))",
            )
        )
        psutil.Process(runner_pid(fast_server)).kill()  # progress was made: it is relaunched
        wait_for(
            lambda: query(fast_server, "SELECT error_code FROM run_queue") == [("sourceChanged",)],
            timeout_s=30,
            what="the source-change park",
        )
        assert run_view(client, run_id)["run"]["status"] == "running"
    assert not marker.exists(), "the changed code never executed"


# conformance: X12
def test_cancelling_an_applying_manual_effect_marks_it_ambiguous_before_answering(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    entered = tmp_path / "entered"
    workflow = write_workflow(
        tmp_path,
        "slow_post",
        f"""
        import pathlib, time
        from piwf.workflow import action, define_workflow, manual_effect

        def post(ctx):
            pathlib.Path({str(entered)!r}).touch()
            time.sleep(120)

        workflow = define_workflow(
            name="slow_post",
            start_at="post",
            nodes={{"post": action(effect=manual_effect("chat.post"), run=post)}},
            edges=[],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "slow-post")
        wait_for(entered.exists, timeout_s=30, what="the action to start")
        cancelled = client.request("run.cancel", key="cancel", run_id=run_id)
        assert cancelled.outcome == "accepted"
        # Read at once, before the child is gone: the cancel committed the effect state.
        assert query(fast_server, "SELECT status FROM effects") == [("ambiguous",)]
        assert query(fast_server, "SELECT outcome FROM effect_attempts") == [("interrupted",)]
        wait_for(lambda: runner_children(fast_server) == [], timeout_s=15, what="the child")
    events = [row[0] for row in query(fast_server, "SELECT event_type FROM events")]
    assert "effect.ambiguous" in events


# conformance: X16
def test_no_grandchild_outlives_its_run(fast_server: ServerProcess, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    workflow = write_workflow(
        tmp_path,
        "spawner",
        f"""
        import pathlib, subprocess
        from piwf.workflow import compute, define_workflow

        def spawn(ctx):
            grandchild = subprocess.Popen(["sleep", "300"])
            pathlib.Path({str(pid_file)!r}).write_text(str(grandchild.pid))
            return {{"spawned": True}}

        workflow = define_workflow(
            name="spawner", start_at="spawn", nodes={{"spawn": compute(spawn)}}, edges=[]
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "spawner")
        assert wait_run(client, run_id)["status"] == "completed"
    grandchild = int(pid_file.read_text())

    def gone() -> bool:
        try:
            return psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, timeout_s=15, what="the grandchild to be killed with its group")


def test_a_child_that_sends_an_oversized_frame_is_killed_and_parked_protocol_rejected(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "sent"
    workflow = write_workflow(
        tmp_path,
        "oversized",
        f"""
        import os, pathlib, struct, sys
        from piwf.workflow import compute, define_workflow

        def oversized(ctx):
            marker = pathlib.Path({str(marker)!r})
            if not marker.exists():
                marker.touch()
                fd = int(sys.argv[sys.argv.index("--fd") + 1])
                os.write(fd, struct.pack("!i", 64 * 1024 * 1024) + b"x" * 1024)
            return {{"ok": True}}

        workflow = define_workflow(
            name="oversized", start_at="a", nodes={{"a": compute(oversized)}}, edges=[]
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "oversized")
        # A frame over the limit breaks the runner protocol: the runner is killed and the run
        # waits for an operator (protocolRejected), it is not relaunched by itself.
        wait_for(
            lambda: queue_of(fast_server, run_id) == ("parked", "protocolRejected"),
            what="the protocolRejected park",
        )
        assert runner_statuses(fast_server) == ["crashed"]
        assert client.request("server.status").outcome == "accepted"
        assert client.request("run.resume", run_id=run_id, key="resume").outcome == "accepted"
        assert wait_run(client, run_id)["status"] == "completed"
    wait_for(lambda: runner_statuses(fast_server) == ["crashed", "exited"], what="both runners")


def queue_of(server: ServerProcess, run_id: str) -> tuple[str, str | None]:
    rows = query(server, "SELECT status, error_code FROM run_queue WHERE run_id = ?", (run_id,))
    return rows[0][0], rows[0][1]


# conformance: X13
def test_a_stopped_child_is_replaced_and_its_generation_writes_nothing(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = write_workflow(
        tmp_path,
        "stoppable",
        f"""
        import pathlib, time
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def hold(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return {{"released": True}}

        workflow = define_workflow(
            name="stoppable", start_at="hold", nodes={{"hold": compute(hold)}}, edges=[]
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "stoppable")
        wait_for(entered.exists, timeout_s=30, what="the node")
        old = psutil.Process(runner_pid(fast_server))
        old.suspend()  # SIGSTOP: the old generation is frozen mid-node
        assert client.request("run.pause", key="pause", run_id=run_id).outcome == "accepted"
        wait_for(lambda: runner_children(fast_server) == [], timeout_s=15, what="the old child")
        entered.unlink()
        gate.touch()
        assert client.request("run.resume", key="resume", run_id=run_id).outcome == "accepted"
        run = wait_run(client, run_id)
    assert run["status"] == "completed"
    paused_at = query(
        fast_server, "SELECT max(event_seq) FROM events WHERE event_type LIKE '%paus%'"
    )
    late = query(
        fast_server,
        "SELECT DISTINCT lease_generation FROM events WHERE event_seq > ?"
        " AND lease_generation IS NOT NULL",
        (paused_at[0][0],),
    )
    assert late == [(2,)], "after the pause only the new generation wrote"


# conformance: X3
def test_a_killed_server_is_replaced_and_its_runs_continue(
    servers: ServerFactory, tmp_path: Path
) -> None:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    workflow = write_workflow(
        tmp_path,
        "survivor",
        f"""
        import pathlib, time
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def hold(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return {{"survived": True}}

        workflow = define_workflow(
            name="survivor",
            start_at="first",
            nodes={{"first": compute(lambda ctx: 1), "hold": compute(hold)}},
            edges=[{{"from": "first", "to": "hold"}}],
        )
        """,
    )
    first = servers.start(env=FAST)
    with raw_client(first) as client:
        run_id = start(client, workflow, {}, "survivor")
        wait_for(entered.exists, timeout_s=30, what="the second node")
    old_child = runner_pid(first)
    first.kill()
    second = servers.start(env=FAST)
    assert second.ready["epoch"] == 2

    def old_child_gone() -> bool:
        try:
            return psutil.Process(old_child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(old_child_gone, timeout_s=15, what="the orphaned child to be reaped")
    gate.touch()
    with raw_client(second) as client:
        run = wait_run(client, run_id)
        assert run_view(client, run_id)["output"] == {"survived": True}
    assert run["status"] == "completed"
    wait_for(lambda: runner_statuses(second) == ["exited", "orphaned"], what="both runners")
    assert query(second, "SELECT count(*) FROM node_attempts WHERE node_path = 'first'") == [(1,)]


# conformance: X16
def test_the_server_kills_a_frozen_child_past_its_node_deadline(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "froze"
    workflow = write_workflow(
        tmp_path,
        "freezes",
        f"""
        import os, pathlib, signal
        from piwf.workflow import compute, define_workflow

        def freeze(ctx):
            marker = pathlib.Path({str(marker)!r})
            if not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGSTOP)  # the whole child, engine included
            return {{"thawed": True}}

        workflow = define_workflow(
            name="freezes",
            start_at="freeze",
            nodes={{"freeze": compute(freeze, timeout_ms=500)}},
            edges=[],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "freezes")
        run = wait_run(client, run_id)
    assert run["status"] == "completed"
    wait_for(lambda: runner_statuses(fast_server) == ["exited", "timedOut"], what="both runners")


# conformance: X12
def test_a_cancel_pipelined_with_its_start_starts_no_child(fast_server: ServerProcess) -> None:
    run_id = "run-pipelined-0001"
    with raw_client(fast_server) as client:
        started = client.send(
            "run.start", {"workflow": HELLO, "input": {"who": "x"}}, key="s", run_id=run_id
        )
        cancelled = client.send("run.cancel", key="c", run_id=run_id)
        answers = {r.request_id: r for r in (client.response(), client.response())}
        assert answers[started].outcome == "accepted"
        assert answers[cancelled].outcome == "accepted"
        assert answers[cancelled].receipt is not None
        assert answers[cancelled].receipt["run"]["status"] == "cancelled"
        # Scheduling rounds pass; the cancelled run is never admitted.
        assert client.request("run.wait", {"timeoutMs": 500}, run_id=run_id).receipt is not None
    assert query(fast_server, "SELECT count(*) FROM run_runners") == [(0,)]
    assert query(fast_server, "SELECT status FROM runs") == [("cancelled",)]


def test_a_client_chosen_run_id_must_be_well_formed(fast_server: ServerProcess) -> None:
    with raw_client(fast_server) as client:
        response = client.request(
            "run.start", {"workflow": HELLO}, key="bad-id", run_id="not-a-run"
        )
    assert response.outcome == "rejected"
    assert response.error is not None
    assert response.error.code == "invalidPayload"


@pytest.mark.parametrize(
    ("operation", "payload"),
    [
        ("run.start", {"workflow": "hello\x00"}),
        ("run.start", {"workflow": HELLO, "projectPath": "/tmp/\x00"}),
        ("workflow.show", {"workflow": "a\x00b"}),
    ],
)
def test_a_workflow_name_or_path_holding_nul_is_refused_by_name(
    fast_server: ServerProcess, operation: str, payload: dict[str, str]
) -> None:
    """Any client, not only piwf's (which refuses it before sending): the answer names what
    is wrong instead of the OS's "embedded null byte", and no run is made."""
    with raw_client(fast_server) as client:
        key = "nul" if operation == "run.start" else None  # a read takes no key
        response = client.request(operation, payload, key=key)
    assert (response.outcome, response.error is not None) == ("rejected", True), response
    assert response.error is not None and response.error.code == "invalidPayload"
    assert "holds no NUL character" in response.error.message
    assert query(fast_server, "SELECT count(*) FROM runs") == [(0,)]


# conformance: X13
def test_a_message_of_another_generation_is_refused_and_the_run_is_not_failed(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = servers.start(env={**FAST, "PIWF_RUN_LEASE_MS": "1000", "PIWF_RUN_RENEW_S": "0.1"})
    marker = tmp_path / "forged"
    workflow = write_workflow(
        tmp_path,
        "forger",
        f"""
        import json, os, pathlib, struct, sys, time
        from piwf.workflow import compute, define_workflow

        def forge(ctx):
            marker = pathlib.Path({str(marker)!r})
            if not marker.exists():
                marker.touch()
                fd = int(sys.argv[sys.argv.index("--fd") + 1])
                stale = {{"generation": 99, "kind": "call", "messageId": "forged",
                          "operation": "finish", "payload": {{}}, "runId": ctx.run_id,
                          "runnerEpoch": "runner-x", "schema": "piwf.runner.v1"}}
                body = json.dumps(stale, sort_keys=True, separators=(",", ":")).encode()
                os.write(fd, struct.pack("!i", len(body)) + body)
                time.sleep(60)  # the server stops this child
            return {{"second": True}}

        workflow = define_workflow(
            name="forger", start_at="forge", nodes={{"forge": compute(forge)}}, edges=[]
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "forger")
        run = wait_run(client, run_id)
    assert run["status"] == "completed"
    wait_for(lambda: runner_statuses(server) == ["claimLost", "exited"], what="both runners")
    failures = query(server, "SELECT count(*) FROM events WHERE event_type LIKE '%fail%'")
    assert failures == [(0,)]


def test_values_larger_than_a_frame_travel_as_content_references(
    fast_server: ServerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "crashed-once"
    workflow = write_workflow(
        tmp_path,
        "large",
        f"""
        import os, pathlib
        from piwf.workflow import compute, define_workflow

        def sized(ctx):
            marker = pathlib.Path({str(marker)!r})
            if not marker.exists():
                marker.touch()
                os._exit(23)  # the next runner must read the 3 MB output back
            return {{"size": len(ctx.outputs["big"]["blob"])}}

        workflow = define_workflow(
            name="large",
            start_at="big",
            nodes={{
                "big": compute(lambda ctx: {{"blob": "x" * 3_000_000}}),
                "sized": compute(sized),
            }},
            edges=[{{"from": "big", "to": "sized"}}],
        )
        """,
    )
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "large")
        assert wait_run(client, run_id)["status"] == "completed"
        assert run_view(client, run_id)["output"] == {"size": 3_000_000}
    wait_for(lambda: runner_statuses(fast_server) == ["crashed", "exited"], what="both runners")
