"""Crash matrix: SIGKILL at each named fault point, restart, converge, check.

For every fault point and hit count the workload is the same: a pure run, a run with an
idempotent and a manual action, and a state backup, each sent with an idempotency key. A server
point is armed with ``PIWF_FAULTS=<point>@<n>=kill`` (the server dies there); a child point with
``PIWF_CHILD_FAULTS`` (a runner child stops there for good, frozen, so the server cannot
relaunch it before the test kills the server too; the next server's recovery kills it). Every case
asserts from the fault log that its point was hit. A server restarted without faults receives
the same commands again (the client's retry) and must converge. Then:

- ``state.verify`` reports no violation (and the harness verifies the file again at teardown);
- every run is terminal, or parked with a reason (never silently stuck);
- the client's retries adopted their receipts: two runs and three receipts, never more;
- the effect sink (a file the actions append to) agrees with the outbox: no real attempt
  without its record, at most one attempt per effect per generation, and the manual action
  at most once;
- no runner child of any server generation survives.

A test at the end checks that every registered fault point is in the matrix.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from piwf import faults
from piwf.state import StateDatabase
from tests.server.harness import (
    RawClient,
    ServerFactory,
    ServerProcess,
    raw_client,
    runner_processes,
    wait_for,
)
from tests.server.history import Command, History
from tests.server.test_execution import start, wait_run
from tests.server.test_retention_crash import POINTS as RETENTION_POINTS

FAST = {"PIWF_IDLE_EXIT_S": "0", "PIWF_CLAIM_POLL_S": "0.05", "PIWF_RUN_RENEW_S": "0.2"}
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "workflows"
HELLO = str(FIXTURES / "hello.py")
CHECKPOINT = str(FIXTURES / "checkpoint_review.py")

#: Server-side points on the command, runner and recovery paths, with the hits to try.
MATRIX: list[tuple[str, int]] = [
    ("cmd.after_parse", 2),
    ("cmd.before_commit", 1),
    ("cmd.before_commit", 2),
    ("cmd.after_commit_before_reply", 1),
    ("cmd.after_commit_before_reply", 3),
    ("run.after_claim_commit", 1),
    ("runner.after_launch_record", 1),
    ("runner.after_message_commit", 1),
    ("runner.after_message_commit", 4),
    ("runner.after_message_commit", 9),
    ("runner.after_exit_commit", 1),
    ("backup.before_link", 1),
    ("resolver.before_reply", 1),
    # Points inside runner children, armed through PIWF_CHILD_FAULTS: the child dies there.
    ("child.after_ready", 1),
    ("child.after_commit", 1),
    ("child.after_commit", 3),
    ("effect.before_settle", 1),
    ("effect.before_settle", 2),
]
CHILD_POINTS = {"child.after_ready", "child.after_commit", "effect.before_settle"}
#: The resolver is a supervised child too: its point is armed the children's way.
CHILD_ARMED = CHILD_POINTS | {"resolver.before_reply"}

#: Where a run may rest after the kills: terminal, waiting, or parked with a reason that only an
#: operator lifts (a runner killed before its run made progress parks `runnerNoProgress`).
SETTLED = {"completed", "failed", "timed_out", "cancelled", "ambiguous", "waiting", "parked"}


def effects_workflow(directory: Path, sink: Path) -> str:
    path = directory / "sinked.py"
    path.write_text(
        textwrap.dedent(
            f"""
            from piwf.workflow import action, define_workflow, idempotent_effect, manual_effect

            def record(name):
                def run(ctx):
                    with open({str(sink)!r}, "a") as log:
                        log.write(name + "\\n")
                    return {{"done": name}}
                return run

            workflow = define_workflow(
                name="sinked",
                start_at="deploy",
                nodes={{
                    "deploy": action(effect=idempotent_effect("t.deploy"), run=record("deploy")),
                    "post": action(effect=manual_effect("t.post"), run=record("post")),
                }},
                edges=[{{"from": "deploy", "to": "post"}}],
            )
            """
        )
    )
    return str(path)


def workload(tmp_path: Path, sink: Path) -> list[Command]:
    """The commands of every round, in order: three runs, a backup, pause/resume/cancel."""
    gate = {"workflow": CHECKPOINT, "input": {"steps": ["a"]}}
    return [
        Command("start-hello", "run.start", {"workflow": HELLO, "input": {"who": "a"}}),
        Command("start-sinked", "run.start", {"workflow": effects_workflow(tmp_path, sink)}),
        Command("backup", "state.backup", {"destination": str(tmp_path / "b.sqlite")}),
        Command("start-gate", "run.start", gate),
        Command("pause-gate", "run.pause", {}, run_key="start-gate"),
        Command("resume-gate", "run.resume", {}, run_key="start-gate"),
        Command("cancel-gate", "run.cancel", {}, run_key="start-gate"),
    ]


def converged(server: ServerProcess) -> bool:
    """All three runs exist and rest (the gate run cancelled)."""
    states = run_states(server)
    return len(states) == 3 and set(states) <= SETTLED and "cancelled" in states


def run_states(server: ServerProcess) -> list[str]:
    client = RawClient(server.socket_path, "observer")
    try:
        receipt = client.request("run.list").receipt
    finally:
        client.close()
    assert receipt is not None
    return [
        "parked" if run["needsAction"] and not run["paused"] else run["displayStatus"]
        for run in receipt["runs"]
    ]


def verify(server: ServerProcess) -> dict[str, Any]:
    client = RawClient(server.socket_path, "verifier")
    try:
        receipt = client.request("state.verify").receipt
    finally:
        client.close()
    assert receipt is not None
    return receipt


# conformance: X4
@pytest.mark.parametrize(("point", "hit"), MATRIX, ids=[f"{p}@{n}" for p, n in MATRIX])
def test_the_server_converges_after_a_kill_at_every_point(
    servers: ServerFactory, tmp_path: Path, point: str, hit: int
) -> None:
    sink = tmp_path / "sink"
    commands, history = workload(tmp_path, sink), History()
    log = tmp_path / "faults.log"
    variable = "PIWF_CHILD_FAULTS" if point in CHILD_ARMED else "PIWF_FAULTS"
    # A runner child is frozen rather than killed: a relaunch (a few milliseconds from the fork
    # server) would otherwise die at its own first hit before the server is killed.
    action = "stop" if point in CHILD_POINTS else "kill"
    armed = servers.start(
        env={**FAST, variable: f"{point}@{hit}={action}", "PIWF_FAULTS_LOG": str(log)}
    )
    assert armed.ready["ok"] is True
    history.run(armed, commands)

    # The fault fired: the server died, or (a child point) a child stopped there for good and
    # the server is killed too, so recovery meets a dead child's state and a crashed server.
    def fired() -> bool:
        return not armed.alive() or log.exists()

    wait_for(fired, timeout_s=60, what=f"{point}@{hit} to fire")
    armed.kill()
    assert log.read_text().split()[1:3] == [point, str(hit)], "the armed point was hit"
    survivor = servers.start(env=FAST)
    assert survivor.ready["ok"] is True, survivor.ready
    history.run(survivor, commands)  # the client retries with the same keys
    wait_for(lambda: converged(survivor), timeout_s=60, what="the workload to converge")
    assert verify(survivor) == {"valid": True, "violations": []}
    # A child point can leave runs parked runnerNoProgress (every child of the armed server
    # died before it committed progress: how many did depends on how soon the test killed that
    # server). An operator's resume then finishes them under the survivor, whose children are
    # not armed.
    resume_runs_without_progress(survivor)
    wait_for(lambda: converged(survivor), timeout_s=60, what="the resumed runs to settle")
    assert run_states(survivor).count("completed") >= 1
    check_effect_attempts(survivor, sink)
    history.check(survivor, commands)
    with StateDatabase(survivor.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        runs = tx.scalar("SELECT count(*) FROM runs")
    assert runs == 3, "a retried start never creates a second run"
    survivor.terminate()
    wait_for(lambda: not runner_processes(survivor.home), timeout_s=15, what="no runner left")


def resume_runs_without_progress(server: ServerProcess) -> None:
    client = RawClient(server.socket_path, "operator")
    try:
        receipt = client.request("run.list").receipt
        assert receipt is not None
        for run in receipt["runs"]:
            if run["needsAction"] and run.get("errorCode") == "runnerNoProgress":
                resumed = client.request("run.resume", run_id=run["runId"], key=run["runId"])
                assert resumed.outcome == "accepted", resumed
    finally:
        client.close()


def check_effect_attempts(server: ServerProcess, sink: Path) -> None:
    """The effect sink against the outbox: every real attempt was recorded first, at most one
    per idempotent effect per generation, and a manual action never ran twice."""
    real = sink.read_text().split() if sink.exists() else []
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        recorded = dict(
            tx.all(
                "SELECT e.effect_type, count(a.effect_id) FROM effects e"
                " LEFT JOIN effect_attempts a ON a.effect_id = e.effect_id GROUP BY e.effect_type"
            )
        )
        per_generation = tx.scalar(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM effect_attempts"
            " GROUP BY effect_id, lease_generation)"
        )
    assert real.count("post") <= 1, "a manual action never runs twice by itself"
    assert real.count("deploy") <= recorded.get("t.deploy", 0), "no attempt without its record"
    assert real.count("post") <= recorded.get("t.post", 0), "no attempt without its record"
    assert per_generation <= 1, "at most one attempt per effect per generation"


def test_a_claim_commits_with_its_runner_row(servers: ServerFactory) -> None:
    """Claiming a run and recording its launch are one commit: a server killed right after the
    claim's commit has left the run's runner row too (``starting``; a spare's pid may be in it,
    recorded with the launch)."""
    dying = servers.start(env={**FAST, "PIWF_FAULTS": "run.after_claim_commit@1=kill"})
    client = RawClient(dying.socket_path, "starter")
    try:
        started = client.request("run.start", {"workflow": HELLO}, key="claimed")
    finally:
        client.close()
    assert started.outcome == "accepted", started
    wait_for(lambda: not dying.alive(), timeout_s=30, what="the server to die at its claim")
    dying.kill()
    with StateDatabase(dying.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        queue = tx.all("SELECT status FROM run_queue")
        runners = tx.all("SELECT status FROM run_runners")
    assert [tuple(row) for row in queue] == [("starting",)]
    assert [tuple(row) for row in runners] == [("starting",)]


@pytest.mark.parametrize("point", ["server.after_epoch", "server.before_listen"])
def test_a_kill_while_starting_leaves_a_state_the_next_start_takes_over(
    servers: ServerFactory, point: str
) -> None:
    dying = servers.start(env={**FAST, "PIWF_FAULTS": f"{point}@1=kill"})
    assert dying.ready == {}, "it died before reporting ready"
    assert dying.process.wait(timeout=15) == -9
    survivor = servers.start(env=FAST)
    assert survivor.ready["ok"] is True
    assert survivor.ready["epoch"] == 2
    assert verify(survivor) == {"valid": True, "violations": []}


def test_a_kill_while_stopping_leaves_a_state_the_next_start_takes_over(
    servers: ServerFactory,
) -> None:
    """Killed after its children stopped, before it released its epoch and closed the
    database: the stop's client sees the connection drop, and the next server takes over."""
    dying = servers.start(env={**FAST, "PIWF_FAULTS": "server.before_release@1=kill"})
    with raw_client(dying) as client:
        run_id = start(client, HELLO, {"who": "x"}, "hello")
        assert wait_run(client, run_id)["status"] == "completed"
        assert client.request("server.stop", key="stop").outcome == "accepted"
        assert client.closed_by_server(timeout_s=15)
    assert dying.process.wait(timeout=15) == -9
    survivor = servers.start(env=FAST)
    assert survivor.ready["ok"] is True
    assert survivor.ready["epoch"] == 2
    assert verify(survivor) == {"valid": True, "violations": []}


