"""Output of the CLI: one JSON document, or short human lines and tables.

JSON output is canonical JSON (sorted keys, no whitespace) on one line, the wire form of the
receipts in :mod:`piwf.protocol.payloads`, so ``piwf ... --json | jq`` sees the protocol's
camelCase names, with every value complete. Human output is for reading only and may change: a
stored value (an output, an error, a prompt, an answer) shows at most :data:`PREVIEW_CHARS`
characters, and one the command left unread (longer than :data:`HUMAN_CONTENT_LIMIT`) shows
only its size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from piwf import canonical
from piwf.cli.common import emit_json as emit_json  # commands print JSON through render
from piwf.cli.safe_text import log_text as log_text  # and print stored text through it
from piwf.cli.safe_text import one_line as one_line
from piwf.cli.safe_text import printable as printable

if TYPE_CHECKING:
    from piwf.protocol.payloads import (
        ActiveTimeInfo,
        AnswerReceipt,
        ChoiceInputInfo,
        ContentRef,
        DecisionInfo,
        EffectInfo,
        NodeFailureInfo,
        OpenRequestInfo,
        ResolutionInfo,
        RunDetail,
        RunSource,
    )


class RunRow(Protocol):
    """What the run list shows of a run: a :class:`~piwf.protocol.payloads.RunInfo`, or the
    quick path's :class:`~piwf.cli.quick_list.ListedRun` read without the models."""

    @property
    def run_id(self) -> str: ...
    @property
    def workflow_name(self) -> str: ...
    @property
    def title(self) -> str | None: ...
    @property
    def display_status(self) -> str: ...
    @property
    def paused(self) -> bool: ...
    @property
    def needs_action(self) -> bool: ...
    @property
    def waiting_for_person(self) -> bool: ...
    @property
    def error_code(self) -> str | None: ...
    @property
    def created_at(self) -> int: ...


class RunRows(Protocol):
    """A page of the run list (a :class:`~piwf.protocol.payloads.RunPage`, or the quick
    path's): its runs and whether more exist (``next_cursor`` not None)."""

    @property
    def runs(self) -> Sequence[RunRow]: ...
    @property
    def next_cursor(self) -> object | None: ...


#: The most runs one run list shows (``run.list``'s largest ``limit``).
RUN_LIST_MOST = 500

#: Human output shows at most this many characters of one stored value.
PREVIEW_CHARS = 2000
#: Human output reads referenced values up to this many bytes (two parts) for their preview;
#: longer ones are not fetched at all, only their size is shown.
HUMAN_CONTENT_LIMIT = 1024 * 1024


def timestamp(ms: int | None, *, offset: bool = False) -> str:
    """Format epoch milliseconds as local ``YYYY-MM-DD HH:MM:SS`` ('-' for None); with
    ``offset``, followed by the local UTC offset (``+02:00``), for a time the user typed in
    another zone (a prune's cutoff: UTC unless it says otherwise)."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000).astimezone()
    shown = moment.strftime("%Y-%m-%d %H:%M:%S")
    if offset:
        zone = moment.strftime("%z")
        shown += f" {zone[:3]}:{zone[3:5]}"
    return shown


def value_preview(value: object, ref: ContentRef | None = None, *, text: bool = False) -> str:
    """A stored value for reading: its JSON (``text``: the string itself) cut to
    :data:`PREVIEW_CHARS` characters, or the size of a value that was left unread (``ref``).
    JSON escapes only the C0 controls; the others it leaves raw (a bidirectional override, a
    Unicode line separator, a C1 control such as CSI) show as their Python escapes, as all
    stored text does in the human form."""
    if ref is not None:
        return (
            f"<{ref.length:,} bytes of {ref.media_type}, not shown; "
            "--json prints the complete value>"
        )
    shown = (
        printable(value)
        if text and isinstance(value, str)
        else one_line(canonical.encode_text(value))
    )
    if len(shown) <= PREVIEW_CHARS:
        return shown
    return (
        f"{shown[:PREVIEW_CHARS]}… <{len(shown):,} characters in all; "
        "--json prints the complete value>"
    )


def fields(rows: Iterable[tuple[str, object]], indent: str = "  ") -> str:
    """Format ``label value`` lines with the values aligned; None values are left out."""
    present = [(label, value) for label, value in rows if value is not None]
    width = max((len(label) for label, _ in present), default=0)
    return "\n".join(f"{indent}{label.ljust(width)}  {value}" for label, value in present)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Format a plain left-aligned table with a header row."""
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def run_status(run: RunRow) -> str:
    """The run's display status (``paused`` for a paused unfinished run), marked when the
    pause flag is set under another status, when it is parked until someone acts (``queued``
    in the seed's closed set of statuses; the server says it needs action), or when a
    checkpoint or decision of it waits for a person's answer (``piwf answer``)."""
    if run.paused and run.display_status != "paused":
        return f"{run.display_status} (paused)"
    if run.waiting_for_person:
        return f"{run.display_status} (needs action: answer)"
    if run.needs_action and run.display_status == "queued":
        return (
            f"queued (needs action: {run.error_code})"
            if run.error_code
            else "queued (needs action)"
        )
    return run.display_status


