"""Built-in ``plan-approval``: an agent plans, a person approves, asks for a replan, or rejects.

    input   {"goal": str, "max_rounds"?: int (1..10, default 3)}
    output  {"approved": bool, "plan": str, "rounds": int}

Each round the agent submits ``{"plan": "..."}`` and a person answers a protected decision::

    draft ─▶ round ─┬─ rounds left ─▶ review ──────┬─ approve ─▶ approved
      ▲             │                              ├─ reject ──▶ rejected
      │             │                              └─ replan ─┐
      │             └─ last round ─▶ final_review ─┬─ approve ─▶ approved
      │                                            └─ reject ──▶ rejected
      └───────────────────────────────────────────────────────┘

``replan`` carries the person's ``instructions``; the next draft's prompt shows the previous
plan and those instructions. In the last round (``max_rounds``) the decision offers only
approve or reject, so a run never asks for more than ``max_rounds`` plans. ``rounds`` counts the
plans drafted; ``approved`` is false when the person rejected the last one. Only a person
answers (``piwf answer REQUEST_ID '{"choice": "replan", "instructions": "..."}'``); there is
no timeout default.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from piwf.workflow import (
    NodeContext,
    agent,
    choice,
    compute,
    define_workflow,
    human_decision,
    text_input,
)

MAX_GOAL_CHARS = 20_000
MAX_ROUNDS = 10
MAX_PLAN_CHARS = 100_000

APPROVE = "Approve the plan"
REJECT = "Reject the plan"


class PlanApprovalInput(BaseModel):
    """The goal to plan for and how many plans a person may ask for."""

    # A refused input names the field and the rule, never the value that was sent.
    model_config = ConfigDict(extra="forbid", strict=True, hide_input_in_errors=True)

    goal: str = Field(max_length=MAX_GOAL_CHARS)
    max_rounds: int = Field(default=3, ge=1, le=MAX_ROUNDS)

    @field_validator("goal")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty or only whitespace")
        return value


def draft_prompt(ctx: NodeContext) -> str:
    """The goal; on a replan, also the previous plan and the person's instructions."""
    request: PlanApprovalInput = ctx.input
    lines = [
        f"Write a plan that reaches the goal below (round {ctx.visit} of {request.max_rounds};"
        " a person reviews it).",
        "",
        "----- goal -----",
        request.goal.strip(),
        "----- end of goal -----",
    ]
    review = ctx.outputs.get("review")
    if isinstance(review, dict) and review.get("choice") == "replan":
        lines += [
            "",
            "The reviewer asked for a new plan instead of this one:",
            "",
            latest_plan(ctx),
            "",
            "The reviewer's instructions for the new plan:",
            "",
            str(review["instructions"]),
        ]
    return "\n".join(lines)


def check_plan(output: object, ctx: NodeContext) -> dict[str, str]:
    """Accept exactly ``{"plan": <non-blank text>}``; return it with the text trimmed."""
    if not isinstance(output, dict) or set(output) != {"plan"}:
        raise ValueError('submit exactly {"plan": "<the plan as text>"}')
    plan = output["plan"]
    if not isinstance(plan, str) or not plan.strip():
        raise ValueError('"plan" must be a non-empty string')
    if len(plan) > MAX_PLAN_CHARS:
        raise ValueError(f'"plan" must be at most {MAX_PLAN_CHARS} characters')
    return {"plan": plan.strip()}


def latest_plan(ctx: NodeContext) -> str:
    """The plan of the latest draft (``check_plan`` made it ``{"plan": str}``)."""
    draft = ctx.outputs["draft"]
    assert isinstance(draft, dict)
    plan = draft["plan"]
    assert isinstance(plan, str)
    return plan


def round_number(ctx: NodeContext) -> int:
    """How many plans were drafted so far: each round visits ``draft`` once."""
    return ctx.results["draft"].visit


def count_round(ctx: NodeContext) -> dict[str, object]:
    """Which round the latest plan is, and whether it is the last one a person can ask for."""
    request: PlanApprovalInput = ctx.input
    return {"round": round_number(ctx), "last": round_number(ctx) >= request.max_rounds}


def review_request(ctx: NodeContext) -> dict[str, object]:
    """What the person sees: the goal, the plan and the round."""
    request: PlanApprovalInput = ctx.input
    return {
        "summary": f"Approve the plan (round {round_number(ctx)} of {request.max_rounds})?",
        "goal": request.goal,
        "plan": latest_plan(ctx),
        "round": round_number(ctx),
        "max_rounds": request.max_rounds,
    }


def decided(ctx: NodeContext, *, approved: bool) -> dict[str, object]:
    """The run's output once the person approved or rejected the latest plan."""
    return {"approved": approved, "plan": latest_plan(ctx), "rounds": round_number(ctx)}


workflow = define_workflow(
    name="plan-approval",
    start_at="draft",
    input=PlanApprovalInput,
    nodes={
        "draft": agent(
            prompt=draft_prompt,
            expected_output='{"plan": "<the plan as text>"}',
            validate=check_plan,
            status_detail="planning",
        ),
        "round": compute(count_round),
        "review": human_decision(
            choices={
                "approve": APPROVE,
                "replan": choice(
                    "Ask for a new plan",
                    input=text_input("instructions", prompt="What should the new plan change?"),
                ),
                "reject": REJECT,
            },
            request=review_request,
        ),
        "final_review": human_decision(
            choices={"approve": APPROVE, "reject": f"{REJECT} (no rounds left)"},
            request=review_request,
        ),
        "approved": compute(lambda ctx: decided(ctx, approved=True)),
        "rejected": compute(lambda ctx: decided(ctx, approved=False)),
    },
    edges=[
        {"from": "draft", "to": "round"},
        {
            "from": "round",
            "switch": {"on": "$output.last", "cases": {"false": "review", "true": "final_review"}},
        },
        {
            "from": "review",
            "switch": {
                "on": "$output.choice",
                "cases": {"approve": "approved", "replan": "draft", "reject": "rejected"},
            },
        },
        {
            "from": "final_review",
            "switch": {
                "on": "$output.choice",
                "cases": {"approve": "approved", "reject": "rejected"},
            },
        },
    ],
)
