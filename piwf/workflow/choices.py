"""The choices of a protected decision: names, labels and the inputs a choice can carry.

``human_decision(choices=...)`` takes a list of names, or a mapping of names to a label or to a
:func:`choice` (a label and, optionally, a :func:`text_input` the person must fill in)::

    human_decision(choices={
        "continue": "Continue",
        "replan": choice("Replan", input=text_input("instructions", prompt="What should change?")),
    })

The answer to ``replan`` then carries the text under the input's name:
``{"choice": "replan", "instructions": "..."}``, and that is the node output.
:mod:`piwf.decision_answers` states the rule an answer meets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from piwf.decision_answers import DEFAULT_INPUT_MAX_CHARS, TextInput, input_problem
from piwf.errors import WorkflowDefinitionError

CHOICE_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Choice:
    """One declared choice: its ``label`` and the ``input`` it needs, if any."""

    label: str
    input: TextInput | None = None


@dataclass(frozen=True)
class DeclaredChoices:
    """The checked choices of one decision, in declaration order."""

    labels: tuple[tuple[str, str], ...]
    inputs: tuple[tuple[str, TextInput], ...]


def text_input(name: str, *, prompt: str, max_chars: int = DEFAULT_INPUT_MAX_CHARS) -> TextInput:
    """Declare a text a choice needs: sent under ``name``, asked for with ``prompt``.

    The answer must carry a non-empty string of at most ``max_chars`` characters (default
    4,000; at most 64,000). Raises :class:`WorkflowDefinitionError` for a name that is not an
    identifier (or is ``choice``), an empty prompt or a bound out of range.
    """
    declared = TextInput(name=name, prompt=prompt, max_chars=max_chars)
    problem = input_problem(declared)
    if problem is not None:
        raise WorkflowDefinitionError(f"text_input(): {problem}")
    return declared


def choice(label: str, *, input: TextInput | None = None) -> Choice:
    """Declare a choice with its ``label`` and, optionally, the ``input`` it needs."""
    if not isinstance(label, str) or not label:
        raise WorkflowDefinitionError("choice(): label must be a non-empty string")
    if input is not None and not isinstance(input, TextInput):
        raise WorkflowDefinitionError("choice(): input must come from text_input(...)")
    return Choice(label=label, input=input)


def declare_choices(choices: object) -> DeclaredChoices:
    """Check ``human_decision(choices=...)`` and return the labels and inputs it declares.

    Raises :class:`WorkflowDefinitionError` naming the choice and the rule it breaks.
    """
    if isinstance(choices, Mapping):
        entries = list(choices.items())
    elif isinstance(choices, Sequence) and not isinstance(choices, str):
        entries = [(name, name) for name in choices]
    else:
        raise WorkflowDefinitionError("human_decision(): choices must be a mapping or a list")
    if not entries:
        raise WorkflowDefinitionError("human_decision(): declare at least one choice")
    labels: list[tuple[str, str]] = []
    inputs: list[tuple[str, TextInput]] = []
    for name, value in entries:
        if not isinstance(name, str) or not CHOICE_PATTERN.match(name):
            raise WorkflowDefinitionError(
                f"human_decision(): choice name {name!r} must match {CHOICE_PATTERN.pattern}"
            )
        declared = value if isinstance(value, Choice) else Choice(label=value)
        if not isinstance(declared.label, str) or not declared.label:
            raise WorkflowDefinitionError(
                f"human_decision(): choice {name!r} needs a non-empty string label"
            )
        if any(name == seen for seen, _ in labels):
            raise WorkflowDefinitionError(f"human_decision(): choice {name!r} is declared twice")
        labels.append((name, declared.label))
        if declared.input is not None:
            inputs.append((name, declared.input))
    return DeclaredChoices(labels=tuple(labels), inputs=tuple(inputs))