def run_line(run: RunRow) -> str:
    """One line naming a run: id, status, workflow."""
    return f"{run.run_id}  {run_status(run)}  {run.workflow_name}"


def run_page(page: RunRows, same: Sequence[str] = ()) -> str:
    """The run list as a table, newest first. When more runs exist, the command that shows the
    next page ends it: ``piwf run list``, the options ``same`` (the page's own ``--limit`` and
    ``--status``), and ``--before`` the last run shown."""
    if not page.runs:
        return "no runs"
    rows = [
        [
            run.run_id,
            run_status(run),
            run.workflow_name,
            timestamp(run.created_at),
            one_line(run.title or ""),
        ]
        for run in page.runs
    ]
    text = table(["RUN ID", "STATUS", "WORKFLOW", "CREATED", "TITLE"], rows)
    if page.next_cursor is None:
        return text
    next_page = " ".join(["piwf run list", *same, "--before", one_line(page.runs[-1].run_id)])
    return text + f"\n(more runs exist; the next page: {next_page})"


def _needed_action(detail: RunDetail) -> str | None:
    """What someone must do before a parked run goes on, or None when it goes on by itself."""
    run = detail.run
    if not run.needs_action:
        return None
    resume = f"piwf run resume {run.run_id}"
    reason = detail.parked_reason
    if run.error_code == "effectAmbiguous" and not any(
        effect.status == "ambiguous" for effect in detail.effects
    ):
        # The stored reason says why it parked; what it waits for now is only the resume.
        why = f" ({reason})" if reason else ""
        return f"parked for an ambiguous effect{why}, which is resolved now; {resume}"
    if run.error_code == "effectAmbiguous":
        ambiguous = [effect.effect_id for effect in detail.effects if effect.status == "ambiguous"]
        if len(ambiguous) == 1:
            command = f"piwf effect resolve {ambiguous[0]} --applied|--retry"
            step = f"check whether it happened and settle it ({command}), then {resume}"
        else:
            command = "piwf effect resolve EFFECT_ID --applied|--retry"
            step = f"settle each ambiguous effect listed below ({command}), then {resume}"
    elif run.paused and run.error_code is None:
        stopped = stopped_effects_text(detail)
        step = f"it is paused: {resume}" + (f"; {stopped}" if stopped else "")
    elif reason and resume in reason:
        return reason  # a crash loop's reason already says to fix the cause and resume
    else:
        step = f"fix the cause, then {resume}"
    return f"{reason}; {step}" if reason else step


def shown_heading(name: str, shown: int, total: int | None) -> str:
    """``effects:``, or, when the server sent only some (the newest and every unsettled one),
    ``effects (50 of 12000 shown: the newest, and every one not settled):``."""
    if total is None or total <= shown:
        return f"{name}:"
    return f"{name} ({shown} of {total} shown: the newest, and every one not settled):"


def newest_heading(name: str, shown: int, total: int | None) -> str:
    """``decisions:``, or ``decisions (the newest 50 of 2600):`` when only some came."""
    if total is None or total <= shown:
        return f"{name}:"
    return f"{name} (the newest {shown} of {total}):"


