"""Channel transitions: an adapter's epoch, its external attempts, the answers it relays.

The one module that composes the channel store (:mod:`piwf.state.channels`) with effects
(:mod:`piwf.state.effects`) and decision answers (:mod:`piwf.state.execution.answers`). Each
function runs inside the caller's ``BEGIN IMMEDIATE`` transaction and never commits::

    start_adapter     epoch + 1 (the old adapter is fenced); every attempt the previous adapter
                      left ``applying`` becomes ``ambiguous`` (never sent again by itself)
    deliver / edit    reserve the send (or edit) as a manual effect, record the channel message,
                      open attempt n (recorded before anything leaves the server) -> Work
    resume_pending    an effect an operator sent back to ``pending`` opens its next attempt
    settle_attempt    the adapter's result for exactly (epoch, effect, attempt, revision):
                      applied (message reference in the effect result), rejected, or
                      indeterminate (-> ambiguous)
    apply_update      one external update at the channel's expected revision: the cursor
                      advances, and an allowed identity's button press answers the decision as
                      ``decision.answer`` does (provenance human, actor ``telegram:<id>``)
    adapter_ended     the adapter of ``epoch`` is gone: its open attempts become ambiguous
    recover           the operator's ``confirm`` (it was sent) or ``retry`` (send again)
    resend_refused    a reload's new send of each delivery the API refused (known not posted)
                      whose decision is open, at most ``MAX_RESENDS`` times each

A stale adapter (another epoch) or a stale attempt (another attempt number or effect revision)
is a :class:`~piwf.lifecycle.Conflict` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from piwf.canonical import JsonValue
from piwf.lifecycle import Adopted, Applied, Conflict, EffectStatus
from piwf.state import blobs
from piwf.state import channels as store
from piwf.state import decisions as decision_store
from piwf.state import effects as fx
from piwf.state.channels import ChannelMessage, ChannelRow
from piwf.state.database import Transaction
from piwf.state.decisions import Decision, Resolution
from piwf.state.enums import (
    ActorType,
    ChannelAdapterType,
    ChannelMessagePurpose,
    ChannelMessageStatus,
    EffectOwnerScope,
    EffectRecovery,
    SubmissionSource,
)
from piwf.state.execution import requests
from piwf.state.execution.answers import answer_request
from piwf.state.records import Actor, record_change

#: The cursor of the external update stream (Telegram's ``getUpdates`` offset).
UPDATE_OFFSET = "updateOffset"
#: Effect types of the external work.
SEND = "channel.send"
EDIT = "channel.edit"

#: How many times a reload sends a refused delivery again (its first send not counted).
MAX_RESENDS = 5
_RESEND = ":resend-"

UpdateOutcome = Literal["won", "adopted", "already_resolved", "rejected", "refused", "ignored"]


@dataclass(frozen=True)
class AdapterStart:
    """A new adapter epoch: what its launch carries."""

    channel: ChannelRow
    epoch: int
    revision: int
    offset: int
    interrupted: tuple[str, ...]


@dataclass(frozen=True)
class Work:
    """One external attempt to hand to the adapter (``channel.present``)."""

    effect_id: str
    attempt: int
    revision: int
    request: JsonValue
    message_id: str

    @property
    def attempt_id(self) -> str:
        """The stable id of this attempt."""
        return f"{self.effect_id}#{self.attempt}"


@dataclass(frozen=True)
class Presentation:
    """What a delivery shows: the decision, its request content and the delivery's token."""

    decision: Decision
    content: JsonValue
    path: str
    token: str


@dataclass(frozen=True)
class Settlement:
    """What an edit shows: the delivery's message reference and the winner."""

    decision: Decision
    resolution: Resolution
    message_ref: JsonValue


@dataclass(frozen=True)
class UpdateResult:
    """What one external update did; ``revision`` is the channel's revision after it."""

    revision: int
    outcome: UpdateOutcome
    run_id: str | None = None
    reason: str | None = None
    choice: str | None = None


def adapter_owner(channel_id: str, epoch: int) -> str:
    """The owner id an adapter's attempts record (``adapter:telegram:ops@3``)."""
    return f"adapter:{channel_id}@{epoch}"


