"""A node costs one commit: its end travels with the next node's start, through real servers.

The runner sends a node's end in one ``batch`` with the next node's start (the run's start with
its first node's); the server applies them in one transaction. What must hold: the next node's
code runs only once both are committed; a server killed right after that commit finds both and
the finished node never runs again; each change keeps its own receipt and event.
"""

from __future__ import annotations

from pathlib import Path

from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import (
    FAST,
    hold_until_gate,
    query,
    start,
    wait_run,
    write_workflow,
)


def _two_nodes(directory: Path, runs_log: Path, entered: Path, gate: Path) -> str:
    """``first`` notes each execution in ``runs_log``; ``second`` waits at the gate."""
    return write_workflow(
        directory,
        "two_nodes",
        f"""
        import pathlib
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def first(ctx):
            with pathlib.Path({str(runs_log)!r}).open("a") as log:
                log.write("first\\n")
            return {{"v": ctx.input["v"] + 1}}

        def second(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return {{"v": ctx.outputs["first"]["v"] * 2}}

        workflow = define_workflow(
            name="two-nodes",
            start_at="first",
            nodes={{"first": compute(first), "second": compute(second)}},
            edges=[{{"from": "first", "to": "second"}}],
        )
        """,
    )


def _attempts(server: ServerProcess, run_id: str) -> list[tuple[str, str]]:
    rows = query(
        server,
        "SELECT node_path, status FROM node_attempts WHERE run_id = ? ORDER BY started_at, rowid",
        (run_id,),
    )
    return [(row[0], row[1]) for row in rows]


def test_the_next_node_runs_only_once_the_previous_end_is_committed(
    servers: ServerFactory, tmp_path: Path
) -> None:
    entered, gate, runs_log = tmp_path / "entered", tmp_path / "gate", tmp_path / "runs"
    server = servers.start(env=FAST)
    with raw_client(server) as client:
        run_id = start(client, _two_nodes(tmp_path, runs_log, entered, gate), {"v": 1}, "two")
        wait_for(entered.exists, what="the second node to start")
        # The second node's code is running: the first node's end committed before it.
        assert _attempts(server, run_id) == [("first", "completed"), ("second", "running")]
        gate.touch()
        run = wait_run(client, run_id)
        assert run["status"] == "completed", run
    # Every message kept its own receipt: run start, twice a node start and end, run end;
    # the run's begin changed nothing (the run was committed with its title), so it is adopted.
    receipts = query(
        server,
        "SELECT m.outcome FROM runner_messages m JOIN run_runners r"
        " ON r.runner_epoch = m.runner_epoch WHERE r.run_id = ?",
        (run_id,),
    )
    assert sorted(row[0] for row in receipts) == ["accepted"] * 5 + ["adopted"]
    events = query(
        server,
        "SELECT e.event_type FROM events e JOIN runs r ON r.resource_id = e.resource_id"
        " WHERE r.run_id = ? ORDER BY e.resource_revision",
        (run_id,),
    )
    types = [row[0] for row in events]
    assert types.count("node.started") == 2
    assert types.count("node.finished") == 2


def test_a_server_killed_after_a_node_end_and_the_next_start_committed_finds_both(
    servers: ServerFactory, tmp_path: Path
) -> None:
    entered, gate, runs_log = tmp_path / "entered", tmp_path / "gate", tmp_path / "runs"
    gate.touch()  # the second node runs through once it runs at all
    # The second committed runner call is the first node's end with the second node's start
    # (the first is the run's start with the first node's): the server dies right after it.
    dying = servers.start(env={**FAST, "PIWF_FAULTS": "runner.after_message_commit@2=kill"})
    with raw_client(dying) as client:
        run_id = start(client, _two_nodes(tmp_path, runs_log, entered, gate), {"v": 1}, "two")
    wait_for(lambda: not dying.alive(), timeout_s=60, what="the server to die at the point")
    assert _attempts(dying, run_id) == [("first", "completed"), ("second", "running")]
    survivor = servers.start(env=FAST)
    with raw_client(survivor) as client:
        run = wait_run(client, run_id)
    assert run["status"] == "completed", run
    assert runs_log.read_text() == "first\n", "the committed first node never ran again"
    paths = [path for path, _ in _attempts(survivor, run_id)]
    assert paths.count("first") == 1