def stopped_effects_text(detail: RunDetail) -> str | None:
    """What the resume of a paused run does to the manual effects its pause stopped while they
    applied (None for none): each becomes ambiguous and parks the run until it is settled."""
    if not detail.run.paused or detail.run.finished_at is not None:
        return None
    manual = [
        effect
        for effect in detail.effects
        if effect.status == "applying" and effect.recovery == "manual"
    ]
    if not manual:
        return None
    named = ", ".join(f"{effect.effect_id} ({effect.effect_type})" for effect in manual)
    effect_id = manual[0].effect_id if len(manual) == 1 else "EFFECT_ID"
    return (
        f"the pause stopped manual effect {named} while it applied: after the resume the run "
        "parks with it ambiguous, for you to check whether it happened and settle it "
        f"(piwf effect resolve {effect_id} --applied|--retry)"
    )


def _effect_status(effect: EffectInfo, paused: bool) -> str:
    """An effect's stored status; an ``applying`` one of a paused run says that nothing
    applies it now (the pause stopped the run's child)."""
    if paused and effect.status == "applying":
        return "applying (stopped by the pause)"
    return effect.status


def source_table(sources: list[RunSource]) -> str:
    """Each recorded mount (``(root)`` first): how it named its workflow, the file it found."""
    rows = [
        [
            source.mount_path or "(root)",
            f"{source.reference_kind} {source.reference}",
            source.source_ref
            + (f" (piwf {source.piwf_version})" if source.piwf_version is not None else ""),
        ]
        for source in sources
    ]
    text = table(["MOUNT", "REFERENCE", "SOURCE"], rows)
    return "\n".join("  " + line for line in text.split("\n"))


def run_detail(detail: RunDetail) -> str:
    """One run with its fields and recorded sources."""
    run = detail.run
    queue = f" (queue: {run.queue_status})" if run.queue_status else ""
    lines = [
        f"{run.run_id}  {run_status(run)}",
        fields(
            [
                ("workflow", f"{run.workflow_name} ({run.workflow_ref})"),
                ("title", None if run.title is None else one_line(run.title)),
                ("session", None if detail.session is None else f"{detail.session} (interactive)"),
                ("status", f"{run.status}{queue}"),
                ("detail", run.status_detail),
                ("error", run.error_code),
                ("action", _needed_action(detail)),
                ("revision", run.revision),
                ("created", timestamp(run.created_at)),
                ("updated", timestamp(run.updated_at)),
                ("finished", timestamp(run.finished_at) if run.finished_at else None),
                ("parent", run.parent_run_id and f"{run.parent_run_id} ({run.lineage})"),
                ("root", run.root_run_id if run.root_run_id != run.run_id else None),
                ("restart", run.restart_number or None),
                ("definition", run.definition_digest),
                ("settings", _settings_line(detail)),
            ]
        ),
    ]
    if detail.sources:
        lines.append("sources:")
        lines.append(source_table(detail.sources))
    if detail.effects:
        lines.append(shown_heading("effects", len(detail.effects), detail.effect_count))
        rows = [
            [
                effect.effect_id,
                effect.effect_type,
                effect.recovery,
                _effect_status(effect, run.paused and run.finished_at is None),
                str(effect.attempt_count),
            ]
            for effect in detail.effects
        ]
        header = ["EFFECT", "TYPE", "RECOVERY", "STATUS", "ATTEMPTS"]
        lines.append("\n".join("  " + line for line in table(header, rows).split("\n")))
    if detail.waiting_on is not None:
        lines.append("waiting on:")
        lines.append(request_fields(detail.waiting_on))
    agent = detail.agent_process
    if agent is not None:
        lines.append(f"agent command: pid {agent.pid}, turn {agent.turn} of {agent.request_id}")
    if detail.decisions:
        lines.append(newest_heading("decisions", len(detail.decisions), detail.decision_count))
        lines.extend(decision_audit(decision) for decision in detail.decisions)
    if detail.agent_requests:
        from piwf.cli.render_agents import agent_request_audit  # it builds on this module

        shown, total = len(detail.agent_requests), detail.agent_request_count
        lines.append(newest_heading("agent requests", shown, total))
        lines.extend(agent_request_audit(request) for request in detail.agent_requests)
    if detail.failure is not None:
        lines.append(failure_text(detail.failure))
    if detail.error is not None or detail.error_ref is not None:
        preview = value_preview(detail.error, detail.error_ref, text=True)
        lines.append("error:\n" + _block(preview.split("\n"), "  "))
    if detail.output is not None or detail.output_ref is not None:
        lines.append(f"output:\n  {value_preview(detail.output, detail.output_ref)}")
    return "\n".join(lines)