def start_adapter(
    tx: Transaction, adapter_type: ChannelAdapterType, profile_key: str, *, actor: Actor
) -> AdapterStart:
    """Take the profile's next adapter epoch; what the previous adapter left applying becomes
    ambiguous (that adapter is gone, and nothing proves what it sent)."""
    channel = store.ensure_channel(tx, adapter_type, profile_key)
    interrupted = _interrupt_applying(tx, channel, actor)
    channel = store.get_channel(tx, channel.channel_id) or channel
    epoch = store.advance_epoch(tx, channel)
    change = record_change(
        tx, channel.resource_id, channel.revision, "channel.adapter_started", actor,
        payload={"epoch": epoch},
    )  # fmt: skip
    offset = store.read_cursor(tx, channel.channel_id, UPDATE_OFFSET)
    fresh = store.get_channel(tx, channel.channel_id)
    assert fresh is not None
    return AdapterStart(
        channel=fresh,
        epoch=epoch,
        revision=change.revision,
        offset=int(offset) if offset is not None else 0,
        interrupted=interrupted,
    )


def fence(tx: Transaction, channel_id: str, epoch: int) -> ChannelRow | Conflict:
    """The channel when ``epoch`` is its current adapter epoch, else why not."""
    channel = store.get_channel(tx, channel_id)
    if channel is None:
        return Conflict(f"no channel {channel_id}")
    if channel.adapter_epoch != epoch:
        return Conflict(f"stale adapter: epoch {epoch}, current {channel.adapter_epoch}")
    return channel


def deliver(
    tx: Transaction,
    channel_id: str,
    epoch: int,
    decision_id: str,
    *,
    render: Callable[[Presentation], JsonValue],
    actor: Actor,
) -> Work | Conflict | None:
    """Present an open protected decision on the channel: reserve the send, record the
    delivery and open attempt 1. None when the decision is no longer open or already has a
    delivery here."""
    channel = fence(tx, channel_id, epoch)
    if isinstance(channel, Conflict):
        return channel
    decision = decision_store.get_decision(tx, decision_id)
    request = requests.get_request(tx, decision_id)
    if decision is None or request is None or not decision.protected:
        return None
    if decision_store.get_resolution(tx, decision_id) is not None:
        return None
    purpose = ChannelMessagePurpose.DELIVERY
    if store.find_message(tx, channel_id, decision_id, purpose) is not None:
        return None
    token = store.new_token()
    content = blobs.read_json(tx, request.content_hash)
    payload = render(Presentation(decision, content, request.path, token))
    return _reserve_and_begin(tx, channel, epoch, decision_id, purpose, payload, token, actor)


def edit_settled(
    tx: Transaction,
    channel_id: str,
    epoch: int,
    delivery_id: str,
    *,
    render: Callable[[Settlement], JsonValue],
    actor: Actor,
) -> Work | Conflict | None:
    """Show a settled decision's winner on its delivered message: reserve the edit, record the
    settlement and open attempt 1. A delivery without a message reference (an operator
    confirmed it by hand) gets a settlement whose edit is rejected at once (nothing to edit);
    None when there is nothing to do."""
    channel = fence(tx, channel_id, epoch)
    if isinstance(channel, Conflict):
        return channel
    delivery = store.get_message(tx, delivery_id)
    if delivery is None or delivery.decision_id is None:
        return None
    purpose = ChannelMessagePurpose.SETTLEMENT
    if store.find_message(tx, channel_id, delivery.decision_id, purpose) is not None:
        return None
    decision = decision_store.get_decision(tx, delivery.decision_id)
    resolution = decision_store.get_resolution(tx, delivery.decision_id)
    sent = fx.get_effect(tx, delivery.effect_id)
    if decision is None or resolution is None or sent is None:
        return None
    reference = None if sent.result_hash is None else blobs.read_json(tx, sent.result_hash)
    payload = render(Settlement(decision, resolution, reference))
    work = _reserve_and_begin(
        tx, channel, epoch, delivery.decision_id, purpose, payload, None, actor
    )
    if reference is None:
        fx.settle_effect(
            tx,
            work.effect_id,
            attempt_number=work.attempt,
            outcome="rejected",
            actor=actor,
            error="the delivery has no message reference to edit",
        )
        store.set_message_status(tx, work.message_id, ChannelMessageStatus.FAILED)
        return None
    return work


