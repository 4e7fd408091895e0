"""The answer form: a person types the JSON answer of the request a run waits on.

The form shows what the request asks (its choices, the text a choice carries, a checkpoint's
content) as ``piwf run show`` does. Enter hands the parsed value back; the caller asks y/n with
the value as it will be sent (:class:`ConfirmAnswer`) before it answers through
``Client.answer`` (``decision.answer``: a person's answer). Text that is not JSON is refused
here, with the reason, before anything is sent; Esc gives up.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Static

from piwf import canonical
from piwf.canonical import JsonValue  # noqa: F401  # named in the string of the base class
from piwf.errors import CanonicalJsonError
from piwf.protocol.view_payloads import WaitingOn


class AnswerScreen(ModalScreen["JsonValue | None"]):
    """Ask for the answer to ``waiting``; dismissed with the parsed value, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "give_up", "cancel")]

    DEFAULT_CSS = """
    AnswerScreen #answer-about { height: auto; max-height: 12; padding: 0 1; }
    """

    def __init__(self, waiting: WaitingOn, about: str) -> None:
        """``about``: what the request asks, already safe to show (the caller's wording)."""
        super().__init__()
        self.waiting = waiting
        self.about = about

    def compose(self) -> ComposeResult:
        yield Static(
            f"Answer request {self.waiting.request_id} ({self.waiting.kind}) at node "
            f'"{self.waiting.path}": type JSON, Enter sends it, Esc cancels',
            id="answer-title",
            markup=False,
        )
        yield Static(self.about, id="answer-about", markup=False)
        placeholder = '{"choice": "..."}' if self.waiting.action == "humanAnswer" else "JSON"
        yield Input(placeholder=placeholder, id="answer-input")
        yield Static("", id="answer-error", markup=False)
        yield Footer()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            value = canonical.parse(event.value)
        except CanonicalJsonError as error:
            self.query_one("#answer-error", Static).update(f"not sent: {error}")
            return
        self.dismiss(value)

    def action_give_up(self) -> None:
        self.dismiss(None)


class ConfirmAnswer(ModalScreen[bool]):
    """Ask before answering: y sends ``value`` (shown as it will be sent), n or Esc keeps it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes, send it"),
        Binding("n", "answer(False)", "no"),
        Binding("escape", "answer(False)", "no", show=False),
    ]

    def __init__(self, request_id: str, shown_value: str) -> None:
        """``shown_value``: the value as it will be sent, already safe to show."""
        super().__init__()
        self.request_id = request_id
        self.shown_value = shown_value

    def compose(self) -> ComposeResult:
        yield Static(
            f"Answer request {self.request_id} with {self.shown_value}? (y/n)",
            id="confirm",
            markup=False,
        )
        yield Footer()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
