"""The answer form: a person types the JSON answer of the request a run waits on.

The form shows what the request asks (its choices, the text a choice carries, a checkpoint's
content) as ``piwf run show`` does. Enter asks y/n with the value as it will be sent
(:class:`ConfirmAnswer`); y sends it (the caller's ``send``: ``Client.answer``, a person's
``decision.answer``) and the form closes once the server took it. Text that is not JSON is
refused here before anything is sent, and an answer the server refuses (a choice that does not
exist, a missing input) keeps the form open with the refusal and the typed text, to correct and
send again; n or Esc gives up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Static

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import CanonicalJsonError, PiwfError
from piwf.protocol.view_payloads import WaitingOn

#: The most characters of an answer the y/n question shows.
SHOWN_ANSWER_CHARS = 200


class AnswerScreen(ModalScreen["str | None"]):
    """Ask for the answer to ``waiting`` and send it; dismissed with the server's outcome
    (``won``, ``adopted``, ``already_resolved``), or None when nothing was sent."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "give_up", "cancel")]

    DEFAULT_CSS = """
    AnswerScreen #answer-about { height: auto; max-height: 12; padding: 0 1; }
    """

    def __init__(
        self,
        waiting: WaitingOn,
        about: str,
        *,
        one_line: Callable[[str], str],
        send: Callable[[JsonValue], str],
    ) -> None:
        """``about``: what the request asks, already safe to show (the caller's wording);
        ``one_line`` makes a value safe to show in the y/n question; ``send`` answers with a
        value and returns the outcome, or raises :class:`PiwfError` (it blocks: it runs in a
        worker thread)."""
        super().__init__()
        self.waiting = waiting
        self.about = about
        self._one_line = one_line
        self._send = send
        self._sending = False

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
        if self._sending:
            return  # the answer before is on its way
        try:
            value = canonical.parse(event.value)
        except CanonicalJsonError as error:
            self._error(f"not sent: {error}")
            return
        shown = self._one_line(canonical.encode_text(value))
        if len(shown) > SHOWN_ANSWER_CHARS:  # a long answer: its start, on the screen it fits
            shown = shown[:SHOWN_ANSWER_CHARS] + "… (cut here only; all of it is sent)"

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._sending = True
                self._error("sending…")
                self._answer(value)
            else:
                self.dismiss(None)

        self.app.push_screen(ConfirmAnswer(self.waiting.request_id, shown), confirmed)

    @work(thread=True, group="answer")
    def _answer(self, value: JsonValue) -> None:
        try:
            outcome = self._send(value)
        except PiwfError as error:
            self.app.call_from_thread(self._refused, error)
            return
        self.app.call_from_thread(self.dismiss, outcome)

    def _refused(self, error: PiwfError) -> None:
        self._sending = False
        self._error(
            f"not answered: {error}. Correct the answer and press Enter to send it again,"
            " or Esc to leave"
        )
        self.query_one("#answer-input", Input).focus()

    def _error(self, text: str) -> None:
        self.query_one("#answer-error", Static).update(self._one_line(text))

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