def resume_pending(tx: Transaction, channel_id: str, epoch: int, *, actor: Actor) -> list[Work]:
    """Open the next attempt of each of the channel's ``pending`` effects (an operator's
    retry): attempt n + 1, recorded before the adapter is asked."""
    channel = fence(tx, channel_id, epoch)
    if isinstance(channel, Conflict):
        return []
    found = []
    for effect in fx.list_unsettled_effects(tx, channel.resource_id):
        if effect.status is not EffectStatus.PENDING:
            continue
        message = store.message_of_effect(tx, effect.effect_id)
        if message is None:
            continue
        found.append(_begin(tx, channel, epoch, effect.effect_id, message, actor))
    return found


def settle_attempt(
    tx: Transaction,
    *,
    channel_id: str,
    epoch: int,
    attempt_id: str,
    expected_revision: int,
    outcome: Literal["applied", "rejected", "indeterminate"],
    result: JsonValue = None,
    error: str | None = None,
    actor: Actor,
) -> Applied[fx.Effect] | Adopted[fx.Effect] | Conflict:
    """Record the adapter's result of exactly one open attempt.

    Refused (:class:`Conflict`, nothing written) for another epoch than the channel's current
    one, an attempt id that is not the effect's open attempt, or an effect revision other than
    ``expected_revision`` (the attempt was recovered or replaced meanwhile).
    """
    channel = fence(tx, channel_id, epoch)
    if isinstance(channel, Conflict):
        return channel
    effect_id, _, number = attempt_id.rpartition("#")
    effect = fx.get_effect(tx, effect_id)
    message = store.message_of_effect(tx, effect_id)
    if effect is None or message is None or effect.source_resource_id != channel.resource_id:
        return Conflict(f"stale attempt: no attempt {attempt_id} on {channel_id}")
    if (
        effect.status is not EffectStatus.APPLYING
        or str(effect.attempt_count) != number
        or effect.revision != expected_revision
    ):
        return Conflict(
            f"stale attempt: {attempt_id} at revision {expected_revision}; the effect is "
            f"{effect.status.value} at attempt {effect.attempt_count}, revision {effect.revision}"
        )
    if outcome == "indeterminate":
        record_change(tx, effect.resource_id, effect.revision, "effect.ambiguous", actor)
        error_hash = None if error is None else blobs.put_text(tx, error)
        fx.close_ambiguous(tx, effect_id, effect.attempt_count, error_hash)
        store.set_message_status(tx, message.message_id, ChannelMessageStatus.AMBIGUOUS)
        return Applied(_effect(tx, effect_id))
    settled = fx.settle_effect(
        tx,
        effect_id,
        attempt_number=effect.attempt_count,
        outcome=outcome,
        actor=actor,
        result=result if outcome == "applied" else None,
        error=error,
        external_ref=_external_ref(result) if outcome == "applied" else None,
    )
    if isinstance(settled, Conflict):
        return settled
    status = ChannelMessageStatus.CONFIRMED if outcome == "applied" else ChannelMessageStatus.FAILED
    store.set_message_status(tx, message.message_id, status)
    return settled


def apply_update(
    tx: Transaction,
    *,
    channel_id: str,
    epoch: int,
    expected_revision: int,
    update_id: int,
    identity: str | None,
    allowed: bool,
    data: str | None,
    submission_id: str,
) -> Applied[UpdateResult] | Adopted[UpdateResult] | Conflict:
    """Apply one external update at the channel's ``expected_revision``.

    The cursor moves past ``update_id`` and the channel's revision bumps once, whatever the
    update was: a press on a delivery's button by an allowed identity answers its decision
    through the same transition as ``decision.answer`` (source human, the identity as actor);
    an identity that is not allowed is ``refused`` and recorded in the channel's event without
    the answer (the decision stays open); anything else is ``ignored`` or ``rejected``. An
    update at or behind the cursor is :class:`Adopted` (applied before; nothing written).
    """
    channel = fence(tx, channel_id, epoch)
    if isinstance(channel, Conflict):
        return channel
    if channel.revision != expected_revision:
        return Conflict(f"stale channel revision: {expected_revision}, current {channel.revision}")
    stored = store.read_cursor(tx, channel_id, UPDATE_OFFSET)
    if stored is not None and update_id < int(stored):
        return Adopted(UpdateResult(channel.revision, "ignored", reason="already applied"))
    store.write_cursor(tx, channel_id, UPDATE_OFFSET, str(update_id + 1))
    result = _answer(tx, channel, identity, allowed, data, submission_id)
    event: dict[str, JsonValue] = {"updateId": update_id, "outcome": result.outcome}
    if result.reason is not None:
        event["reason"] = result.reason
    change = record_change(
        tx,
        channel.resource_id,
        channel.revision,
        "channel.update",
        Actor(ActorType.CHANNEL, identity),
        payload=event,
    )
    return Applied(
        UpdateResult(change.revision, result.outcome, result.run_id, result.reason, result.choice)
    )


