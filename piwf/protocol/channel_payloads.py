"""Payloads and receipts of the ``channel.*`` operations of ``piwf.client.v1``::

    operation        payload                       receipt
    channel.status   {}                            ChannelStatus
    channel.reload   {}                            ChannelReloadReceipt
    channel.recover  {effectId, action}            ChannelRecoverReceipt

No field ever holds a credential, a chat id or an answer: status shows profiles, their adapter
process and the sends that are pending, ambiguous, or failed while their decision is open.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from piwf.protocol.channel_v1 import ApiProblem
from piwf.protocol.client_v1 import OpaqueId
from piwf.protocol.payloads import EffectInfo, WireModel


class ChannelSendInfo(WireModel):
    """One external send or edit that is not settled."""

    effect_id: str
    effect_type: str
    status: str
    attempt_count: int
    decision_id: str | None = None
    #: Why the API refused it (a failed delivery): the method and the API's own description.
    error: str | None = None
    #: How many more times ``channel.reload`` sends a failed delivery again (0: never again).
    resends_left: int | None = None


class ChannelProfileInfo(WireModel):
    """One configured profile and its adapter child.

    ``state`` is ``starting``, ``ready``, ``degraded`` (it runs but its API fails: ``problem``
    says how, ``error`` what to do), ``failed``, ``exited``, ``stopping`` or ``stopped``;
    ``since`` when it entered that state (epoch milliseconds).
    """

    profile: str
    kind: str
    state: str
    since: int | None = None
    pid: int | None = None
    epoch: int | None = None
    error: str | None = None
    problem: ApiProblem | None = None
    pending_sends: int = 0
    ambiguous: list[ChannelSendInfo] = Field(default_factory=list)
    #: Deliveries the API refused whose decision is still open: the chat does not show those
    #: decisions; a reload sends each again (``resends_left``), ``piwf answer`` answers it.
    failed: list[ChannelSendInfo] = Field(default_factory=list)


class ChannelStatus(WireModel):
    """Receipt of channel.status: ``config_file`` is the full path of ``channels.json``;
    ``config_error`` what is wrong with it (the adapters shown keep the last valid
    configuration)."""

    config_file: str
    config_error: str | None = None
    profiles: list[ChannelProfileInfo]


class ChannelProfileFailure(WireModel):
    """A profile the reload keeps whose adapter could not start (its credential file is
    missing or holds no token, say): why, as ``piwf channel status`` shows it."""

    profile: str
    reason: str


class ChannelReloadReceipt(WireModel):
    """Receipt of channel.reload: which profiles were started, restarted, stopped, kept, and
    the open decisions whose refused delivery is sent again (a file that cannot be used is
    answered ``rejected`` with code ``channelConfig`` instead). ``failed``: the kept profiles
    whose adapter is not running for a reason the operator must fix (it is tried again with
    a back-off meanwhile)."""

    started: list[str]
    restarted: list[str]
    stopped: list[str]
    unchanged: list[str]
    resent: list[str] = Field(default_factory=list)
    failed: list[ChannelProfileFailure] = Field(default_factory=list)


class ChannelRecoverPayload(WireModel):
    """The operator's resolution of an ambiguous send, after checking the chat."""

    effect_id: OpaqueId
    action: Literal["confirm", "retry"]


class ChannelRecoverReceipt(WireModel):
    """Receipt of channel.recover."""

    effect: EffectInfo
    action: Literal["confirm", "retry"]
