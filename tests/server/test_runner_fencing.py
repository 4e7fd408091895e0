"""Fencing through the real runner pipe: a runner writes only into the run it was launched for.

Hostile workflow code runs inside a real runner child and talks to the real server over that
child's own pipe: it finds the runner's :class:`~piwf.runner.workflow_runner.PipePort` (or the
raw descriptor) and proposes changes that name *another live run*, or sends frames that are not
runner.v1 at all. Each such call is refused as ``protocolRejected``; the victim run is untouched
and completes with its own output; the hostile run parks ``protocolRejected`` (a runner that
broke the protocol is not relaunched by itself) until an explicit resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import (
    FAST,
    hold_until_gate,
    query,
    queue_of,
    run_view,
    start,
    wait_run,
    write_workflow,
)

# Each hostile call, as workflow code run inside the hostile runner. ``victim`` is the id of a
# live run whose node "hold" is executing (visit 1, attempt 1) under its own runner.
HOSTILE_CALLS = {
    "finish another run's node": """
        from piwf.workflow import port as p
        message = p.NodeFinished(run_id=victim, path="hold", visit=1, attempt=1,
                                 output={"forged": True}, finished_at_ms=1)
        found.call("node_finished", p.message_to_json(message))
    """,
    "finish another run": """
        from piwf.workflow import port as p
        message = p.RunFinished(run_id=victim, status=p.RunStatus.COMPLETED,
                                output={"forged": True}, error=None, path=None)
        found.call("finish", p.message_to_json(message))
    """,
    "read another run": """
        found.call("read_run", {"run_id": victim})
    """,
    "an envelope naming another run": """
        from piwf import canonical
        from piwf.workflow import port as p
        message = p.NodeFinished(run_id=victim, path="hold", visit=1, attempt=1,
                                 output={"forged": True}, finished_at_ms=1)
        found.connection.send_bytes(canonical.encode({
            "schema": "piwf.runner.v1", "kind": "call", "runId": victim,
            "generation": found.launch.generation, "runnerEpoch": found.launch.runner_epoch,
            "messageId": "forged", "operation": "node_finished",
            "payload": p.message_to_json(message)}))
        found.connection.recv_bytes()
    """,
    "a payload of the wrong shape": """
        found.call("node_finished", {"run_id": ctx.run_id, "path": 7, "surprise": True})
    """,
    "a batch with another run's change": """
        from piwf.workflow import port as p
        own = p.NodeFinished(run_id=ctx.run_id, path="attack", visit=1, attempt=1,
                             output={"hostile": "early"}, finished_at_ms=1)
        forged = p.NodeFinished(run_id=victim, path="hold", visit=1, attempt=1,
                                output={"forged": True}, finished_at_ms=1)
        found.call("batch", {"calls": [
            {"messageId": "b1", "operation": "node_finished", "payload": p.message_to_json(own)},
            {"messageId": "b2", "operation": "node_finished",
             "payload": p.message_to_json(forged)}]})
    """,
    "a batch that is not runner.v1": """
        found.call("batch", {"calls": [
            {"messageId": "b1", "operation": "read_run", "payload": {"run_id": ctx.run_id}},
            {"messageId": "b2", "operation": "read_run", "payload": {"run_id": victim}}]})
    """,
    "an unknown operation": """
        found.call("drop_tables", {"run_id": ctx.run_id})
    """,
    "a frame that is not runner.v1": """
        found.connection.send_bytes(b'{"hello":"there"}')
        found.connection.recv_bytes()
    """,
}


def _hostile_workflow(directory: Path, marker: Path, call: str) -> str:
    body = "\n".join("                " + line.strip() for line in call.strip().splitlines())
    return write_workflow(
        directory,
        "hostile",
        f"""
        import gc, pathlib
        from piwf.workflow import compute, define_workflow

        def attack(ctx):
            marker = pathlib.Path({str(marker)!r})
            if not marker.exists():
                marker.touch()
                from piwf.runner.workflow_runner import PipePort
                found = next(o for o in gc.get_objects() if isinstance(o, PipePort))
                victim = ctx.input["victim"]
{body}
            return {{"hostile": "done"}}

        workflow = define_workflow(
            name="hostile", start_at="attack", nodes={{"attack": compute(attack)}}, edges=[]
        )
        """,
    )


def _victim_workflow(directory: Path, entered: Path, gate: Path) -> str:
    return write_workflow(
        directory,
        "victim",
        f"""
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def hold(ctx):
            wait_for_gate({str(entered)!r}, {str(gate)!r})
            return {{"victim": "own output"}}

        workflow = define_workflow(
            name="victim", start_at="hold", nodes={{"hold": compute(hold)}}, edges=[]
        )
        """,
    )


def _events(server: ServerProcess, run_id: str) -> list[str]:
    rows = query(
        server,
        "SELECT e.event_type FROM events e JOIN runs r ON r.resource_id = e.resource_id"
        " WHERE r.run_id = ? ORDER BY e.resource_revision",
        (run_id,),
    )
    return [row[0] for row in rows]


def _runner_rows(server: ServerProcess, run_id: str) -> list[tuple[str, str | None]]:
    rows = query(
        server,
        "SELECT status, diagnostic_hash IS NOT NULL FROM run_runners WHERE run_id = ?"
        " ORDER BY started_at, rowid",
        (run_id,),
    )
    return [(row[0], row[1]) for row in rows]


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def _start_victim(client: RawClient, tmp_path: Path) -> tuple[str, Path]:
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    victim = start(client, _victim_workflow(tmp_path, entered, gate), {}, "victim")
    wait_for(entered.exists, what="the victim's node to start")
    return victim, gate


@pytest.mark.parametrize("case", sorted(HOSTILE_CALLS))
def test_a_runner_cannot_write_into_another_live_run(
    server: ServerProcess, tmp_path: Path, case: str
) -> None:
    marker = tmp_path / "attacked"
    with raw_client(server) as client:
        victim, gate = _start_victim(client, tmp_path)
        victim_events = _events(server, victim)
        hostile = start(
            client,
            _hostile_workflow(tmp_path, marker, HOSTILE_CALLS[case]),
            {"victim": victim},
            "hostile",
        )
        wait_for(
            lambda: queue_of(server, hostile) == ("parked", "protocolRejected"),
            what="the hostile run's protocolRejected park",
        )
        assert marker.exists(), "the hostile code ran"
        # The hostile runner was killed as crashed, with the broken rule as its diagnostic.
        wait_for(lambda: _runner_rows(server, hostile) == [("crashed", 1)], what="its runner")
        assert "run.protocol_rejected" in _events(server, hostile)
        # The victim saw no change of any kind while its node still runs ...
        assert _events(server, victim) == victim_events
        gate.touch()
        # ... and completes with its own output.
        assert wait_run(client, victim)["status"] == "completed"
        assert run_view(client, victim)["output"] == {"victim": "own output"}
        # The hostile run needs an explicit resume; then it completes (the marker stops the
        # attack the second time).
        assert queue_of(server, hostile) == ("parked", "protocolRejected")
        # server status counts it parked by its reason, never as running.
        status = client.request("server.status").receipt
        assert status is not None
        assert (status["parkedRuns"], status["parkedByReason"]) == (1, {"protocolRejected": 1})
        assert (status["runningRuns"], status["queuedRuns"]) == (0, 0)
        # run show says why, and that it waits for an operator.
        detail = run_view(client, hostile)
        assert detail["run"]["needsAction"] is True
        assert detail["parkedReason"], detail
        assert client.request("run.resume", run_id=hostile, key="resume").outcome == "accepted"
        assert wait_run(client, hostile)["status"] == "completed"
