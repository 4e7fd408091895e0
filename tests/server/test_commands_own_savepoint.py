"""``DurableCommands.execute(..., own_savepoint=False)`` on a real database file: the change runs
directly in the command's transaction, so the savepoints it opens (a prune opens one per tree)
are outermost ones, whose undo pages SQLite drops at each release instead of keeping them all
in memory until the command's savepoint ends. A failing change then stores nothing."""

from __future__ import annotations

import pytest

from piwf.errors import InvalidTransitionError
from piwf.server.commands import CommandResult, DurableCommands
from piwf.state import StateDatabase, Transaction
from tests.server.test_commands_in_group import (
    commands,  # noqa: F401 - a fixture used by name
    committed_projects,
    request,
)


def _per_project_savepoints(tx: Transaction) -> CommandResult:
    for name in ("a", "b"):
        with tx.savepoint() as step:
            step.execute("INSERT INTO projects VALUES (?, ?, 1)", (name, f"/{name}"))
    return CommandResult.accepted({"projects": 2})


def _savepoints(db: StateDatabase, commands: DurableCommands, **options: bool) -> list[str]:  # noqa: F811
    statements: list[str] = []
    db.connection.set_trace_callback(statements.append)
    try:
        response = commands.execute(request(1), _per_project_savepoints, **options)
    finally:
        db.connection.set_trace_callback(None)
    assert response.outcome == "accepted"
    assert committed_projects(db) == ["a", "b"]
    return [s for s in statements if s.startswith("SAVEPOINT")]


def test_a_change_without_its_own_savepoint_opens_outermost_savepoints(
    db: StateDatabase,
    commands: DurableCommands,  # noqa: F811
) -> None:
    assert _savepoints(db, commands, own_savepoint=False) == ["SAVEPOINT piwf_1"] * 2


def test_by_default_the_change_runs_in_a_savepoint_of_its_own(
    db: StateDatabase,
    commands: DurableCommands,  # noqa: F811
) -> None:
    assert _savepoints(db, commands) == ["SAVEPOINT piwf_1"] + ["SAVEPOINT piwf_2"] * 2


def test_a_failing_change_without_its_own_savepoint_stores_nothing(
    db: StateDatabase,
    commands: DurableCommands,  # noqa: F811
) -> None:
    def fails(tx: Transaction) -> CommandResult:
        tx.execute("INSERT INTO projects VALUES ('a', '/a', 1)")
        raise InvalidTransitionError("refused after a write")

    with pytest.raises(InvalidTransitionError):
        commands.execute(request(1), fails, own_savepoint=False)
    assert committed_projects(db) == []
    # Nothing stored: the same key runs afresh.
    again = commands.execute(request(2, key="k1"), _per_project_savepoints, own_savepoint=False)
    assert again.outcome == "accepted"
    assert committed_projects(db) == ["a", "b"]
