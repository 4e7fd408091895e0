"""Command receipts across reconnects and crashes: adopt, conflict, request-id reuse."""

from __future__ import annotations

from pathlib import Path

from piwf.state import StateDatabase
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client


def receipts(home: Path) -> list[tuple[str, str, str]]:
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        rows = tx.all(
            "SELECT request_id, idempotency_key, outcome FROM server_commands ORDER BY created_at"
        )
    return [tuple(row) for row in rows]  # type: ignore[misc]


def backup_payload(tmp_path: Path, name: str) -> dict[str, str]:
    return {"destination": str(tmp_path / name)}


# conformance: X6
def test_a_retry_with_a_new_request_id_adopts_the_stored_receipt(
    server: ServerProcess, tmp_path: Path
) -> None:
    payload = backup_payload(tmp_path, "one.sqlite")
    with raw_client(server) as client:
        first = client.request("state.backup", payload, key="backup-1")
    with raw_client(server) as client:  # a new connection, as after a reconnect
        again = client.request("state.backup", payload, key="backup-1")
    assert first.outcome == "accepted"
    assert again.outcome == "adopted"
    assert again.receipt == first.receipt
    assert [row[1:] for row in receipts(server.home)] == [("backup-1", "accepted")]


# conformance: X6
def test_another_payload_under_the_same_key_is_a_conflict(
    server: ServerProcess, tmp_path: Path
) -> None:
    with raw_client(server) as client:
        first = client.request("state.backup", backup_payload(tmp_path, "a.sqlite"), key="k")
        other = client.request("state.backup", backup_payload(tmp_path, "b.sqlite"), key="k")
    assert first.outcome == "accepted"
    assert other.outcome == "conflict"
    assert other.error is not None
    assert other.error.code == "idempotencyConflict"
    assert not (tmp_path / "b.sqlite").exists(), "the conflicting command did not run"
    assert len(receipts(server.home)) == 1


def test_a_stop_under_a_key_used_for_another_command_is_a_conflict_and_does_not_stop(
    server: ServerProcess, tmp_path: Path
) -> None:
    with raw_client(server) as client:
        first = client.request("state.backup", backup_payload(tmp_path, "a.sqlite"), key="k")
        stop = client.request("server.stop", key="k")
        assert first.outcome == "accepted"
        assert stop.outcome == "conflict"
        assert stop.error is not None
        assert stop.error.code == "idempotencyConflict"
        assert client.request("server.status").outcome == "accepted"
    assert server.alive(), "a refused stop left the server running"
    assert len(receipts(server.home)) == 1


def test_reusing_a_request_id_for_another_payload_is_a_conflict(
    server: ServerProcess, tmp_path: Path
) -> None:
    with raw_client(server) as client:
        client.request(
            "state.backup", backup_payload(tmp_path, "a.sqlite"), key="k1", request_id="same"
        )
        reused = client.request(
            "state.backup", backup_payload(tmp_path, "b.sqlite"), key="k2", request_id="same"
        )
    with raw_client(server, "another-client") as other:
        elsewhere = other.request(
            "state.backup", backup_payload(tmp_path, "c.sqlite"), key="k1", request_id="same"
        )
    for refused in (reused, elsewhere):
        assert refused.outcome == "conflict"
        assert refused.error is not None
        assert "give every request a new id" in refused.error.message
    assert not (tmp_path / "b.sqlite").exists()
    assert not (tmp_path / "c.sqlite").exists()


def test_a_refused_command_is_stored_and_replayed(server: ServerProcess) -> None:
    with raw_client(server) as client:
        first = client.request("run.cancel", {}, key="cancel-1", run_id="run-missing")
        again = client.request("run.cancel", {}, key="cancel-1", run_id="run-missing")
    assert first.outcome == again.outcome == "notFound"
    assert first.error == again.error
    assert [row[2] for row in receipts(server.home)] == ["notFound"]


