"""Built-in ``sanity-check``: run a list of checks; if any fail, an agent summarises them.

    input   {"checks": [{"name": str, "argv": [str, ...], "cwd"?: str, "timeout_ms"?: int}]}
    output  {"passed": [name, ...],
             "failed": [{"name", "argv", "exit_code", "signal", "error", "duration_ms",
                         "stdout_tail", "stderr_tail", "summary"}, ...],
             "summary": str | None, "summary_error": str | None}

Each check is one ``shell`` visit: ``argv`` runs as it is, never through a shell, in ``cwd``
(relative to the run's project directory), for at most ``timeout_ms`` (default 10 minutes). A
check passes when its command started and exited 0 in time; anything else (a non-zero exit, a
signal, a command that cannot start, the deadline) is recorded as a failure and the next check
runs::

    next ─┬─ a check is left ──────▶ run_check ─(ok | failed | timed_out)─▶ next
          ├─ all ran, some failed ─▶ summarise ─(ok | failed | timed_out)─▶ report
          └─ all ran, all passed ──────────────────────────────────────────▶ report

``summarise`` is an agent step; it runs only when a check failed, and submits ``{"summary":
str, "checks"?: {failed check name: str}}`` (those texts become each failure's ``summary``).
When the agent step itself fails, ``summary`` is None and ``summary_error`` says why; the check
results are kept either way. The checks are declared re-runnable (``idempotent_effect``): a
check interrupted by a crash runs again.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from piwf.workflow import (
    NodeContext,
    NodeResult,
    Outcome,
    agent,
    compute,
    define_workflow,
    idempotent_effect,
    shell,
)

MAX_CHECKS = 100
MAX_NAME_CHARS = 128
DEFAULT_CHECK_TIMEOUT_MS = 10 * 60_000
MAX_CHECK_TIMEOUT_MS = 24 * 60 * 60_000
#: How much of the end of each output stream a failure keeps (and the agent sees).
TAIL_CHARS = 3_000
MAX_SUMMARY_CHARS = 20_000
SUMMARY_KEYS = {"summary", "checks"}


class Check(BaseModel):
    """One check: a program and its arguments, where and for how long to run it."""

    # A refused input names the field and the rule, never the value that was sent.
    model_config = ConfigDict(extra="forbid", strict=True, hide_input_in_errors=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    argv: list[str] = Field(min_length=1)
    cwd: str | None = Field(default=None, min_length=1)
    timeout_ms: int = Field(default=DEFAULT_CHECK_TIMEOUT_MS, ge=1, le=MAX_CHECK_TIMEOUT_MS)

    @field_validator("name")
    @classmethod
    def name_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be only whitespace")
        return value

    @field_validator("argv")
    @classmethod
    def runnable_argv(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("the first item must name the program to run")
        if any("\x00" in part for part in value):
            raise ValueError("items must not contain NUL characters")
        return value

    @field_validator("cwd")
    @classmethod
    def usable_cwd(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class SanityCheckInput(BaseModel):
    """The checks to run, in order; their names are unique."""

    model_config = ConfigDict(extra="forbid", strict=True, hide_input_in_errors=True)

    checks: list[Check] = Field(min_length=1, max_length=MAX_CHECKS)

    @field_validator("checks")
    @classmethod
    def unique_names(cls, value: list[Check]) -> list[Check]:
        first: dict[str, int] = {}
        for number, check in enumerate(value, start=1):
            if check.name in first:
                raise ValueError(
                    f"check names must be unique: checks {first[check.name]} and "
                    f"{number} have the same name"
                )
            first[check.name] = number
        return value


def recorded(ctx: NodeContext) -> list[dict[str, Any]]:
    """The results of the checks that ran so far, as the latest ``next`` visit recorded them."""
    progress = ctx.outputs.get("next")
    if progress is None:
        return []
    assert isinstance(progress, dict)
    results = progress["results"]
    assert isinstance(results, list)
    return [dict(result) for result in results if isinstance(result, dict)]


def check_result(check: Check, ran: NodeResult) -> dict[str, Any]:
    """What one visit of ``run_check`` says about ``check``; only failures keep output tails."""
    result: dict[str, Any] = {
        "name": check.name,
        "argv": check.argv,
        "exit_code": None,
        "signal": None,
        "duration_ms": ran.duration_ms,
    }
    no_output = {"passed": False, "stdout_tail": "", "stderr_tail": ""}
    if ran.outcome is Outcome.TIMED_OUT:
        return {**result, **no_output, "error": f"timed out after {check.timeout_ms} ms"}
    if ran.outcome is not Outcome.OK:  # the program could not be started
        return {**result, **no_output, "error": ran.error}
    shell_output = ran.output
    assert isinstance(shell_output, dict)
    code, signal = shell_output["exit_code"], shell_output["signal"]
    result.update(exit_code=code, signal=signal, duration_ms=shell_output["duration_ms"])
    if code == 0:
        return {**result, "passed": True, "error": None}
    error = f"exited with code {code}" if code is not None else f"killed by {signal}"
    return {
        **result,
        "passed": False,
        "error": error,
        "stdout_tail": shell_output["stdout_tail"],
        "stderr_tail": shell_output["stderr_tail"],
    }


def next_check(ctx: NodeContext) -> dict[str, Any]:
    """Record the check that just ran (if any) and say where to go: ``run``, ``summarise``
    (all ran, some failed) or ``report`` (all passed)."""
    request: SanityCheckInput = ctx.input
    results = recorded(ctx)
    if "next" in ctx.outputs:  # every later visit comes back from run_check
        results.append(check_result(request.checks[len(results)], ctx.results["run_check"]))
    index = len(results)
    ctx.publish_update("progress", "checks", {"done": index, "total": len(request.checks)})
    if index < len(request.checks):
        route = "run"
    elif all(result["passed"] for result in results):
        route = "report"
    else:
        route = "summarise"
    return {"route": route, "index": index, "results": results}


def current_check(ctx: NodeContext) -> Check:
    """The check ``next`` picked for this visit of ``run_check``."""
    request: SanityCheckInput = ctx.input
    progress = ctx.outputs["next"]
    assert isinstance(progress, dict)
    index = progress["index"]
    assert isinstance(index, int)
    return request.checks[index]


def check_command(ctx: NodeContext) -> dict[str, Any]:
    """The invocation of the current check: its argv as it is, no shell."""
    check = current_check(ctx)
    return {
        "command": check.argv[0],
        "args": check.argv[1:],
        "cwd": check.cwd,
        "timeout_ms": check.timeout_ms,
    }


def keep_tails(result: Any) -> dict[str, Any]:
    """The shell result without the bulk of its output: the end of each stream."""
    return {
        "exit_code": result["exit_code"],
        "signal": result["signal"],
        "duration_ms": result["duration_ms"],
        "stdout_tail": tail(result["stdout"], cut=result["stdout_truncated"]),
        "stderr_tail": tail(result["stderr"], cut=result["stderr_truncated"]),
    }


def tail(text: str, *, cut: bool) -> str:
    """The last :data:`TAIL_CHARS` characters of a stream, marked when its end is not there."""
    end = text[-TAIL_CHARS:]
    if cut:  # piwf kept the start of a longer stream, so this is not the real end
        end += "\n[output was longer than piwf keeps; its end is missing]"
    return end


def failures(ctx: NodeContext) -> list[dict[str, Any]]:
    """The results of the checks that failed, in the order they ran."""
    return [result for result in recorded(ctx) if not result["passed"]]


def summary_prompt(ctx: NodeContext) -> str:
    """Every failed check with its argv, how it ended and the end of its output."""
    failed = failures(ctx)
    total = len(recorded(ctx))
    lines = [
        f"{len(failed)} of {total} sanity checks failed. Summarise for a person what failed "
        "and the likely cause, most important first.",
    ]
    for result in failed:
        lines += [
            "",
            f"== check {result['name']!r}: {result['error']}",
            f"argv: {json.dumps(result['argv'])}",
        ]
        for stream in ("stdout", "stderr"):
            if result[f"{stream}_tail"]:
                lines += [f"--- end of {stream} ---", result[f"{stream}_tail"].rstrip("\n")]
    return "\n".join(lines)


def check_summary(output: object, ctx: NodeContext) -> dict[str, Any]:
    """Accept ``{"summary": text, "checks"?: {failed check name: text}}``; trim the texts."""
    if not isinstance(output, dict) or "summary" not in output or set(output) - SUMMARY_KEYS:
        raise ValueError(
            'submit {"summary": "<text>", "checks": {"<failed check>": "<text>"}}'
            ' ("checks" is optional)'
        )
    summary = output["summary"]
    if not isinstance(summary, str) or not summary.strip() or len(summary) > MAX_SUMMARY_CHARS:
        raise ValueError(
            f'"summary" must be a non-empty string of at most {MAX_SUMMARY_CHARS} characters'
        )
    per_check = output.get("checks", {})
    failed = [result["name"] for result in failures(ctx)]
    if not isinstance(per_check, dict):
        raise ValueError('"checks" must map failed check names to text')
    unknown = sorted(set(per_check) - set(failed))
    if unknown:
        raise ValueError(
            f'"checks" names no failed check {unknown}; the failed checks are {failed}'
        )
    if not all(isinstance(text, str) and text.strip() for text in per_check.values()):
        raise ValueError('each text in "checks" must be a non-empty string')
    return {
        "summary": summary.strip(),
        "checks": {name: text.strip() for name, text in per_check.items()},
    }


def report(ctx: NodeContext) -> dict[str, Any]:
    """The run's output: passed names, failures (with the agent's note on each), summary."""
    results = recorded(ctx)
    summary: str | None = None
    summary_error: str | None = None
    notes: dict[str, str] = {}
    summarised = ctx.results.get("summarise")
    if summarised is not None and summarised.outcome is Outcome.OK:
        assert isinstance(summarised.output, dict)  # check_summary's normalised value
        summary = str(summarised.output["summary"])
        per_check = summarised.output["checks"]
        assert isinstance(per_check, dict)
        notes = {name: str(text) for name, text in per_check.items()}
    elif summarised is not None:
        summary_error = summarised.error
    failed = [
        {key: value for key, value in result.items() if key != "passed"}
        | {"summary": notes.get(result["name"])}
        for result in results
        if not result["passed"]
    ]
    return {
        "passed": [result["name"] for result in results if result["passed"]],
        "failed": failed,
        "summary": summary,
        "summary_error": summary_error,
    }


workflow = define_workflow(
    name="sanity-check",
    start_at="next",
    input=SanityCheckInput,
    max_steps=2 * MAX_CHECKS + 3,
    nodes={
        "next": compute(next_check),
        "run_check": shell(
            effect=idempotent_effect("sanity-check.check"),
            command=check_command,
            request=lambda ctx: current_check(ctx).model_dump(),
            parse=keep_tails,
            allow_nonzero_exit=True,
        ),
        "summarise": agent(
            prompt=summary_prompt,
            expected_output=(
                '{"summary": "<what failed and why>", '
                '"checks": {"<failed check name>": "<one line on it>"}} ("checks" is optional)'
            ),
            validate=check_summary,
            status_detail="summarising failed checks",
        ),
        "report": compute(report),
    },
    edges=[
        {
            "from": "next",
            "switch": {
                "on": "$output.route",
                "cases": {"run": "run_check", "summarise": "summarise", "report": "report"},
            },
        },
        {
            "from": "run_check",
            "switch": {
                "on": "$result.outcome",
                "cases": {"ok": "next", "failed": "next", "timed_out": "next"},
            },
        },
        {
            "from": "summarise",
            "switch": {
                "on": "$result.outcome",
                "cases": {"ok": "report", "failed": "report", "timed_out": "report"},
            },
        },
    ],
)