def adapter_ended(tx: Transaction, channel_id: str, epoch: int, *, actor: Actor) -> list[str]:
    """The adapter of ``epoch`` is gone: its open attempts become ambiguous (returns their
    effect ids). Nothing happens for an epoch that is no longer current."""
    channel = fence(tx, channel_id, epoch)
    if isinstance(channel, Conflict):
        return []
    return list(_interrupt_applying(tx, channel, actor))


def recover(
    tx: Transaction, effect_id: str, action: Literal["confirm", "retry"], *, actor: Actor
) -> Applied[fx.Effect] | Adopted[fx.Effect] | Conflict | None:
    """Apply the operator's resolution of an ambiguous channel effect: ``confirm`` (it reached
    the chat: applied) or ``retry`` (back to pending: the adapter sends it again, as a new
    attempt). None when ``effect_id`` is no channel effect."""
    effect = fx.get_effect(tx, effect_id)
    message = store.message_of_effect(tx, effect_id)
    if effect is None or message is None or effect.owner_scope is not EffectOwnerScope.CHANNEL:
        return None
    resolution: Literal["applied", "retry"] = "applied" if action == "confirm" else "retry"
    result = fx.resolve_ambiguous(tx, effect_id, resolution=resolution, actor=actor)
    if isinstance(result, Applied):
        status = (
            ChannelMessageStatus.CONFIRMED if action == "confirm" else ChannelMessageStatus.PENDING
        )
        store.set_message_status(tx, message.message_id, status)
    return result


def resend_refused(tx: Transaction, channel_id: str, *, actor: Actor) -> list[str]:
    """Give each delivery the API refused whose decision is still open one new send (a new
    ``pending`` effect with the same message, under the key ``delivery:<id>:resend-<n>``),
    unless it was sent again ``MAX_RESENDS`` times already; return their decision ids.

    Safe to send again: a refused send (``rejected``) is known not to have been posted. An
    ambiguous one is never touched (only the operator's ``recover`` resolves it), nor is a
    refused edit. The refused effect stays as it was (history)."""
    channel = store.get_channel(tx, channel_id)
    if channel is None:
        return []
    resent = []
    for message in store.failed_open_deliveries(tx, channel_id, limit=256):
        refused = fx.get_effect(tx, message.effect_id)
        if refused is None or refused.status is not EffectStatus.REJECTED:
            continue
        count = resends_of(refused)
        if count >= MAX_RESENDS:
            continue
        reserved = fx.reserve_effect(
            tx,
            source_resource_id=channel.resource_id,
            source_revision=channel.revision,
            effect_type=SEND,
            idempotency_key=f"{message.purpose.value}:{message.decision_id}{_RESEND}{count + 1}",
            payload=blobs.read_json(tx, refused.payload_hash),
            recovery=EffectRecovery.MANUAL,
            owner_scope=EffectOwnerScope.CHANNEL,
            actor=actor,
        )
        if not isinstance(reserved, Applied):
            raise LookupError(f"resend of {message.effect_id}: {reserved}")  # a damaged state
        if store.resend_message(tx, message.message_id, reserved.value.effect_id):
            resent.append(str(message.decision_id))
    return resent


def resends_of(effect: fx.Effect) -> int:
    """How many times the delivery ``effect`` belongs to was sent again (0: its first send)."""
    _, marker, count = effect.idempotency_key.rpartition(_RESEND)
    return int(count) if marker and count.isdigit() else 0


def open_effects(tx: Transaction, channel: ChannelRow) -> list[fx.Effect]:
    """The channel's effects that are not settled (pending, applying, ambiguous)."""
    return fx.list_unsettled_effects(tx, channel.resource_id)


# -- internals --------------------------------------------------------------------------------