# conformance: X3
def test_connection_dropped_after_commit_then_retry_adopts(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = servers.start(
        env={"PIWF_FAULTS": "cmd.after_commit_before_reply@1=drop", "PIWF_IDLE_EXIT_S": "0"}
    )
    payload = backup_payload(tmp_path, "dropped.sqlite")
    client = RawClient(server.socket_path)
    client.send("state.backup", payload, key="lost-answer")
    assert client.closed_by_server(), "the answer was never sent"
    client.close()
    assert (tmp_path / "dropped.sqlite").exists(), "the command committed before the drop"
    with raw_client(server) as retry:
        response = retry.request("state.backup", payload, key="lost-answer")
    assert response.outcome == "adopted"
    assert response.receipt is not None
    assert response.receipt["destination"] == str(tmp_path / "dropped.sqlite")
    assert len(receipts(server.home)) == 1


# conformance: X3
def test_server_killed_after_commit_then_retry_adopts_on_the_next_server(
    servers: ServerFactory, tmp_path: Path
) -> None:
    crashing = servers.start(
        env={"PIWF_FAULTS": "cmd.after_commit_before_reply@1=kill", "PIWF_IDLE_EXIT_S": "0"}
    )
    payload = backup_payload(tmp_path, "killed.sqlite")
    client = RawClient(crashing.socket_path)
    client.send("state.backup", payload, key="crash")
    assert client.closed_by_server()
    client.close()
    assert crashing.process.wait(timeout=10) == -9
    successor = servers.start(env={"PIWF_IDLE_EXIT_S": "0"})
    assert successor.ready["epoch"] == 2
    with raw_client(successor) as retry:
        response = retry.request("state.backup", payload, key="crash")
    assert response.outcome == "adopted"
    assert [row[1:] for row in receipts(successor.home)] == [("crash", "accepted")]


def test_a_busy_database_answers_unavailable_and_stores_nothing(
    server: ServerProcess, tmp_path: Path
) -> None:
    import sqlite3

    blocker = sqlite3.connect(server.home / "state.sqlite", isolation_level=None, timeout=0)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with raw_client(server) as client:
            response = client.request("run.cancel", {}, key="busy", run_id="run-x")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert response.outcome == "unavailable"
    assert receipts(server.home) == []
    with raw_client(server) as client:
        assert client.request("run.cancel", {}, key="busy", run_id="run-x").outcome == "notFound"


HELLO = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py")


# conformance: X6
def test_pipelined_starts_under_one_key_create_exactly_one_run(server: ServerProcess) -> None:
    payload = {"workflow": HELLO, "input": {"who": "ada"}}
    with raw_client(server) as client:
        sent = [client.send("run.start", payload, key="one-start") for _ in range(20)]
        answers = {response.request_id: response for response in (client.response() for _ in sent)}
    assert sorted(answers) == sorted(sent)
    outcomes = [answers[request_id].outcome for request_id in sent]
    assert outcomes.count("accepted") == 1
    assert set(outcomes) == {"accepted", "adopted"}
    run_ids = {answers[r].receipt["run"]["runId"] for r in sent}  # type: ignore[index]
    assert len(run_ids) == 1
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 1
    assert len(receipts(server.home)) == 1


def test_a_start_with_another_payload_under_an_in_flight_key_conflicts(
    server: ServerProcess,
) -> None:
    with raw_client(server) as client:
        first = client.send("run.start", {"workflow": HELLO, "input": {"who": "a"}}, key="k")
        second = client.send("run.start", {"workflow": HELLO, "input": {"who": "b"}}, key="k")
        answers = {r.request_id: r for r in (client.response(), client.response())}
    assert answers[first].outcome == "accepted"
    assert answers[second].outcome == "conflict"
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 1


def test_a_broken_workflow_file_is_rejected_and_nothing_is_stored_but_the_receipt(
    server: ServerProcess, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def oops(:\n")
    with raw_client(server) as client:
        response = client.request("run.start", {"workflow": str(broken)}, key="broken")
    assert response.outcome == "rejected"
    assert response.error is not None
    assert response.error.code == "workflowLoad"
    assert str(broken) in response.error.message
    assert "line 1" in response.error.message
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 0
