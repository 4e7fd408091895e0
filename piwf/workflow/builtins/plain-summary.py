"""Built-in ``plain-summary``: one agent step summarises a text.

    input   {"text": str, "instructions"?: str}
    output  {"summary": str}

The agent gets the text between two markers, with the instructions (if any) before it, and
submits ``{"summary": "..."}``; a blank or oversized summary is refused and the agent asked
again. Run it headless with an agent command::

    piwf run start plain-summary --input '{"text": "..."}' --agent-command 'CMD ARGS' --wait
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from piwf.workflow import NodeContext, agent, define_workflow

#: The text's own cap; the 1 MiB request that carries the input bounds it too (about 1,040,000
#: bytes of UTF-8 JSON: 1,000,000 ASCII characters fit, about 500,000 two-byte ones).
MAX_TEXT_CHARS = 1_000_000
MAX_INSTRUCTIONS_CHARS = 4_000
MAX_SUMMARY_CHARS = 20_000


class PlainSummaryInput(BaseModel):
    """The text to summarise and, optionally, how to summarise it."""

    # A refused input names the field and the rule, never the value that was sent.
    model_config = ConfigDict(extra="forbid", strict=True, hide_input_in_errors=True)

    text: str = Field(max_length=MAX_TEXT_CHARS)
    instructions: str | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)

    @field_validator("text", "instructions")
    @classmethod
    def not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty or only whitespace")
        return value


def summary_prompt(ctx: NodeContext) -> str:
    """The request the agent reads: what to do, then the text between markers."""
    request: PlainSummaryInput = ctx.input
    lines = ["Summarise the text between the markers below."]
    if request.instructions is not None:
        lines.append(f"Instructions: {request.instructions.strip()}")
    lines += ["", "----- text -----", request.text, "----- end of text -----"]
    return "\n".join(lines)


def check_summary(output: object, ctx: NodeContext) -> dict[str, str]:
    """Accept exactly ``{"summary": <non-blank text>}``; return it with the text trimmed."""
    if not isinstance(output, dict) or set(output) != {"summary"}:
        raise ValueError('submit exactly {"summary": "<the summary as text>"}')
    summary = output["summary"]
    if not isinstance(summary, str) or not summary.strip():
        raise ValueError('"summary" must be a non-empty string')
    if len(summary) > MAX_SUMMARY_CHARS:
        raise ValueError(f'"summary" must be at most {MAX_SUMMARY_CHARS} characters')
    return {"summary": summary.strip()}


workflow = define_workflow(
    name="plain-summary",
    start_at="summarise",
    input=PlainSummaryInput,
    nodes={
        "summarise": agent(
            prompt=summary_prompt,
            expected_output='{"summary": "<the summary as text>"}',
            validate=check_summary,
            status_detail="summarising",
        ),
    },
    edges=[],
)
