"""The ``channel.*`` operations.

==================  =======  ===================================================================
operation           kind     what it does
==================  =======  ===================================================================
channel.status      read     profiles, each adapter's state (``degraded`` while its API
                             fails, and why), pid and epoch, pending and ambiguous sends (no
                             credential, chat id or answer)
channel.reload      durable  re-read ``channels.json``; start, restart and stop adapters, and
                             send again each refused delivery of an open decision of a kept
                             profile (bounded); an unusable file is ``rejected`` and changes
                             nothing
channel.recover     durable  the operator's resolution of an ambiguous send: ``confirm`` (it
                             reached the chat) or ``retry`` (a new attempt; a duplicate is
                             possible)
==================  =======  ===================================================================
"""

from __future__ import annotations

from piwf.errors import PiwfError, RunCommandError
from piwf.lifecycle import Conflict, EffectStatus
from piwf.protocol.channel_payloads import (
    ChannelProfileFailure,
    ChannelProfileInfo,
    ChannelRecoverPayload,
    ChannelRecoverReceipt,
    ChannelSendInfo,
    ChannelStatus,
)
from piwf.protocol.client_v1 import Request
from piwf.protocol.payloads import EmptyPayload
from piwf.server.channels.adapters import ChannelAdapters
from piwf.server.channels.profiles import ChannelConfigError, config_path
from piwf.server.commands import CommandResult
from piwf.server.context import ServerContext
from piwf.server.loop import Reply
from piwf.server.replies import effect_info, ok, payload_of, unknown_channel_send
from piwf.state import Transaction, blobs
from piwf.state import channel_delivery as cd
from piwf.state import channels as channel_store
from piwf.state import effects as fx
from piwf.state.enums import ActorType, ChannelAdapterType
from piwf.state.records import Actor

#: How much of an API's refusal status shows (the adapter keeps its reports short already).
MAX_ERROR_CHARS = 300


class UnknownChannelEffectError(PiwfError):
    """The recovery names no send or edit of a channel."""

    code = "channelEffectNotFound"


