"""Durable commands in the loop turn's group commit (``DurableCommands.execute_later``), on a real
database file: the commands of one turn share one transaction and one commit, each keeps its own
receipt check, change and receipt, and nobody is answered before the commit."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import pytest

from piwf.errors import InvalidTransitionError
from piwf.protocol.client_v1 import Request, Response
from piwf.server.commands import CommandResult, DurableCommands
from piwf.state import StateDatabase, Transaction
from piwf.state.server_epoch import ServerClaim, acquire_server_claim


@pytest.fixture
def commands(db: StateDatabase) -> DurableCommands:
    with db.write() as tx:
        taken = acquire_server_claim(
            tx,
            server_id="server-a",
            pid=4242,
            process_start_identity="4242:1.0:boot",
            lease_ms=60_000,
        )
    claim = getattr(taken, "value", None)
    assert isinstance(claim, ServerClaim), taken
    return DurableCommands(db, claim)


def request(number: int, key: str | None = None) -> Request:
    return Request(
        request_id=f"r{number}",
        client_id="client-a",
        operation="run.cancel",
        idempotency_key=key or f"k{number}",
        run_id="run-aaaaaaaa",
        payload={},
    )


def insert_project(name: str) -> Callable[[Transaction], CommandResult]:
    def change(tx: Transaction) -> CommandResult:
        tx.execute("INSERT INTO projects VALUES (?, ?, 1)", (name, f"/{name}"))
        return CommandResult.accepted({"project": name})

    return change


def committed_projects(db: StateDatabase) -> list[str]:
    outside = sqlite3.connect(f"file:{db.path}?mode=ro", uri=True)
    try:
        return [row[0] for row in outside.execute("SELECT project_id FROM projects ORDER BY 1")]
    finally:
        outside.close()


def test_commands_of_one_turn_share_one_commit_and_are_answered_after_it(
    db: StateDatabase, commands: DurableCommands
) -> None:
    answers: list[tuple[Response, list[str]]] = []

    def answered(response: Response) -> None:
        answers.append((response, committed_projects(db)))

    statements: list[str] = []
    db.connection.set_trace_callback(statements.append)
    try:
        for number, name in enumerate(("a", "b", "c")):
            commands.execute_later(request(number), insert_project(name), answered)
        assert answers == [] and committed_projects(db) == [], "queued, nothing applied yet"
        db.group.flush()
    finally:
        db.connection.set_trace_callback(None)

    assert statements.count("COMMIT") == 1, "one commit for the three commands"
    assert [(response.outcome, response.receipt) for response, _ in answers] == [
        ("accepted", {"project": "a"}),
        ("accepted", {"project": "b"}),
        ("accepted", {"project": "c"}),
    ]
    # Every answer came once every change was visible from outside: after the commit.
    assert {tuple(seen) for _, seen in answers} == {("a", "b", "c")}


def test_a_repeat_in_the_same_group_adopts_the_receipt_of_the_first(
    db: StateDatabase, commands: DurableCommands
) -> None:
    answers: list[Response] = []
    commands.execute_later(request(1, key="same"), insert_project("a"), answers.append)
    commands.execute_later(request(2, key="same"), insert_project("a"), answers.append)
    db.group.flush()
    assert [response.outcome for response in answers] == ["accepted", "adopted"]
    assert committed_projects(db) == ["a"], "the change ran once"


def test_a_refused_change_is_stored_and_a_broken_one_changes_nothing(
    db: StateDatabase, commands: DurableCommands
) -> None:
    def refused(tx: Transaction) -> CommandResult:
        tx.execute("INSERT INTO projects VALUES ('r', '/r', 1)")
        raise InvalidTransitionError("not now")

    def broken(tx: Transaction) -> CommandResult:
        tx.execute("INSERT INTO projects VALUES ('x', '/x', 1)")
        raise KeyError("a bug")

    answers: list[Response] = []
    commands.execute_later(request(1), refused, answers.append)
    commands.execute_later(request(2), broken, answers.append)
    commands.execute_later(request(3), insert_project("c"), answers.append)
    db.group.flush()

    refusal, failure, accepted = answers
    assert refusal.outcome == "rejected" and refusal.error is not None
    assert "not now" in refusal.error.message
    assert failure.outcome == "rejected" and failure.error is not None
    assert failure.error.code == "internalError"
    assert accepted.outcome == "accepted"
    # The refusal's and the bug's writes were undone with their savepoints; the rest committed.
    assert committed_projects(db) == ["c"]
    # The refusal has a receipt (a retry gets the same answer); the broken command has none.
    assert commands.lookup(request(11, key="k1")) is not None
    assert commands.lookup(request(12, key="k2")) is None


def test_a_failing_file_answers_every_queued_command_unavailable_with_nothing_stored(
    db: StateDatabase, commands: DurableCommands, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers: list[Response] = []
    commands.execute_later(request(1), insert_project("a"), answers.append)
    commands.execute_later(request(2), insert_project("b"), answers.append)

    real_connection = db.connection

    class FullDisk:
        """The connection, with COMMIT failing as a full disk fails it."""

        def __getattr__(self, name: str) -> object:
            return getattr(real_connection, name)

        def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("database or disk is full")
            return real_connection.execute(sql, *args)

    monkeypatch.setattr(db, "_connection", FullDisk())
    db.group.flush()
    monkeypatch.undo()

    assert [response.outcome for response in answers] == ["unavailable", "unavailable"]
    assert all(r.error is not None and r.error.code == "stateFull" for r in answers), answers
    assert committed_projects(db) == []
    assert commands.lookup(request(11, key="k1")) is None, "nothing stored: a retry runs again"