def _settings_line(detail: RunDetail) -> str | None:
    """Where the run's live settings stand (``piwf run settings`` shows them)."""
    if not detail.settings:
        return None
    parts = [
        f"{scope.mount_path or 'run'}: change {scope.change_number}" for scope in detail.settings
    ]
    shown, total = len(detail.settings), detail.settings_count
    newest = "" if total is None or total <= shown else f"the newest {shown} of {total}; "
    return f"{', '.join(parts)} ({newest}piwf run settings {detail.run.run_id})"


def failure_text(failure: NodeFailureInfo) -> str:
    """The failure record of the node that ended a run: node, how it ended, the error's type
    and message, and its traceback or the end of its stderr (each already bounded)."""
    node = failure.path
    if failure.visit > 1 or failure.attempt > 1:
        node += f" (visit {failure.visit}, attempt {failure.attempt})"
    message = printable(failure.message) + (" [message cut]" if failure.message_cut else "")
    first, *more = message.split("\n")
    rows: list[tuple[str, object]] = [
        ("node", node),
        ("ended", failure.outcome.replace("_", " ")),
        ("type", failure.error_type),
        ("exit code", failure.exit_code),
        ("signal", failure.signal),
        ("message", first),
    ]
    lines = ["failure:", fields(rows)]
    if more:
        lines.append(_block(more))
    if failure.traceback:
        cut = ", older frames cut" if failure.traceback_cut else ""
        lines.append(f"  traceback (most recent call last{cut}):")
        lines.append(_block(failure.traceback.rstrip("\n").split("\n"), "  "))
        ending = f"{failure.error_type}: {first}" if failure.message else failure.error_type
        lines.append(f"    {ending}")
    if failure.stderr_tail:
        cut = ", earlier output cut" if failure.stderr_cut else ""
        lines.append(f"  stderr (its last lines{cut}):")
        lines.append(_block(failure.stderr_tail.split("\n")))
    return "\n".join(lines)


def _block(lines: Sequence[str], indent: str = "    ") -> str:
    """``lines`` indented under their section, each escaped as :func:`one_line` does."""
    return "\n".join(indent + one_line(line) for line in lines)


def choices_text(
    choices: dict[str, str] | None, inputs: dict[str, ChoiceInputInfo] | None = None
) -> str:
    """Declared choices as ``name (label), ...``; '-' for a checkpoint (any JSON answer).

    A choice that carries a text input shows the key its text goes under and its prompt:
    ``replan (Replan; +"instructions": What should change?)``.
    """
    if not choices:
        return "-"
    needs = inputs or {}
    return ", ".join(
        one_line(
            f"{name} ({label}; +{canonical.encode_text(needs[name].name)}: {needs[name].prompt})"
        )
        if name in needs
        else one_line(f"{name} ({label})")
        for name, label in choices.items()
    )


def request_fields(request: OpenRequestInfo) -> str:
    """One pending request: id, kind, node, choices, deadline (an agent request: its prompt,
    expected output and how to submit)."""
    if request.kind == "agent":
        from piwf.cli.render_agents import agent_request_fields  # it builds on this module

        return agent_request_fields(request)
    return fields(
        [
            ("request", request.request_id),
            ("kind", request.kind),
            ("run", request.run_id),
            ("paused", paused_run_text(request)),
            ("node", f"{request.path} (visit {request.visit})"),
            ("choices", choices_text(request.choices, request.inputs) if request.choices else None),
            ("answer", _answer_shape(request)),
            ("content", value_preview(_asked(request), request.content_ref)),
            ("deadline", _deadline(request.deadline_at, request.has_default)),
            ("active time", active_time_text(request.active_time)),
        ]
    )


def paused_run_text(request: OpenRequestInfo) -> str | None:
    """What a request of a paused run needs first (None when its run is not paused): the
    resume, since every answer or submission is refused until then."""
    if not request.run_paused:
        return None
    return f"its run is paused and takes no answer until resumed: piwf run resume {request.run_id}"


