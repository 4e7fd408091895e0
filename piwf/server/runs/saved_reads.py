"""A runner's reads of a saved run: ``read_run``, ``steps.read`` and the command that carries
the run.

A saved run grows with every step, so it is never read or sent whole::

    ready report ─▶ the run with its first steps + stepCount  (in the command, when it fits)
    read_run     ─▶ the run with its first steps + stepCount  (RunHead)
    steps.read   ─▶ the next steps, about STEP_PAGE_BYTES of outputs (StepsPage)

Each answer reads one bounded page in one read transaction. Steps are append-only (a finished
visit's row never changes), so the pages a runner reads after a head are exactly the steps that
head counted; a page of a run deleted meanwhile is refused, never made up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from piwf.canonical import JsonValue
from piwf.errors import PiwfError
from piwf.protocol import content
from piwf.protocol.runner_v1 import (
    STEP_PAGE_BYTES,
    STEPS_OPERATION,
    Command,
    RunHead,
    StepsPage,
    StepsRead,
)
from piwf.state import StateDatabase
from piwf.state import execution as ex
from piwf.workflow import port
from piwf.workflow.port_codec import from_json, to_json

#: The calls this module answers.
SAVED_RUN_OPERATIONS = ("read_run", STEPS_OPERATION)


@dataclass(frozen=True)
class ReadAnswer:
    """The answer to one read; ``violation`` names the protocol rule a refused call broke (the
    runner is then stopped and its run parks ``protocolRejected``)."""

    outcome: str
    result: JsonValue = None
    error: str | None = None
    violation: str | None = None


def answer_read(
    db: StateDatabase, operation: str, payload: dict[str, Any], readable: tuple[str | None, ...]
) -> ReadAnswer:
    """Answer ``read_run`` or ``steps.read`` of a run in ``readable`` (the runner's own run and
    the run its restart restarts); any other run is a protocol violation."""
    if operation == "read_run":
        try:
            wanted: str | None = from_json(port.RunRead, payload).run_id
        except PiwfError:
            wanted = None
        if wanted is None or wanted not in readable:
            return _not_this_run(operation)
        with db.read() as tx:
            head = ex.read_saved_run_head(tx, wanted, STEP_PAGE_BYTES)
        return ReadAnswer("accepted", None if head is None else run_head(head).to_json())
    try:
        asked = StepsRead.model_validate(payload)
    except ValidationError:
        return ReadAnswer(
            "rejected",
            error="protocolRejected: a bad steps.read",
            violation="steps.read is not {runId, start, stop} with start < stop",
        )
    if asked.run_id not in readable:
        return _not_this_run(operation)
    with db.read() as tx:
        steps = ex.read_saved_steps(tx, asked.run_id, asked.start, asked.stop, STEP_PAGE_BYTES)
    if not steps:
        return ReadAnswer(
            "rejected", error=f"run {asked.run_id} has no saved step {asked.start} any more"
        )
    return ReadAnswer("accepted", StepsPage(steps=[_object(step) for step in steps]).to_json())


def command_frame(command: dict[str, Any], revision: int, saved: ex.SavedRunHead | None) -> bytes:
    """The command frame, carrying ``saved`` (the run with its first steps and their count)
    unless that would take it past one inline frame (the child then reads it with
    ``read_run``)."""
    if saved is not None:
        head = run_head(saved)
        frame = Command(
            command=command, revision=revision, run=head.run, stepCount=head.step_count
        ).encode()
        if len(frame) <= content.INLINE_LIMIT:
            return frame
    return Command(command=command, revision=revision).encode()


def run_head(head: ex.SavedRunHead) -> RunHead:
    """The wire form of ``head``."""
    return RunHead(run=_object(head.saved), stepCount=head.step_count)


def _not_this_run(operation: str) -> ReadAnswer:
    return ReadAnswer(
        "rejected",
        error="protocolRejected: not this run",
        violation=f"{operation} names another run than the runner's own",
    )


def _object(value: object) -> dict[str, Any]:
    encoded = to_json(value)
    assert isinstance(encoded, dict)
    return encoded
