"""The one rule a decision answer meets, shared by the authoring layer and the store.

A protected decision declares its choices; a choice may carry one text input that the person
answering must fill in::

    human_decision(choices={
        "continue": "Continue",
        "replan": choice("Replan", input=text_input("instructions", prompt="What should change?")),
    })

    {"choice": "continue"}                                  accepted
    {"choice": "replan", "instructions": "split step 2"}    accepted; the node output as given
    {"choice": "replan"}                                    refused: the input is missing
    {"choice": "replan", "instructions": "  "}              refused: the input is empty
    {"choice": "continue", "instructions": "..."}           refused: continue takes no input

A decision none of whose choices declares an input keeps its original rule: the answer is an
object whose ``choice`` is declared; other keys are kept as given. Once any choice declares an
input the answer is exact: ``choice`` plus the input of the chosen choice, nothing else.

The engine applies :func:`check_decision_answer` when it consumes an answer
(:meth:`piwf.workflow.nodes.HumanDecisionNode.check_answer`) and the server when one arrives
(:func:`piwf.state.decisions.check_candidate`), so a refusal at answer time and the engine's
check cannot disagree. Messages name keys, choices and limits, never the text that was sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from piwf.canonical import JsonValue

#: Default bound of a text input, in characters.
DEFAULT_INPUT_MAX_CHARS = 4_000
#: The largest bound a text input may declare, in characters.
MAX_INPUT_CHARS = 64_000
#: The largest prompt a text input may declare, in characters.
MAX_INPUT_PROMPT_CHARS = 1_000
#: An input's name is the key its text travels under, next to ``choice``.
INPUT_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
#: The key that names the chosen choice; no input may use it.
CHOICE_KEY = "choice"


@dataclass(frozen=True)
class TextInput:
    """A text a choice needs: sent under ``name``, shown to the person as ``prompt``.

    The text must be a non-empty string (not only whitespace) of at most ``max_chars``
    characters.
    """

    name: str
    prompt: str
    max_chars: int = DEFAULT_INPUT_MAX_CHARS

    def to_json(self) -> dict[str, JsonValue]:
        """Return the stored and wire form ``{kind, name, prompt, maxChars}``."""
        return {
            "kind": "text",
            "name": self.name,
            "prompt": self.prompt,
            "maxChars": self.max_chars,
        }

    @classmethod
    def from_json(cls, value: object) -> TextInput | None:
        """Return the input stored as ``value`` by :meth:`to_json`, or None for anything else."""
        if not isinstance(value, Mapping) or value.get("kind") != "text":
            return None
        name, prompt, max_chars = value.get("name"), value.get("prompt"), value.get("maxChars")
        if not isinstance(name, str) or not isinstance(prompt, str):
            return None
        if isinstance(max_chars, bool) or not isinstance(max_chars, int):
            return None
        return cls(name=name, prompt=prompt, max_chars=max_chars)


def input_problem(value: TextInput) -> str | None:
    """Return why ``value`` cannot be declared as an input, or None when it can."""
    if not isinstance(value.name, str) or not INPUT_NAME_PATTERN.match(value.name):
        return f"input name {value.name!r} must match {INPUT_NAME_PATTERN.pattern}"
    if value.name == CHOICE_KEY:
        return f"input name {CHOICE_KEY!r} is taken by the chosen choice itself"
    if not isinstance(value.prompt, str) or not value.prompt.strip():
        return f"input {value.name!r} needs a non-empty prompt"
    if len(value.prompt) > MAX_INPUT_PROMPT_CHARS:
        return f"input {value.name!r}: prompt is longer than {MAX_INPUT_PROMPT_CHARS} characters"
    max_chars = value.max_chars
    if isinstance(max_chars, bool) or not isinstance(max_chars, int):
        return f"input {value.name!r}: max_chars must be an integer"
    if not 1 <= max_chars <= MAX_INPUT_CHARS:
        return f"input {value.name!r}: max_chars must be in 1..{MAX_INPUT_CHARS}"
    return None


def check_decision_answer(
    choice_names: Sequence[str], inputs: Mapping[str, TextInput], answer: JsonValue
) -> str | None:
    """Return why ``answer`` is not a valid answer, or None when it is.

    ``choice_names`` are the declared choices; ``inputs`` maps each choice that carries an
    input to it. See the module docstring for the rule.
    """
    example = f'{{"{CHOICE_KEY}": "{choice_names[0]}"}}' if choice_names else "{}"
    if not isinstance(answer, Mapping):
        return f"a decision answer must be an object with a '{CHOICE_KEY}', such as {example}"
    if CHOICE_KEY not in answer:
        return (
            f"the answer has no '{CHOICE_KEY}': send one of {', '.join(choice_names)}, "
            f"such as {example}"
        )
    chosen = answer.get(CHOICE_KEY)
    if chosen not in choice_names:
        return f"choice {_sent(chosen)} is not one of {', '.join(choice_names)}"
    if not inputs:
        return None
    assert isinstance(chosen, str)
    wanted = inputs.get(chosen)
    allowed = {CHOICE_KEY} if wanted is None else {CHOICE_KEY, wanted.name}
    unknown = sorted(str(key) for key in answer if key not in allowed)
    if unknown:
        takes = f"takes only {wanted.name!r}" if wanted else "takes no input"
        named = ", ".join(_sent(key) for key in unknown[:_NAMED_KEYS])
        more = f" and {len(unknown) - _NAMED_KEYS} more" if len(unknown) > _NAMED_KEYS else ""
        return (
            f"unknown input(s) {named}{more} for choice {chosen!r}, "
            f"which {takes}; send exactly {_shape(chosen, wanted)}"
        )
    if wanted is None:
        return None
    if wanted.name not in answer:
        return (
            f"choice {chosen!r} needs its input {wanted.name!r} ({wanted.prompt}); "
            f"send {_shape(chosen, wanted)}"
        )
    text = answer[wanted.name]
    if not isinstance(text, str):
        return f"input {wanted.name!r} of choice {chosen!r} must be a string"
    if not text.strip():
        return f"input {wanted.name!r} of choice {chosen!r} must not be empty ({wanted.prompt})"
    if len(text) > wanted.max_chars:
        return (
            f"input {wanted.name!r} of choice {chosen!r} is {len(text)} characters; at most "
            f"{wanted.max_chars} are accepted"
        )
    return None


#: The longest sent string a refusal repeats: a mistyped choice or key is easiest to see as
#: itself, but a refusal is returned, stored with the submission and shown by ``run show``.
_ECHOED_NAME_CHARS = 64
#: How many unknown keys a refusal names.
_NAMED_KEYS = 5


def _sent(value: object) -> str:
    """How a refusal names a value the answer carried (a choice, a key): a short printable
    string as its repr, null, a boolean or a number as JSON, anything else (a long string, one
    with control characters, an object, an array) by what it is, so a refusal stays short and
    never repeats an answer's text."""
    if isinstance(value, str):
        if len(value) <= _ECHOED_NAME_CHARS and value.isprintable():
            return repr(value)
        return f"(a string of {len(value):,} characters)"
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    return "(an object)" if isinstance(value, Mapping) else "(an array)"


def _shape(chosen: str, wanted: TextInput | None) -> str:
    if wanted is None:
        return f'{{"choice": "{chosen}"}}'
    return f'{{"choice": "{chosen}", "{wanted.name}": "<text>"}}'
