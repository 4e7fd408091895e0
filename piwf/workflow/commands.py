"""The tagged run command a runner executes: ``start``, ``resume``, ``continue`` or ``restart``.

The runner receives exactly one command and never infers it from nullable fields:

- ``start`` begins a queued root run at its first node;
- ``resume`` carries on the same interrupted run from its saved state (a crash retry of the
  unfinished visit keeps its visit number; an answered request is consumed);
- ``continue`` completes the exact answered request the run is waiting on;
- ``restart`` begins a queued restart run at the first node with nothing carried from its
  terminal parent except the definition and the input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from piwf.canonical import JsonValue
from piwf.errors import RunCommandError
from piwf.lifecycle import CommandKind


@dataclass(frozen=True)
class StartCommand:
    """Begin the queued root run ``run_id``."""

    kind: ClassVar[CommandKind] = CommandKind.START
    run_id: str


@dataclass(frozen=True)
class ResumeCommand:
    """Carry on the interrupted, parked or answered run ``run_id`` from its saved state."""

    kind: ClassVar[CommandKind] = CommandKind.RESUME
    run_id: str


@dataclass(frozen=True)
class ContinueCommand:
    """Complete the answered request ``request_id`` that the run is waiting on."""

    kind: ClassVar[CommandKind] = CommandKind.CONTINUE
    run_id: str
    request_id: str


@dataclass(frozen=True)
class RestartCommand:
    """Begin the queued restart run ``run_id`` of the terminal run ``parent_run_id``."""

    kind: ClassVar[CommandKind] = CommandKind.RESTART
    run_id: str
    parent_run_id: str


RunCommand: TypeAlias = StartCommand | ResumeCommand | ContinueCommand | RestartCommand


def command_to_json(command: RunCommand) -> dict[str, JsonValue]:
    """Return the wire form ``{"command": kind, "runId": ..., ...}``."""
    match command:
        case StartCommand(run_id=run_id) | ResumeCommand(run_id=run_id):
            return {"command": command.kind.value, "runId": run_id}
        case ContinueCommand(run_id=run_id, request_id=request_id):
            return {"command": command.kind.value, "runId": run_id, "requestId": request_id}
        case RestartCommand(run_id=run_id, parent_run_id=parent):
            return {"command": command.kind.value, "runId": run_id, "parentRunId": parent}


def command_from_json(value: JsonValue) -> RunCommand:
    """Parse the wire form; raises :class:`RunCommandError` for anything else."""
    if not isinstance(value, Mapping):
        raise RunCommandError("a run command must be a JSON object")
    fields = {
        "start": {"command", "runId"},
        "resume": {"command", "runId"},
        "continue": {"command", "runId", "requestId"},
        "restart": {"command", "runId", "parentRunId"},
    }
    kind = value.get("command")
    if not isinstance(kind, str) or kind not in fields:
        raise RunCommandError(f"unknown run command {kind!r}")
    if set(value) != fields[kind]:
        raise RunCommandError(f"{kind} command needs exactly {sorted(fields[kind])}")
    texts = {key: item for key, item in value.items() if key != "command"}
    for key, item in texts.items():
        if not isinstance(item, str) or not item:
            raise RunCommandError(f"{kind} command: {key} must be a non-empty string")
    run_id = str(value["runId"])
    if kind == "start":
        return StartCommand(run_id)
    if kind == "resume":
        return ResumeCommand(run_id)
    if kind == "continue":
        return ContinueCommand(run_id, str(value["requestId"]))
    return RestartCommand(run_id, str(value["parentRunId"]))