def _asked(request: OpenRequestInfo) -> object:
    """A request's content without what the lines above it show already: a decision's content
    repeats its declared choices and their inputs (``--json`` keeps them)."""
    content = request.content
    if request.choices and isinstance(content, dict):
        return {key: value for key, value in content.items() if key not in ("choices", "inputs")}
    return content


def _answer_shape(request: OpenRequestInfo) -> str | None:
    """How to answer a decision whose choices carry inputs, one example per such choice."""
    if not request.inputs:
        return None
    return "; ".join(
        f"piwf answer {request.request_id} '"
        + canonical.encode_text({"choice": name, item.name: "..."})
        + f"' (at most {item.max_chars} characters)"
        for name, item in request.inputs.items()
    )


def request_table(requests: Sequence[OpenRequestInfo]) -> str:
    """The pending requests as a table, oldest first."""
    if not requests:
        return "no pending requests"
    rows = [
        [
            item.request_id,
            item.kind,
            item.run_id + (" (paused)" if item.run_paused else ""),
            item.path,
            choices_text(item.choices, item.inputs),
            _deadline(item.deadline_at, item.has_default)
            or _time_left(item.active_time)
            or _budget(item)
            or "-",
        ]
        for item in requests
    ]
    return table(["REQUEST ID", "KIND", "RUN ID", "NODE", "CHOICES", "DEADLINE"], rows)


def resolution_line(resolution: ResolutionInfo) -> str:
    """The winner of a decision in one line: outcome, provenance, response or reason, when."""
    what = (
        value_preview(resolution.response, resolution.response_ref)
        if resolution.outcome == "accepted"
        else resolution.reason
    )
    return (
        f"{resolution.outcome} by {resolution.provenance} ({resolution.actor_type}) at "
        f"{timestamp(resolution.resolved_at)}: {what}"
    )


def decision_audit(decision: DecisionInfo) -> str:
    """One decision's audit: the winner and how many candidates were submitted."""
    winner = "pending" if decision.resolution is None else resolution_line(decision.resolution)
    outcomes = ", ".join(s.outcome for s in decision.submissions) or "none"
    shown, total = len(decision.submissions), decision.submission_count
    if total > shown:
        outcomes = f"the newest {shown} of {total}: {outcomes}"
    return fields(
        [
            ("decision", f"{decision.decision_id} ({decision.kind})"),
            ("resolution", winner),
            ("submissions", outcomes),
        ]
    )


def answer_receipt(receipt: AnswerReceipt) -> str:
    """What an answer did, with the recorded winner."""
    head = {
        "won": "answered",
        "adopted": "already answered the same way",
        "already_resolved": "already resolved",
    }[receipt.outcome]
    return f"{receipt.request_id}: {head}; {resolution_line(receipt.resolution)}"


def _budget(request: OpenRequestInfo) -> str | None:
    """An agent request's deadline: its budget of active time."""
    if request.kind != "agent":
        return None
    from piwf.cli.render_agents import active_budget  # it builds on this module

    return active_budget(request.timeout_ms)


def active_time_text(active: ActiveTimeInfo | None) -> str | None:
    """An agent request's deadline: ``"1.2 s of 15 min used, 14 min 58 s left (counting)"``."""
    if active is None:
        return None
    state = "counting: its agent is working" if active.counting else "not counting"
    return (
        f"{duration(active.active_ms)} of {duration(active.timeout_ms)} used, "
        f"{duration(active.remaining_ms)} left ({state})"
    )


def duration(ms: int) -> str:
    """A duration for people: ``"850 ms"``, ``"1.2 s"``, ``"14 min 58 s"``, ``"2 h 5 min"``."""
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(ms // 1000, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def _time_left(active: ActiveTimeInfo | None) -> str | None:
    if active is None:
        return None
    return f"{duration(active.remaining_ms)} active time left"


def _deadline(deadline_at: int | None, has_default: bool) -> str | None:
    if deadline_at is None:
        return None
    then = "default answer" if has_default else "cancel (no default)"
    return f"{timestamp(deadline_at)}, then {then}"
