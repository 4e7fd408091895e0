"""``decision``: an agent step that must pick one of a fixed set of choices.

Sugar over :func:`piwf.workflow.agent`: the prompt asks the question and lists the choices, and
the step's ``validate`` accepts only ``{field: <one of the choices>}``, optionally with a short
``"reason"`` text (kept in the output, so a later step or a person can read why)::

    assess = decision(
        question="Did the last experiment improve the metric?",
        choices={"continue": "it improved; try the next idea",
                 "plateau": "no real change for a while",
                 "dead_end": "this direction cannot work"},
    )
    edges = [decision_edge(from_="assess", choices=assess,
                           cases={"continue": "experiment", "plateau": "conclude",
                                  "dead_end": "conclude"})]

A switch on ``$output.<field>`` leaving a decision must name every choice and nothing else;
:func:`piwf.workflow.define_workflow` refuses it otherwise (as it does for a
``human_decision``), and :func:`decision_edge` checks the same when the edge is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from piwf.canonical import JsonValue
from piwf.errors import WorkflowDefinitionError
from piwf.workflow.choices import MAX_CHOICES, MAX_LABEL_CHARS
from piwf.workflow.nodes import DEFAULT_AGENT_TIMEOUT_MS, AgentNode, TimeoutSpec, agent

if TYPE_CHECKING:
    from piwf.workflow.context import NodeContext

#: The optional explanation a decision's output may carry next to the choice.
REASON_KEY = "reason"
MAX_REASON_CHARS = 2_000
MAX_CHOICE_CHARS = 128
#: A field must be readable by a switch path (``$output.<field>``).
FIELD_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class DecisionNode(AgentNode):
    """An agent step whose output is ``{output_field: <choice>}`` (plus an optional reason).

    ``choices`` pairs each choice with its description ('' for none), in declaration order.
    """

    choices: tuple[tuple[str, str], ...] = ()
    output_field: str = "route"

    @property
    def choice_names(self) -> tuple[str, ...]:
        """Return the choices in declaration order."""
        return tuple(name for name, _ in self.choices)

    def structure(self) -> dict[str, JsonValue]:
        """Return the agent step's snapshot with its field and choices."""
        return {
            **super().structure(),
            "decision": {"field": self.output_field, "choices": dict(self.choices)},
        }


def decision(
    *,
    choices: Sequence[str] | Mapping[str, str],
    question: str | Callable[[NodeContext], str],
    field: str = "route",
    timeout_ms: TimeoutSpec = DEFAULT_AGENT_TIMEOUT_MS,
    status_detail: str | None = None,
) -> DecisionNode:
    """Return an agent step that must answer ``question`` with one of ``choices``.

    ``choices`` lists the choices, or maps each to a description the prompt shows. The output
    is ``{field: choice}``, or ``{field: choice, "reason": text}`` when the agent explains
    itself (at most 2,000 characters). Any other submission is rejected with a message that
    says what to send, and the same request stays open. ``question`` is a string or a callable
    of the node context. Raises :class:`WorkflowDefinitionError` for empty, duplicate or
    non-string choices, more than 100 choices, a description over 500 characters, or a field
    a switch path cannot name.
    """
    declared = _choices(choices)
    if not isinstance(field, str) or not FIELD_PATTERN.match(field) or field == REASON_KEY:
        raise WorkflowDefinitionError(
            f"decision(): field must match {FIELD_PATTERN.pattern} and not be {REASON_KEY!r}"
        )
    if not isinstance(question, str) and not callable(question):
        raise WorkflowDefinitionError("decision(): question must be a string or a callable")
    if isinstance(question, str) and not question.strip():
        raise WorkflowDefinitionError("decision(): question must not be empty")
    names = tuple(name for name, _ in declared)
    step = agent(
        prompt=_prompt(question, declared, field),
        expected_output=_expected_output(names, field),
        validate=_validator(names, field),
        timeout_ms=timeout_ms,
        status_detail=status_detail,
    )
    inherited = {item.name: getattr(step, item.name) for item in fields(step)}
    return DecisionNode(**inherited, choices=declared, output_field=field)


def decision_edge(
    *,
    from_: str,
    choices: DecisionNode | Sequence[str] | Mapping[str, str],
    cases: Mapping[str, str],
    field: str | None = None,
) -> dict[str, Any]:
    """Return the switch edge ``{from, switch: {on: "$output.<field>", cases}}`` of a decision.

    ``choices`` is the decision node itself or the choices it was given; ``field`` defaults to
    the node's field (``route`` for plain choices). Raises :class:`WorkflowDefinitionError`
    when ``cases`` misses a choice or names one that is not declared.
    """
    if isinstance(choices, DecisionNode):
        names = choices.choice_names
        if field is not None and field != choices.output_field:
            raise WorkflowDefinitionError(
                f"decision_edge(): the decision's field is {choices.output_field!r}, not {field!r}"
            )
        field = choices.output_field
    else:
        names = tuple(name for name, _ in _choices(choices, factory="decision_edge"))
    field = "route" if field is None else field
    if not isinstance(cases, Mapping) or not all(
        isinstance(target, str) and target for target in cases.values()
    ):
        raise WorkflowDefinitionError("decision_edge(): cases must map each choice to a node id")
    problem = missing_cases(f"decision {from_!r}", names, cases)
    if problem is not None:
        raise WorkflowDefinitionError(f"decision_edge(): {problem}")
    return {"from": from_, "switch": {"on": f"$output.{field}", "cases": dict(cases)}}


