"""The answer form: a person types the JSON answer of the request a run waits on.

Enter sends it (the caller answers through ``Client.answer``, ``decision.answer``: a person's
answer); text that is not JSON is refused here, with the reason, before anything is sent; Esc
gives up.
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

    def __init__(self, waiting: WaitingOn) -> None:
        super().__init__()
        self.waiting = waiting

    def compose(self) -> ComposeResult:
        yield Static(
            f"Answer request {self.waiting.request_id} ({self.waiting.kind}) at node "
            f'"{self.waiting.path}": type JSON, Enter sends it, Esc cancels',
            id="answer-title",
            markup=False,
        )
        yield Input(placeholder='{"choice": "approve"}', id="answer-input")
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
