"""One owner per fact: each table has one writing module; no module grows past 600 lines.

The writers are found in the source text of ``piwf/state`` (every ``INSERT INTO``, ``UPDATE``
and ``DELETE FROM`` that names a table), so a second module that starts writing a table fails
here with both names. Reads may join any table; they go through the owner's row types where a
typed row is read (``docs/ARCHITECTURE.md``, "Who writes which table").
"""

from __future__ import annotations

import re
from pathlib import Path

import piwf
from piwf.state.schema import SCHEMA_SQL

PACKAGE = Path(piwf.__file__).parent
STATE = PACKAGE / "state"

#: Table -> the one module (under piwf/state) that writes it.
OWNERS = {
    "schema_meta": "database.py",
    "blobs": "blobs.py",
    "resources": "records.py",
    "events": "records.py",
    "leases": "leases.py",
    "effects": "effects.py",
    "effect_attempts": "effects.py",
    "server_state": "server_epoch.py",
    "server_commands": "commands.py",
    "human_decisions": "decisions.py",
    "human_decision_resolutions": "decisions.py",
    "human_decision_submissions": "decisions.py",
    "retention_state": "retention_status.py",
    "workflow_definitions": "execution/runs.py",
    "projects": "execution/runs.py",
    "runs": "execution/runs.py",
    "run_sources": "execution/runs.py",
    "run_bindings": "execution/runs.py",
    "run_queue": "execution/queue.py",
    "node_attempts": "execution/attempts.py",
    "run_steps": "execution/attempts.py",
    "interactive_requests": "execution/requests.py",
    "interactive_submissions": "execution/submissions.py",
    "workflow_updates": "execution/updates.py",
    "run_notifications": "execution/updates.py",
    "run_runners": "execution/runners.py",
    "runner_messages": "execution/runners.py",
    "managed_resources": "resources/managed.py",
    "managed_resource_finalizers": "resources/managed.py",
    "managed_resource_queue": "resources/managed.py",
    "managed_resource_runners": "resources/runners.py",
    "managed_resource_workflows": "resources/calls.py",
    "attempt_active_intervals": "execution/active_time.py",
    "agent_processes": "execution/agents.py",
    "agent_turns": "execution/agents.py",
    "attempt_logs": "execution/attempt_logs.py",
    "workflow_settings": "execution/settings.py",
    "workflow_setting_changes": "execution/settings.py",
    "attempt_settings": "execution/settings.py",
    "workflow_messages": "execution/messages.py",
    "workflow_turns": "execution/turns.py",
    "session_segments": "execution/session_capture.py",
    "session_entries": "execution/session_capture.py",
    "attempt_entries": "execution/session_capture.py",
    "session_events": "execution/session_capture.py",
    "channels": "channels.py",
    "channel_cursors": "channels.py",
    "channel_messages": "channels.py",
}

#: The one deliberate exception: retention deletes a whole expired run tree by deleting its
#: ``resources`` rows, and the schema's ``ON DELETE CASCADE`` removes everything of the tree.
CASCADING_DELETES = {("resources", "retention.py")}

_WRITE = re.compile(r"\b(?:INSERT INTO|(?<!DO )UPDATE|DELETE FROM)\s+(\w+)")


def tables() -> set[str]:
    return set(re.findall(r"CREATE TABLE (\w+)", SCHEMA_SQL))


def writers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for module in sorted(STATE.rglob("*.py")):
        if module.is_relative_to(STATE / "schema"):
            continue
        name = str(module.relative_to(STATE))
        for table in _WRITE.findall(module.read_text(encoding="utf-8")):
            found.setdefault(table, set()).add(name)
    return found


def test_every_table_has_a_declared_owner() -> None:
    assert set(OWNERS) == tables()


def test_each_table_is_written_by_its_owner_only() -> None:
    for table, modules in writers().items():
        others = {m for m in modules - {OWNERS.get(table)} if (table, m) not in CASCADING_DELETES}
        assert not others, f"{table} is owned by {OWNERS.get(table)} but written by {others}"


def test_every_owner_writes_its_table() -> None:
    found = writers()
    for table, owner in OWNERS.items():
        assert owner in found.get(table, set()), f"{owner} no longer writes {table}"


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(module.relative_to(PACKAGE)): lines
        for module in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(module.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert not long, f"split these by job: {long}"
