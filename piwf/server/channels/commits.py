"""What the channel adapters write: each duty's one transaction, fenced by the server's claim.

The adapters (:mod:`piwf.server.channels.adapters`) run the children, their frames and timers;
every durable change they make goes through :class:`ChannelCommits`::

    begin_epoch    an adapter starts: its next epoch (what the previous one left applying
                   becomes ambiguous) and the update offset it resumes from
    record_end     an adapter ended: its open attempts become ambiguous
    settle         an attempt's outcome, as the adapter reported it
    answer         an update from the chat, checked against the profile's allowed identities
                   and applied like ``decision.answer``
    claim_work     the sends a ready adapter owes: pending ones resumed, open decisions
                   presented, settled deliveries edited, each recorded before it is asked for

Every write verifies the server's claim first, in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from piwf import faults
from piwf.errors import PiwfError
from piwf.lifecycle import Conflict
from piwf.protocol.channel_v1 import AnswerFrame, SettleFrame
from piwf.server.channels.profiles import Profile
from piwf.server.channels.render import NOTICES, render_delivery, render_settlement
from piwf.state import StateDatabase
from piwf.state import channel_delivery as cd
from piwf.state import channels as channel_store
from piwf.state.enums import ActorType, ChannelAdapterType
from piwf.state.records import Actor
from piwf.state.server_epoch import ServerClaim, verify_server_claim

log = logging.getLogger("piwf.server")

#: The notice of an update that was not applied (the adapter relays it again).
NOT_RECORDED = "Not recorded, try again"


@dataclass(frozen=True)
class AnswerReply:
    """What the adapter is told about an update it passed on (``outcome`` of its response, the
    channel's ``revision``, the ``notice`` shown in the chat), and the run a winning answer
    settled a decision of (``None`` otherwise)."""

    outcome: Literal["accepted", "rejected"]
    revision: int
    notice: str
    run_id: str | None = None


@dataclass(frozen=True)
class ChannelCommits:
    """The channel adapters' writes to the state database, on behalf of one server process."""

    db: StateDatabase
    server_claim: Callable[[], ServerClaim]

    @property
    def actor(self) -> Actor:
        """Who the server's channel changes are recorded as."""
        return Actor(ActorType.SERVER, self.server_claim().server_id)

    def begin_epoch(self, profile: str) -> cd.AdapterStart:
        """Take ``profile``'s next adapter epoch; raises :class:`PiwfError` when it cannot."""
        with self.db.write() as tx:
            verify_server_claim(tx, self.server_claim())
            return cd.start_adapter(tx, ChannelAdapterType.TELEGRAM, profile, actor=self.actor)

    def record_end(self, profile: str, channel_id: str, epoch: int) -> None:
        """Record that the adapter of ``epoch`` ended; log each send it left ambiguous (a
        failure to record is logged too: the next epoch's start interrupts them instead)."""
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                interrupted = cd.adapter_ended(tx, channel_id, epoch, actor=self.actor)
        except PiwfError as error:
            log.warning("channel %s: recording its adapter's end failed: %s", channel_id, error)
            interrupted = []
        for effect_id in interrupted:
            log.warning(
                "channel %s: send %s was in flight when its adapter ended: ambiguous "
                "(check the chat, then piwf channel recover %s confirm|retry)",
                profile,
                effect_id,
                effect_id,
            )

    def settle(self, profile: str, channel_id: str, frame: SettleFrame) -> bool:
        """Settle the attempt ``frame`` reports; return whether it was recorded (a refusal or
        a failed write is logged and leaves the attempt as it was)."""
        result = None if frame.result is None else frame.result.model_dump(by_alias=True)
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                settled = cd.settle_attempt(
                    tx,
                    channel_id=channel_id,
                    epoch=frame.adapter_epoch,
                    attempt_id=frame.attempt_id,
                    expected_revision=frame.expected_revision,
                    outcome=frame.outcome,
                    result=result,
                    error=frame.error,
                    actor=self.actor,
                )
        except PiwfError as error:
            log.warning("channel %s: settling %s failed: %s", profile, frame.attempt_id, error)
            return False
        if isinstance(settled, Conflict):
            log.warning("channel %s: refused a settle: %s", profile, settled.evidence)
            return False
        if frame.outcome != "applied":
            log.warning(
                "channel %s: %s %s: %s",
                profile,
                frame.attempt_id,
                "rejected" if frame.outcome == "rejected" else "ambiguous",
                frame.error or "no detail",
            )
        return True

    def answer(
        self, profile: Profile, channel_id: str, revision: int, frame: AnswerFrame
    ) -> AnswerReply:
        """Apply the update ``frame`` carries (``revision``: the channel's, as the adapter
        last knew it). The server checks the identity itself: the adapter's word is not
        enough. The reply is built once the transaction committed: a refused update is
        answered ``rejected`` with the channel's current revision; a failed write (the claim
        lost, the database busy, full or failing) is logged and answered ``rejected`` with
        ``revision`` and no run, since nothing of the update was stored. A rejected update is
        relayed again by the adapter; its cursor did not move, so that retry is applied."""
        update = frame.update
        allowed = update.allowed and profile.identity_allowed(update.identity)
        try:
            with self.db.write() as tx:
                verify_server_claim(tx, self.server_claim())
                applied = cd.apply_update(
                    tx,
                    channel_id=channel_id,
                    epoch=frame.adapter_epoch,
                    expected_revision=frame.expected_revision,
                    update_id=update.update_id,
                    identity=update.identity,
                    allowed=allowed,
                    data=update.data if allowed else None,
                    submission_id=f"{channel_id}:update-{update.update_id}",
                )
                if isinstance(applied, Conflict):
                    channel = channel_store.get_channel(tx, channel_id)
                    revision = channel_store.current_revision(tx, channel)  # type: ignore[arg-type]
                faults.point("channel.before_answer_commit")
        except PiwfError as error:
            log.warning(
                "channel %s: update %d was not recorded (the adapter relays it again): %s",
                profile.name,
                update.update_id,
                error,
            )
            return AnswerReply("rejected", revision, NOT_RECORDED)
        if isinstance(applied, Conflict):
            log.warning("channel %s: refused an update: %s", profile.name, applied.evidence)
            return AnswerReply("rejected", revision, NOT_RECORDED)
        result = applied.value
        notice = NOTICES.get(result.outcome, "Not recorded")
        if result.outcome == "rejected":
            notice = (result.reason or "Not recorded")[:200]
        if result.outcome == "refused":
            log.warning(
                "channel %s: refused an answer from an identity that is not allowed "
                "(update %d; the decision stays open)",
                profile.name,
                update.update_id,
            )
        run_id = result.run_id if result.outcome == "won" else None
        return AnswerReply("accepted", result.revision, notice, run_id)

    def claim_work(self, channel_id: str, epoch: int) -> list[cd.Work]:
        """Record the attempts the adapter of ``epoch`` owes (resumed, presented, edited) and
        return them, committed; an idle channel is read without taking the write lock."""
        with self.db.read() as tx:
            undelivered = channel_store.undelivered_decisions(tx, channel_id)
            unedited = channel_store.unedited_deliveries(tx, channel_id)
            channel = channel_store.get_channel(tx, channel_id)
            pending = channel is not None and any(
                effect.status.value == "pending" for effect in cd.open_effects(tx, channel)
            )
        if not (undelivered or unedited or pending):
            return []
        work: list[cd.Work] = []
        with self.db.write() as tx:
            verify_server_claim(tx, self.server_claim())
            work += cd.resume_pending(tx, channel_id, epoch, actor=self.actor)
            for decision_id in undelivered:
                found = cd.deliver(
                    tx, channel_id, epoch, decision_id, render=render_delivery, actor=self.actor
                )
                if isinstance(found, cd.Work):
                    work.append(found)
            for delivery_id in unedited:
                edit = cd.edit_settled(
                    tx, channel_id, epoch, delivery_id, render=render_settlement, actor=self.actor
                )
                if isinstance(edit, cd.Work):
                    work.append(edit)
        return work