def missing_cases(what: str, names: Sequence[str], cases: Mapping[str, object]) -> str | None:
    """Return what is wrong with a switch's ``cases`` for choices ``names``, or None.

    Every choice needs a case, and every case must be a choice (anything else could never be
    taken). Used for agent decisions and protected human decisions alike.
    """
    missing = [name for name in names if name not in cases]
    if missing:
        return f"switch from {what} has no case for declared choice(s) {', '.join(missing)}"
    unknown = sorted(str(value) for value in cases if value not in names)
    if unknown:
        return f"switch from {what} has case(s) {', '.join(unknown)} that are not declared choices"
    return None


def _choices(choices: object, *, factory: str = "decision") -> tuple[tuple[str, str], ...]:
    if isinstance(choices, Mapping):
        entries = list(choices.items())
    elif isinstance(choices, Sequence) and not isinstance(choices, str):
        entries = [(name, "") for name in choices]
    else:
        raise WorkflowDefinitionError(
            f"{factory}(): choices must be a list of strings or a mapping choice -> description"
        )
    if not entries:
        raise WorkflowDefinitionError(f"{factory}(): declare at least one choice")
    if len(entries) > MAX_CHOICES:
        raise WorkflowDefinitionError(
            f"{factory}(): {len(entries)} choices declared; at most {MAX_CHOICES} are allowed"
        )
    seen: set[str] = set()
    for name, description in entries:
        if (
            not isinstance(name, str)
            or not name.strip()
            or name != name.strip()
            or len(name) > MAX_CHOICE_CHARS
        ):
            raise WorkflowDefinitionError(
                f"{factory}(): choice {name!r} must be a non-empty string of at most "
                f"{MAX_CHOICE_CHARS} characters without surrounding spaces"
            )
        if not isinstance(description, str):
            raise WorkflowDefinitionError(
                f"{factory}(): the description of choice {name!r} must be a string"
            )
        if len(description) > MAX_LABEL_CHARS:
            raise WorkflowDefinitionError(
                f"{factory}(): the description of choice {name!r} has {len(description):,} "
                f"characters; at most {MAX_LABEL_CHARS} are allowed"
            )
        if name in seen:
            raise WorkflowDefinitionError(f"{factory}(): choice {name!r} is declared twice")
        seen.add(name)
    return tuple((name, description) for name, description in entries)


def _choice_lines(choices: tuple[tuple[str, str], ...]) -> str:
    return "\n".join(
        f"- {name}: {description}" if description else f"- {name}" for name, description in choices
    )


def _prompt(
    question: str | Callable[[NodeContext], str],
    choices: tuple[tuple[str, str], ...],
    field: str,
) -> str | Callable[[NodeContext], str]:
    tail = (
        f"\n\nChoose exactly one of:\n{_choice_lines(choices)}\n\n"
        f'Submit {{"{field}": "<choice>"}}, optionally with "{REASON_KEY}": a short explanation.'
    )
    if isinstance(question, str):
        return question + tail

    def prompt(ctx: NodeContext) -> str:
        text = question(ctx)
        if not isinstance(text, str):
            raise TypeError("decision question must return a string")
        return text + tail

    return prompt


def _expected_output(names: Sequence[str], field: str) -> str:
    listed = ", ".join(f'"{name}"' for name in names)
    return (
        f'A JSON object {{"{field}": <choice>}} where <choice> is exactly one of {listed}; it '
        f'may also carry "{REASON_KEY}": a string of at most {MAX_REASON_CHARS} characters.'
    )


def _validator(names: Sequence[str], field: str) -> Callable[[JsonValue, NodeContext], JsonValue]:
    listed = ", ".join(f'"{name}"' for name in names)
    shape = f'{{"{field}": <one of {listed}>}}'

    def validate(output: JsonValue, ctx: NodeContext) -> JsonValue:
        # Messages go back to the agent as the rejection: they say what to send and never
        # echo a value that was sent.
        if not isinstance(output, dict):
            raise ValueError(f"submit a JSON object {shape}")
        if field not in output:
            raise ValueError(f"the output has no {field!r}; submit {shape}")
        chosen = output[field]
        if not isinstance(chosen, str) or chosen not in names:
            raise ValueError(f"{field!r} must be exactly one of {listed}")
        extra = sorted(key for key in output if key not in (field, REASON_KEY))
        if extra:
            raise ValueError(
                f"unexpected key(s) {', '.join(extra)}; submit only {field!r} and "
                f"optionally {REASON_KEY!r}"
            )
        if REASON_KEY not in output:
            return {field: chosen}
        reason = output[REASON_KEY]
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise ValueError(f"{REASON_KEY!r} must be a string of at most {MAX_REASON_CHARS} chars")
        return {field: chosen, REASON_KEY: reason}

    return validate