def test_a_kill_during_recovery_converges_on_the_next_start(
    servers: ServerFactory, tmp_path: Path
) -> None:
    sink = tmp_path / "sink"
    commands, history = workload(tmp_path, sink), History()
    first = servers.start(env={**FAST, "PIWF_FAULTS": "runner.after_message_commit@2=kill"})
    history.run(first, commands)
    wait_for(lambda: not first.alive(), timeout_s=60, what="the first server to die")
    recovering = servers.start(env={**FAST, "PIWF_FAULTS": "recovery.after_each_fix@1=kill"})
    assert recovering.ready == {}, "it died inside recovery, before listening"
    survivor = servers.start(env=FAST)
    assert survivor.ready["ok"] is True
    history.run(survivor, commands)
    wait_for(lambda: converged(survivor), timeout_s=60, what="the workload to converge")
    assert verify(survivor) == {"valid": True, "violations": []}
    check_effect_attempts(survivor, sink)
    history.check(survivor, commands)


def test_every_fault_point_is_in_the_matrix() -> None:
    """Each matrix case asserts its point was hit; the startup tests assert their deaths,
    ``test_retention_crash.py`` kills the maintenance sweep at its points, and
    ``test_agent_deadlines.py`` kills the server at an agent's deadline and
    ``tests/viewer/test_view_crash.py`` fails ``piwf view`` (no server state: not a crash case)
    and ``test_channel_faults.py`` fails a channel adapter's poll (the adapter's own crash) and
    the server's write of a press from the chat (a failed commit, not a crash)."""
    startup = {"server.after_epoch", "server.before_listen", "recovery.after_each_fix"}
    startup.add("server.before_release")  # and stopping (the test above)
    deadlines = {"deadline.before_stop"}
    viewer = {"viewer.show_runs"}
    adapters = {"channel.after_poll", "channel.before_answer_commit"}
    covered = {point for point, _ in MATRIX} | startup | set(RETENTION_POINTS) | deadlines
    covered |= viewer | adapters
    assert covered >= faults.POINTS, sorted(faults.POINTS - covered)
