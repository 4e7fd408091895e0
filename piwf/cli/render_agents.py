"""How the CLI shows agent requests: the prompt's first lines, the expected output, the budget,
the latest rejection, and each submission with its outcome (``requests``, ``run show``,
``submit``)."""

from __future__ import annotations

from collections.abc import Sequence

from piwf.cli.render import (
    active_time_text,
    fields,
    one_line,
    paused_run_text,
    printable,
    timestamp,
    value_preview,
)
from piwf.protocol.agent_payloads import SubmissionReceipt
from piwf.protocol.payloads import AgentRequestInfo, AgentSubmissionInfo, OpenRequestInfo

#: How many lines of an agent's prompt the human forms show.
PROMPT_LINES = 3


def active_budget(timeout_ms: int | None) -> str:
    """An agent step's deadline as a budget of active time (``15m active``, ``none``)."""
    if timeout_ms is None:
        return "none"
    seconds = timeout_ms / 1000
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m active"
    return f"{seconds:g}s active"


def prompt_head(request: OpenRequestInfo) -> str | None:
    """The first lines of an agent request's prompt (None when its content was not read)."""
    content = request.content
    if not isinstance(content, dict) or not isinstance(content.get("prompt"), str):
        return None
    lines = [one_line(line) for line in str(content["prompt"]).splitlines() if line.strip()]
    head = "\n    ".join(lines[:PROMPT_LINES])
    more = len(lines) - PROMPT_LINES
    return head + (
        f"\n    … ({more} more lines; piwf requests --json has it all)" if more > 0 else ""
    )


def expected_output(request: OpenRequestInfo) -> str | None:
    """What the agent step asks for (its ``expected_output``)."""
    content = request.content
    if isinstance(content, dict) and isinstance(content.get("expectedOutput"), str):
        return printable(str(content["expectedOutput"]))
    return None


def agent_request_fields(request: OpenRequestInfo) -> str:
    """One pending agent request in full: how to submit, what to submit, what went wrong."""
    rejection = None
    if request.latest_rejection is not None or request.latest_rejection_ref is not None:
        shown = value_preview(request.latest_rejection, request.latest_rejection_ref, text=True)
        rejection = _indented(shown, "    ")
    return fields(
        [
            ("request", request.request_id),
            ("run", request.run_id),
            ("paused", paused_run_text(request)),
            ("node", f"{request.path} (visit {request.visit})"),
            ("prompt", prompt_head(request)),
            ("expected", expected_output(request)),
            # Where the active time stands, when the server says; else the budget alone.
            (
                "deadline",
                active_time_text(request.active_time) or active_budget(request.timeout_ms),
            ),
            ("submissions", request.submissions),
            ("rejected", rejection),
            _how_to_submit(request),
        ]
    )


def _how_to_submit(request: OpenRequestInfo) -> tuple[str, str]:
    """The command that fulfils an agent request: ``piwf submit`` for a headless run; the
    session's host for an interactive one (only its coordinator may submit)."""
    if request.session is not None:
        return ("submit", f"through its session: piwf session attach {request.session}")
    return ("submit", f"piwf submit {request.request_id} '<json>'")


def agent_requests_text(requests: Sequence[OpenRequestInfo]) -> str | None:
    """The pending agent requests, one block each (None when there are none)."""
    agents = [item for item in requests if item.kind == "agent"]
    if not agents:
        return None
    return "agent requests:\n" + "\n".join(agent_request_fields(item) for item in agents)


def submission_line(submission: AgentSubmissionInfo) -> str:
    """One submission: when, its outcome, and the accepted value or the error."""
    when = timestamp(submission.settled_at or submission.submitted_at)
    if submission.outcome == "accepted":
        what = value_preview(submission.value, submission.value_ref)
    elif submission.outcome == "rejected":
        what = value_preview(submission.error, submission.error_ref, text=True)
    else:
        what = "being validated"
    return f"{submission.outcome} at {when}: {what}"


def agent_request_audit(request: AgentRequestInfo) -> str:
    """One agent request of a run and every submission made for it."""
    lines = [
        fields(
            [
                ("request", f"{request.request_id} ({request.status})"),
                ("node", f"{request.path} (visit {request.visit})"),
            ]
        )
    ]
    shown, total = len(request.submissions), request.submission_count
    first = 1
    if total > shown:  # the server sent the newest: number them as they were made
        lines.append(f"    (the newest {shown} of {total} submissions)")
        first = total - shown + 1
    lines.extend(
        f"    {number}. {_indented(submission_line(s), '       ')}"
        for number, s in enumerate(request.submissions, first)
    )
    return "\n".join(lines)


def _indented(text: str, indent: str) -> str:
    """``text`` with each line after the first indented: a validate error of several lines
    stays under its field, so none of its lines can pass for a field or a submission."""
    return text.replace("\n", "\n" + indent)


def submission_receipt(receipt: SubmissionReceipt) -> str:
    """What an accepted submission did."""
    return (
        f"{receipt.request_id}: {receipt.outcome}; the step's output is "
        f"{value_preview(receipt.value, receipt.value_ref)}"
    )
