"""The channel methods of :class:`piwf.client.Client` (``channel.*`` operations).

Kept in their own module like the other operation groups; ``Client`` inherits them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from piwf.client.arguments import build_payload
from piwf.client.calls import ClientCalls
from piwf.protocol.payloads import EmptyPayload

if TYPE_CHECKING:
    from piwf.protocol.channel_payloads import (
        ChannelRecoverReceipt,
        ChannelReloadReceipt,
        ChannelStatus,
    )

_R = TypeVar("_R", bound=BaseModel)


class ChannelMethods(ClientCalls):
    """``Client`` methods for channel adapters (see docs/CHANNELS.md)."""

    def channel_status(self) -> ChannelStatus:
        """The channel profiles, their adapters and their unsettled sends (``channel.status``)."""
        from piwf.protocol.channel_payloads import ChannelStatus

        return self._call("channel.status", EmptyPayload(), ChannelStatus)

    def reload_channels(self, *, idempotency_key: str | None = None) -> ChannelReloadReceipt:
        """Re-read ``channels.json`` and restart the adapters whose profile changed.

        Raises :class:`~piwf.errors.RejectedError` with ``error_code`` ``channelConfig`` when
        the file cannot be used (its message names the file and what is wrong); nothing
        changes then: the running adapters keep the last valid configuration.
        """
        from piwf.protocol.channel_payloads import ChannelReloadReceipt

        return self._call(
            "channel.reload", EmptyPayload(), ChannelReloadReceipt, idempotency_key=idempotency_key
        )

    def recover_channel_send(
        self, effect_id: str, action: str, *, idempotency_key: str | None = None
    ) -> ChannelRecoverReceipt:
        """Resolve an ambiguous channel send after checking the chat: ``confirm`` (it arrived)
        or ``retry`` (send it again as a new attempt; a duplicate message is possible)."""
        from piwf.protocol.channel_payloads import ChannelRecoverPayload, ChannelRecoverReceipt

        payload = build_payload(ChannelRecoverPayload, effect_id=effect_id, action=action)
        return self._call(
            "channel.recover", payload, ChannelRecoverReceipt, idempotency_key=idempotency_key
        )