def _answer(
    tx: Transaction,
    channel: ChannelRow,
    identity: str | None,
    allowed: bool,
    data: str | None,
    submission_id: str,
) -> UpdateResult:
    if identity is not None and not allowed:
        return UpdateResult(0, "refused", reason="the identity is not allowed on this channel")
    if data is None or identity is None:
        return UpdateResult(0, "ignored")
    token, _, index_text = data.partition(":")
    message = store.message_by_token(tx, channel.channel_id, token)
    decision = None
    if message is not None and message.decision_id is not None:
        decision = decision_store.get_decision(tx, message.decision_id)
    if decision is None or not index_text.isdigit():
        return UpdateResult(0, "rejected", reason="the button belongs to no open decision")
    names = list(decision.choices or {})
    index = int(index_text)
    if index >= len(names):
        return UpdateResult(0, "rejected", reason="the button names no declared choice")
    choice = names[index]
    if choice in decision.inputs:
        return UpdateResult(0, "rejected", reason=f"{choice} needs a text: use piwf answer")
    answered = answer_request(
        tx,
        decision.decision_id,
        {"choice": choice},
        source=SubmissionSource.HUMAN,
        actor=Actor(ActorType.HUMAN, identity),
        submission_id=submission_id,
    )
    if answered is None:
        return UpdateResult(0, "rejected", reason="the decision no longer exists")
    if isinstance(answered, Conflict):
        return UpdateResult(0, "rejected", decision.run_id, answered.evidence)
    outcome = answered.value
    won: UpdateOutcome = outcome.outcome.value
    return UpdateResult(0, won, outcome.run_id, outcome.reason, choice)


def _reserve_and_begin(
    tx: Transaction,
    channel: ChannelRow,
    epoch: int,
    decision_id: str,
    purpose: ChannelMessagePurpose,
    payload: JsonValue,
    token: str | None,
    actor: Actor,
) -> Work:
    reserved = fx.reserve_effect(
        tx,
        source_resource_id=channel.resource_id,
        source_revision=channel.revision,
        effect_type=SEND if purpose is ChannelMessagePurpose.DELIVERY else EDIT,
        idempotency_key=f"{purpose.value}:{decision_id}",
        payload=payload,
        recovery=EffectRecovery.MANUAL,
        owner_scope=EffectOwnerScope.CHANNEL,
        actor=actor,
    )
    if isinstance(reserved, Conflict):
        raise LookupError(reserved.evidence)  # the message row is missing: a damaged state
    message = store.insert_message(
        tx,
        channel_id=channel.channel_id,
        decision_id=decision_id,
        purpose=purpose,
        effect_id=reserved.value.effect_id,
        token=token,
    )
    return _begin(tx, channel, epoch, reserved.value.effect_id, message, actor)


def _begin(
    tx: Transaction,
    channel: ChannelRow,
    epoch: int,
    effect_id: str,
    message: ChannelMessage,
    actor: Actor,
) -> Work:
    begun = fx.begin_attempt(
        tx,
        effect_id,
        owner_id=adapter_owner(channel.channel_id, epoch),
        lease_generation=store.next_attempt_generation(tx, channel.channel_id),
        actor=actor,
    )
    if not isinstance(begun, Applied):
        raise LookupError(f"effect {effect_id} cannot begin an attempt: {begun}")
    effect = begun.value
    return Work(
        effect_id=effect_id,
        attempt=effect.attempt_count,
        revision=effect.revision,
        request=blobs.read_json(tx, effect.payload_hash),
        message_id=message.message_id,
    )


def _interrupt_applying(tx: Transaction, channel: ChannelRow, actor: Actor) -> tuple[str, ...]:
    interrupted = []
    for effect in fx.list_unsettled_effects(tx, channel.resource_id):
        if effect.status is not EffectStatus.APPLYING:
            continue
        fx.recover_uncertain(tx, effect.effect_id, actor=actor)  # manual: ambiguous
        message = store.message_of_effect(tx, effect.effect_id)
        if message is not None:
            store.set_message_status(tx, message.message_id, ChannelMessageStatus.AMBIGUOUS)
        interrupted.append(effect.effect_id)
    return tuple(interrupted)


def _external_ref(result: JsonValue) -> str | None:
    if isinstance(result, dict):
        chat, message = result.get("chatId"), result.get("messageId")
        if chat is not None and message is not None:
            return f"{chat}:{message}"
    return None


def _effect(tx: Transaction, effect_id: str) -> fx.Effect:
    found = fx.get_effect(tx, effect_id)
    assert found is not None
    return found
