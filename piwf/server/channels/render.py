"""What a channel shows: a decision as a message with one button per choice, and its winner.

The server renders (the adapter only transports). Each button carries ``<token>:<index>``: the
delivery's short token and the choice's position among the decision's stored choices, never
the answer itself, so callback data stays within Telegram's 64 bytes. A choice that needs a
text input gets no button; the message says to answer it with ``piwf answer``. The decision's
request content is shown as given (bounded to the message limit). A press is answered with a
short notice (:data:`NOTICES`).
"""

from __future__ import annotations

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.protocol.channel_v1 import MAX_TEXT_CHARS
from piwf.state.channel_delivery import Presentation, Settlement
from piwf.state.enums import ResolutionOutcome, ResolutionProvenance

#: What a person who pressed a button is told, by the update's outcome.
NOTICES = {
    "won": "Answer recorded",
    "adopted": "Already recorded",
    "already_resolved": "This decision was already settled",
    "refused": "You are not allowed to answer here",
    "ignored": "Nothing to answer",
}

_WHO = {
    ResolutionProvenance.HUMAN: "answered by a person",
    ResolutionProvenance.CLIENT: "answered by a client",
    ResolutionProvenance.TIMEOUT_POLICY: "settled by its timeout default",
    ResolutionProvenance.EXPLICIT_CANCEL: "cancelled",
    ResolutionProvenance.EXPIRED_NO_DEFAULT: "expired without a default",
}


def render_delivery(presentation: Presentation) -> JsonValue:
    """The ``sendMessage`` request of a delivery (the wire form of ``PresentRequest``)."""
    decision = presentation.decision
    choices = decision.choices or {}
    lines = [f"Decision needed: {presentation.path}", f"Run {decision.run_id}"]
    request = (
        presentation.content.get("request") if isinstance(presentation.content, dict) else None
    )
    if request is not None:
        lines += ["", request if isinstance(request, str) else canonical.encode(request).decode()]
    needs_text = [name for name in choices if name in decision.inputs]
    if needs_text:
        lines += ["", "Needs a text, answer with piwf answer " + decision.decision_id + ":"]
        lines += [f"  {choices[name]} ({name})" for name in needs_text]
    buttons: list[JsonValue] = [
        {"text": label[:128] or name, "data": f"{presentation.token}:{index}"}
        for index, (name, label) in enumerate(choices.items())
        if name not in decision.inputs
    ]
    return {"method": "sendMessage", "text": _bounded("\n".join(lines)), "buttons": buttons}


def render_settlement(settlement: Settlement) -> JsonValue:
    """The ``editMessageText`` request that shows a decision's winner on its delivery."""
    decision = settlement.decision
    resolution = settlement.resolution
    who = _WHO.get(resolution.provenance, resolution.provenance.value)
    if resolution.outcome is ResolutionOutcome.ACCEPTED and isinstance(resolution.response, dict):
        name = str(resolution.response.get("choice", ""))
        label = (decision.choices or {}).get(name, name)
        text = f"Decided: {label} ({who})\nRun {decision.run_id}"
    else:
        text = f"Closed: {who}\nRun {decision.run_id}"
    return {
        "method": "editMessageText",
        "text": _bounded(text),
        "messageRef": settlement.message_ref,
    }


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"