class ChannelHandlers:
    """The channel operations over the server's adapters."""

    def __init__(self, context: ServerContext, adapters: ChannelAdapters) -> None:
        self.context = context
        self.adapters = adapters

    def status(self, request: Request, reply: Reply) -> None:
        payload_of(request, EmptyPayload)
        profiles = []
        with self.context.db.read() as tx:
            for name, adapter in sorted(self.adapters.adapters.items()):
                channel = channel_store.get_channel(
                    tx, channel_store.channel_id_for(ChannelAdapterType.TELEGRAM, name)
                )
                effects = [] if channel is None else cd.open_effects(tx, channel)
                ambiguous = []
                for effect in effects:
                    if effect.status is not EffectStatus.AMBIGUOUS:
                        continue
                    message = channel_store.message_of_effect(tx, effect.effect_id)
                    decision_id = None if message is None else message.decision_id
                    ambiguous.append(_send_info(effect, decision_id))
                failed = [] if channel is None else self._failed(tx, channel.channel_id)
                profiles.append(
                    ChannelProfileInfo(
                        profile=name,
                        kind="telegram",
                        state=adapter.state,
                        since=adapter.since or None,
                        pid=adapter.pid,
                        epoch=adapter.epoch or None,
                        error=adapter.error,
                        problem=adapter.problem,
                        pending_sends=sum(
                            e.status in (EffectStatus.PENDING, EffectStatus.APPLYING)
                            for e in effects
                        ),
                        ambiguous=ambiguous,
                        failed=failed,
                    )
                )
        status = ChannelStatus(
            config_file=str(config_path(self.context.home)),
            config_error=self.adapters.config_error,
            profiles=profiles,
        )
        reply(ok(request, status))

    @staticmethod
    def _failed(tx: Transaction, channel_id: str) -> list[ChannelSendInfo]:
        """The channel's refused deliveries of decisions that are still open."""
        found = []
        for message in channel_store.failed_open_deliveries(tx, channel_id):
            effect = fx.get_effect(tx, message.effect_id)
            if effect is None:
                continue
            error = None if effect.error_hash is None else blobs.read_text(tx, effect.error_hash)
            left = max(0, cd.MAX_RESENDS - cd.resends_of(effect))
            found.append(_send_info(effect, message.decision_id, error, resends_left=left))
        return found

    def reload(self, request: Request, reply: Reply) -> None:
        """Reload once per idempotency key: a retry gets the stored report back. A file that
        cannot be used is ``rejected`` (``channelConfig``, naming the file and what is wrong)
        and changes nothing. Each refused delivery of an open decision on a profile that stays
        configured is sent again (:func:`~piwf.state.channel_delivery.resend_refused`)."""
        payload_of(request, EmptyPayload)
        earlier = self.context.commands.lookup(request)
        if earlier is not None:
            reply(earlier)
            return
        try:
            receipt = self.adapters.reload()
        except ChannelConfigError as error:
            reply(self.context.commands.store(request, CommandResult.failed("rejected", error)))
            return
        actor = Actor(ActorType.HUMAN, request.client_id)
        kept = receipt.started + receipt.restarted + receipt.unchanged
        resent: list[str] = []

        def resend(tx: Transaction) -> CommandResult:
            # A reload is when the operator has fixed what the API refused (the chat id, the
            # bot's membership): each such delivery gets one more send, never a duplicate.
            for name in kept:
                channel_id = channel_store.channel_id_for(ChannelAdapterType.TELEGRAM, name)
                resent.extend(cd.resend_refused(tx, channel_id, actor=actor))
            update = {"resent": resent, "failed": self._failed_to_start(kept)}
            return CommandResult.accepted(receipt.model_copy(update=update).to_wire())

        reply(self.context.commands.execute(request, resend))
        if resent:
            self.adapters.nudge()  # sent as soon as its adapter is ready

    def _failed_to_start(self, names: list[str]) -> list[ChannelProfileFailure]:
        """The profiles of ``names`` whose adapter failed to start, with why."""
        return [
            ChannelProfileFailure(profile=name, reason=adapter.error or "it failed to start")
            for name in sorted(names)
            if (adapter := self.adapters.adapters.get(name)) is not None
            and adapter.state == "failed"
        ]

    def recover(self, request: Request, reply: Reply) -> None:
        payload = payload_of(request, ChannelRecoverPayload)
        actor = Actor(ActorType.HUMAN, request.client_id)

        def change(tx: Transaction) -> CommandResult:
            result = cd.recover(tx, payload.effect_id, payload.action, actor=actor)
            if result is None:
                error = UnknownChannelEffectError(
                    unknown_channel_send(payload.effect_id, self.context.home)
                )
                return CommandResult.failed("notFound", error)
            if isinstance(result, Conflict):
                # The effects' own evidence points at a run's effects; name the channel's list.
                state = result.evidence.partition(":")[0]
                settled = RunCommandError(
                    f"{payload.effect_id}: {state}: there is nothing to recover (only a send "
                    "that may or may not have reached the chat takes confirm or retry; piwf "
                    "channel status lists them)"
                )
                return CommandResult.failed("rejected", settled)
            receipt = ChannelRecoverReceipt(effect=effect_info(result.value), action=payload.action)
            return CommandResult.accepted(receipt.to_wire())

        response = self.context.commands.execute(request, change)
        reply(response)
        if response.outcome in ("accepted", "adopted"):
            self.adapters.nudge()  # a retry is sent now, as a new attempt


def _send_info(
    effect: fx.Effect,
    decision_id: str | None,
    error: str | None = None,
    *,
    resends_left: int | None = None,
) -> ChannelSendInfo:
    """What status shows of one send or edit (an error cut to ``MAX_ERROR_CHARS``)."""
    return ChannelSendInfo(
        effect_id=effect.effect_id,
        effect_type=effect.effect_type,
        status=effect.status.value,
        attempt_count=effect.attempt_count,
        decision_id=decision_id,
        error=None if error is None else error[:MAX_ERROR_CHARS],
        resends_left=resends_left,
    )
