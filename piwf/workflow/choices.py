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

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.decision_answers import DEFAULT_INPUT_MAX_CHARS, TextInput, input_problem
from piwf.errors import WorkflowDefinitionError

CHOICE_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
#: The most choices one decision (a ``human_decision`` or an agent ``decision``) may declare:
#: every pending request and every shown decision carries all of them.
MAX_CHOICES = 100
#: The longest label (or agent ``decision`` description) a choice may have, in characters.
MAX_LABEL_CHARS = 500
#: The most bytes a decision's choices and inputs may take as a request carries them
#: (canonical JSON): what the other bounds allow stays under it unless many labels and input
#: prompts are both near their limits or need escaping.
MAX_CHOICES_BYTES = 128 * 1024


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
    """Declare a choice with its ``label`` (at most 500 characters) and, optionally, the
    ``input`` it needs."""
    if not isinstance(label, str) or not label:
        raise WorkflowDefinitionError("choice(): label must be a non-empty string")
    if len(label) > MAX_LABEL_CHARS:
        raise WorkflowDefinitionError(
            f"choice(): label has {len(label):,} characters; at most {MAX_LABEL_CHARS} are allowed"
        )
    if input is not None and not isinstance(input, TextInput):
        raise WorkflowDefinitionError("choice(): input must come from text_input(...)")
    return Choice(label=label, input=input)


def declare_choices(choices: object) -> DeclaredChoices:
    """Check ``human_decision(choices=...)`` and return the labels and inputs it declares.

    At most :data:`MAX_CHOICES` choices, each label at most :data:`MAX_LABEL_CHARS`
    characters, all of them with their inputs at most :data:`MAX_CHOICES_BYTES` as a request
    carries them. Raises
    :class:`WorkflowDefinitionError` naming the choice and the rule it breaks.
    """
    if isinstance(choices, Mapping):
        entries = list(choices.items())
    elif isinstance(choices, Sequence) and not isinstance(choices, str):
        entries = [(name, name) for name in choices]
    else:
        raise WorkflowDefinitionError("human_decision(): choices must be a mapping or a list")
    if not entries:
        raise WorkflowDefinitionError("human_decision(): declare at least one choice")
    if len(entries) > MAX_CHOICES:
        raise WorkflowDefinitionError(
            f"human_decision(): {len(entries)} choices declared; at most {MAX_CHOICES} are "
            "allowed (ask in two steps, or take a text_input)"
        )
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
        if len(declared.label) > MAX_LABEL_CHARS:
            raise WorkflowDefinitionError(
                f"human_decision(): the label of choice {name!r} has {len(declared.label):,} "
                f"characters; at most {MAX_LABEL_CHARS} are allowed"
            )
        if any(name == seen for seen, _ in labels):
            raise WorkflowDefinitionError(f"human_decision(): choice {name!r} is declared twice")
        labels.append((name, declared.label))
        if declared.input is not None:
            inputs.append((name, declared.input))
    carried: dict[str, JsonValue] = {
        "choices": dict(labels),
        "inputs": {name: declared_input.to_json() for name, declared_input in inputs},
    }
    size = len(canonical.encode(carried))
    if size > MAX_CHOICES_BYTES:
        raise WorkflowDefinitionError(
            f"human_decision(): the choices and their inputs take {size:,} bytes as a request "
            f"carries them; at most "
            f"{MAX_CHOICES_BYTES:,} are allowed (shorten labels and input prompts)"
        )
    return DeclaredChoices(labels=tuple(labels), inputs=tuple(inputs))
