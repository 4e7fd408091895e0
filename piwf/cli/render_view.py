"""Human output of the live run view: what a run is doing now, its steps, why it is stuck.

Everything here reads one :class:`~piwf.protocol.view_payloads.RunView` (``run show``, ``run
steps``, ``run explain``) and shows its ``display`` as the server derived it: status, activity,
current node or request, reason and controls are never worked out here from other fields.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from piwf.cli.render import (
    duration,
    fields,
    one_line,
    stopped_effects_text,
    table,
    timestamp,
    value_preview,
)
from piwf.protocol.payloads import NodeFailureInfo
from piwf.protocol.view_payloads import MAX_QUEUED_AHEAD, Capacity, Display, RunView, Step

#: ``run show`` lists at most this many steps (``run steps`` lists them all).
SHOWN_STEPS = 20
#: A step's result column shows at most this many characters.
RESULT_CHARS = 60
#: How much of a failed try's error the line about its retry shows.
FAILURE_CHARS = 200


@dataclass(frozen=True)
class Explanation:
    """Why a run is where it is, and the commands that move it on (first: the usual one)."""

    cause: str
    text: str
    commands: tuple[str, ...]

    def to_json(self, view: RunView) -> dict[str, object]:
        """The ``run explain --json`` document."""
        return {
            "runId": view.detail.run.run_id,
            "revision": view.revision,
            "status": view.display.status,
            "activity": view.display.activity,
            "cause": self.cause,
            "explanation": self.text,
            "commands": list(self.commands),
        }


def now_lines(view: RunView) -> str:
    """The ``now`` and ``next`` lines of ``run show``."""
    display = view.display
    explanation = explain(view)
    finished = view.detail.run.finished_at
    now = f"{display.status}, finished {timestamp(finished)}" if finished else None
    return fields(
        [
            ("now", now or activity_text(display)),
            ("next", "; ".join(explanation.commands) if explanation.commands else None),
            ("controls", ", ".join(display.controls) or None),
        ]
    )


def steps_text(steps: Sequence[Step], total: int, run_id: str, *, all_shown: bool) -> str:
    """The steps as a table; says how to see the rest when some are left out."""
    if not steps:
        return "steps: none finished yet"
    rows = [[str(step.index + 1), *step_cells(step)] for step in steps]
    header = ["#", "NODE", "VISIT", "OUTCOME", "STARTED", "TOOK", "RESULT"]
    text = f"steps ({len(steps)} of {total}):\n" + "\n".join(
        "  " + line for line in table(header, rows).split("\n")
    )
    if not all_shown and total > len(steps):
        text += f"\n  ({total - len(steps)} more: piwf run steps {run_id})"
    return text


def step_cells(step: Step) -> list[str]:
    """A step's NODE, VISIT, OUTCOME, STARTED, TOOK and RESULT cells (``run steps``,
    ``piwf view``)."""
    return [
        step.path,
        str(step.visit) + (f".{step.attempt}" if step.attempt > 1 else ""),
        step.outcome
        + (f" ({step.earlier_tries_total + 1} tries)" if step.earlier_tries_total else ""),
        timestamp(step.started_at)[11:] if step.started_at else "-",
        duration(step.duration_ms) if step.duration_ms is not None else "-",
        _result(step),
    ]


def explain(view: RunView) -> Explanation:
    """Why the run is not progressing (or that it is), from its display alone."""
    display = view.display
    run_id = view.detail.run.run_id
    resume = f"piwf run resume {run_id}"
    if view.detail.run.error_code == "inputRejected":
        return _input_rejected(view)
    if display.status in ("completed", "failed", "timed_out", "cancelled"):
        return _terminal(view)
    if display.effects_to_resolve:
        effect = display.effects_to_resolve[0]
        return Explanation(
            "effectAmbiguous",
            f"effect {effect.effect_id} ({effect.effect_type}) may or may not have been applied "
            "(its attempt was interrupted); piwf never repeats it blindly. Check the outside "
            "system, settle the effect, then resume the run.",
            (effect.command, resume),
        )
    if display.status == "paused":
        stopped = stopped_effects_text(view.detail)
        text = "the run is paused; it goes on when resumed"
        text += f". But {stopped}." if stopped else "."
        return Explanation("paused", text, (resume,))
    if display.waiting_on is not None:
        waiting = display.waiting_on
        who = {
            "agentCommand": "its agent command is working on",
            "waitingForAgent": "waiting for an agent's output for",
        }.get(display.activity, "waiting for a person to answer")
        where = f'node "{waiting.path}" (visit {waiting.visit})'
        return Explanation(
            "waiting",
            f"{who} request {waiting.request_id} ({waiting.kind}) at {where}.",
            (waiting.command,) if display.activity != "agentCommand" else (),
        )
    node = display.current_node
    if display.activity == "executing" and node is not None:
        return Explanation(
            "running",
            f'node "{node.path}" (visit {node.visit}, attempt {node.attempt}) is running'
            + (f" since {timestamp(node.started_at)}" if node.started_at else "")
            + "; nothing is blocking it.",
            (),
        )
    if display.activity == "blocked":
        return _parked(display, run_id, view.detail.run.workflow_ref)
    if display.activity == "waitingForSlot" and display.capacity is not None:
        capacity = display.capacity
        return Explanation(
            "capacityFull",
            f"{_slots_taken(capacity)}. For more slots, start the server again with more (its "
            "running nodes stop and run again, as their next attempt).",
            # A command that runs as printed: no placeholder, no comment for the shell to parse.
            (f"piwf server stop && piwf server start --max-workers {capacity.max_workers + 1}",),
        )
    if display.activity == "sleeping" and display.current_node is not None:
        node = display.current_node
        what = (
            f'node "{node.path}" is a timer'
            if node.node_type == "timer"
            else f'try {node.failed_tries} of node "{node.path}" failed'
            + _failure_text(node.last_failure)
            + ", and its retry policy tries again"
        )
        return Explanation(
            "sleeping",
            f"{what}: the run sleeps until {timestamp(display.available_at)} and then resumes "
            "by itself (no runner or slot is held meanwhile).",
            (),
        )
    if display.activity == "scheduled":
        return Explanation(
            "scheduled",
            f"the run waits until {timestamp(display.available_at)} before it is tried again "
            "(a back-off after its runner ended without progress).",
            (),
        )
    return Explanation(
        "starting", "the run is admitted and starts at the next scheduling turn.", ()
    )


def _terminal(view: RunView) -> Explanation:
    run = view.detail.run
    if run.status == "completed":
        return Explanation("completed", "the run completed; nothing is left to do.", ())
    failure = view.detail.failure
    if failure is not None:
        what = f"{failure.error_type}: {failure.message}" if failure.error_type else failure.message
        text = f'the run ended {run.status} at node "{failure.path}": {what}'
    else:
        error = (view.detail.error or run.error_code or "").split("\n", 1)[0]
        text = f"the run ended {run.status}" + (f": {error}" if error else "")
    if failure is not None or view.detail.error or run.error_code:
        text += f" (the whole record: piwf run show {run.run_id})."
    else:  # cancelled by `piwf run cancel`: there is no record to point at
        text += "."
    unsettled = view.display.effects_to_resolve
    if unsettled:
        # A restart is refused until every effect is settled: the resolve comes first.
        named = ", ".join(f"{effect.effect_id} ({effect.effect_type})" for effect in unsettled)
        text += (
            f" Effect {named} may or may not have been applied; check the outside system and "
            "settle it (--applied if it happened, else --retry), then restart to run it again."
        )
        return Explanation(run.status, text, tuple(effect.command for effect in unsettled))
    restarted = view.display.restarted_as
    if restarted is not None:
        # A run restarts once: a second restart only answers with this same run.
        text += f" It was restarted as {restarted}."
        return Explanation(run.status, text, (f"piwf run show {restarted}",))
    text += " Restart to run it again."
    return Explanation(run.status, text, (f"piwf run restart {run.run_id}",))


#: How much of the workflow's refusal of an input ``run explain`` quotes.
INPUT_REFUSAL_CHARS = 1000


def _input_rejected(view: RunView) -> Explanation:
    """A run whose workflow refused its input: what was refused, and that only a new run with
    a corrected input goes on (a restart would give the workflow the same input; the server
    refuses it)."""
    run = view.detail.run
    refusal = input_refusal_text(view.detail.error) or "the workflow refused the run's input"
    reference = shlex.quote(run.workflow_ref)
    text = (
        f"the run ended {run.status} before its first step: {refusal} (the whole record: piwf"
        f" run show {run.run_id}). A restart would give the workflow the same input: start a"
        " new run with a corrected input (the input it accepts: piwf workflows show"
        f" {reference})."
    )
    return Explanation("inputRejected", text, (f"piwf run start {reference} --input JSON",))


def input_refusal_text(error: str | None) -> str:
    """The workflow's refusal of an input on one line: its first line, then each problem as
    ``location: rule`` (pydantic's layout puts a location on a line and its rule, indented,
    under it), at most :data:`INPUT_REFUSAL_CHARS` characters."""
    if not error:
        return ""
    head, *rest = error.split("\n")
    problems: list[str] = []
    location = ""
    for line in rest:
        if line.startswith("  "):
            rule = line.strip()
            problems.append(f"{location}: {rule}" if location else rule)
            location = ""
        elif line.strip():
            if location:
                problems.append(location)
            location = line.strip()
    if location:
        problems.append(location)
    text = "; ".join([head.rstrip(), *problems]) if problems else head.rstrip()
    if len(text) > INPUT_REFUSAL_CHARS:
        text = text[: INPUT_REFUSAL_CHARS - 1] + "…"
    return text


_PARKED: dict[str, str] = {
    "sourceChanged": (
        "a recorded source file is not what the run started with ({reason}); the changed code "
        "never runs. Restore the file, then resume; or cancel the run and start a new one of "
        "the current sources, giving it the input you gave this one (--input; a restart "
        "would run the recorded sources too)."
    ),
    "protocolRejected": (
        "its runner broke the runner protocol ({reason}) and was stopped; resume to try again."
    ),
    "runnerNoProgress": (
        "it made no progress and is not retried by itself: {reason}. Fix the cause (a node "
        "that ends its process, by sys.exit or a signal, or overruns its deadline; piwf run "
        "logs shows what it printed), then resume."
    ),
    # Its reason gives the count and says to fix the cause and resume.
    "runnerCrashed": "its runner crashed repeatedly: {reason}.",
    # Reached only once no effect is ambiguous any more (the resolve comes first above).
    "effectAmbiguous": (
        "it parked for an effect that may or may not have been applied, and {reason}."
    ),
}


def _parked(display: Display, run_id: str, workflow_ref: str) -> Explanation:
    code = display.reason_code or "parked"
    reason = display.reason or code
    text = _PARKED.get(code, "the run is parked ({reason}); fix the cause, then resume.")
    commands: tuple[str, ...] = (f"piwf run resume {run_id}",)
    if code == "sourceChanged":
        commands += (f"piwf run cancel {run_id}", f"piwf run start {shlex.quote(workflow_ref)}")
    return Explanation(code, text.format(reason=reason), commands)


_ACTIVITY_TEXT = {
    "executing": "running",
    "agentCommand": "its agent command is working",
    "waitingForPerson": "waiting for a person",
    "waitingForAgent": "waiting for an agent's output",
    "waitingForSlot": "waiting for a free execution slot",
    "scheduled": "waiting to be tried again",
    "sleeping": "sleeping",
    "blocked": "blocked",
    "idle": "about to start",
}


def _slots_taken(capacity: Capacity) -> str:
    """Why a runnable run has no slot yet: who holds the slots, how many runs go first."""
    held = f"held by {', '.join(capacity.holders)}" if capacity.holders else "none held"
    slots = f"{capacity.busy} of {capacity.max_workers} execution slots busy ({held})"
    ahead = capacity.queued_ahead
    if not ahead:
        return f"every execution slot is busy ({slots}); the run starts when one of them ends"
    count = f"{ahead}+" if ahead >= MAX_QUEUED_AHEAD else str(ahead)
    runs = "run is" if ahead == 1 else "runs are"
    return f"{count} {runs} queued ahead of this one and start first; {slots}"


def activity_text(display: Display) -> str:
    """What the run does now, as ``run show``'s ``now`` line says it."""
    text = _ACTIVITY_TEXT.get(display.activity, display.activity)
    node = display.current_node
    if display.activity == "executing" and node is not None:
        return f'{text} node "{node.path}" (visit {node.visit}, attempt {node.attempt})'
    waiting = display.waiting_on
    if waiting is not None:
        return f'{text} at node "{waiting.path}" (request {waiting.request_id})'
    if display.activity == "blocked":
        return f"{text}: {display.reason or display.reason_code or display.status}"
    if display.activity == "sleeping" and node is not None and display.available_at:
        if node.node_type != "timer" and node.failed_tries:
            return (
                f'waiting to retry node "{node.path}" (visit {node.visit}, try '
                f"{node.failed_tries + 1}) until {timestamp(display.available_at)}; try "
                f"{node.failed_tries} failed" + _failure_text(node.last_failure)
            )
        return f'{text} at node "{node.path}" until {timestamp(display.available_at)}'
    if display.activity == "scheduled" and display.available_at is not None:
        return f"{text} at {timestamp(display.available_at)}"
    return text


def _failure_text(failure: NodeFailureInfo | None) -> str:
    """``: ErrorType: message`` on one line, cut to :data:`FAILURE_CHARS`; empty without one."""
    if failure is None:
        return ""
    text = f"{failure.error_type}: {failure.message}" if failure.error_type else failure.message
    text = one_line(" ".join(text.split()))
    return ": " + (text if len(text) <= FAILURE_CHARS else text[: FAILURE_CHARS - 1] + "…")


def _result(step: Step) -> str:
    if step.failure is not None and step.failure.error_type:
        text = f"{step.failure.error_type}: {step.failure.message}"
    elif step.error is not None or step.error_ref is not None:
        text = value_preview(step.error, step.error_ref, text=True)
    else:
        text = value_preview(step.output, step.output_ref)
    text = one_line(" ".join(text.split()))
    return text if len(text) <= RESULT_CHARS else text[: RESULT_CHARS - 1] + "…"
