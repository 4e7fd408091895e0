"""The channel store and its transitions: adapter epochs fence stale adapters, every external
send is a manual effect whose interrupted attempt becomes ambiguous, answers go through the
decision transition, the update cursor never lets an update apply twice."""

from __future__ import annotations

from typing import Any

from piwf.canonical import JsonValue
from piwf.lifecycle import Adopted, Applied, Conflict, EffectStatus
from piwf.state import StateDatabase
from piwf.state import channel_delivery as cd
from piwf.state import channels as store
from piwf.state import decisions as decision_store
from piwf.state import effects as fx
from piwf.state.enums import (
    ActorType,
    ChannelAdapterType,
    ChannelMessageStatus,
    ResolutionProvenance,
)
from piwf.state.records import Actor

from .test_decisions import answer, decision_flow, park
from .test_execution_support import violations

SERVER = Actor(ActorType.SERVER, "server-1")
CHANNEL = "telegram:ops"


def render(presentation: cd.Presentation) -> JsonValue:
    names = list(presentation.decision.choices or {})
    return {
        "method": "sendMessage",
        "text": presentation.path,
        "buttons": [{"text": n, "data": f"{presentation.token}:{i}"} for i, n in enumerate(names)],
    }


def render_edit(settlement: cd.Settlement) -> JsonValue:
    return {"method": "editMessageText", "messageRef": settlement.message_ref, "text": "done"}


def start(db: StateDatabase) -> cd.AdapterStart:
    with db.write() as tx:
        return cd.start_adapter(tx, ChannelAdapterType.TELEGRAM, "ops", actor=SERVER)


def deliver(db: StateDatabase, epoch: int, decision_id: str) -> cd.Work:
    with db.write() as tx:
        work = cd.deliver(tx, CHANNEL, epoch, decision_id, render=render, actor=SERVER)
    assert isinstance(work, cd.Work), work
    return work


def settle(db: StateDatabase, epoch: int, work: cd.Work, **kwargs: Any) -> Any:
    with db.write() as tx:
        return cd.settle_attempt(
            tx,
            channel_id=CHANNEL,
            epoch=epoch,
            attempt_id=work.attempt_id,
            expected_revision=work.revision,
            actor=SERVER,
            **{"outcome": "applied", "result": {"chatId": 7, "messageId": 70}, **kwargs},
        )


def press(db: StateDatabase, epoch: int, revision: int, update_id: int, **kwargs: Any) -> Any:
    with db.write() as tx:
        return cd.apply_update(
            tx,
            channel_id=CHANNEL,
            epoch=epoch,
            expected_revision=revision,
            update_id=update_id,
            submission_id=f"telegram:ops:{update_id}",
            **{"identity": "telegram:42", "allowed": True, "data": None, **kwargs},
        )


def effect_status(db: StateDatabase, effect_id: str) -> tuple[str, int]:
    with db.read() as tx:
        effect = fx.get_effect(tx, effect_id)
        assert effect is not None
        return effect.status.value, effect.attempt_count


# conformance: I9
def test_a_delivery_is_recorded_before_it_is_sent_and_a_stale_adapter_cannot_settle_it(
    db: StateDatabase,
) -> None:
    decision_id = park(db, decision_flow())
    first = start(db)
    work = deliver(db, first.epoch, decision_id)
    assert effect_status(db, work.effect_id) == ("applying", 1)
    token = work.request["buttons"][0]["data"]  # type: ignore[index, call-overload]
    assert len(token.encode()) <= 64
    second = start(db)  # a new adapter: the first one's open attempt is now ambiguous
    assert second.epoch == first.epoch + 1 and second.interrupted == (work.effect_id,)
    stale = settle(db, first.epoch, work)
    assert isinstance(stale, Conflict) and "stale adapter" in stale.evidence
    assert effect_status(db, work.effect_id) == ("ambiguous", 1)
    # Nothing sends it again by itself: the next adapter has nothing to resume.
    with db.write() as tx:
        assert cd.resume_pending(tx, CHANNEL, second.epoch, actor=SERVER) == []
    assert violations(db) == []


# conformance: I9
def test_retry_opens_a_new_attempt_and_the_old_attempt_cannot_settle_it(
    db: StateDatabase,
) -> None:
    decision_id = park(db, decision_flow())
    adapter = start(db)
    work = deliver(db, adapter.epoch, decision_id)
    with db.write() as tx:
        assert cd.adapter_ended(tx, CHANNEL, adapter.epoch, actor=SERVER) == [work.effect_id]
    with db.write() as tx:
        assert isinstance(cd.recover(tx, work.effect_id, "retry", actor=SERVER), Applied)
    again = start(db)
    with db.write() as tx:
        (retried,) = cd.resume_pending(tx, CHANNEL, again.epoch, actor=SERVER)
    assert retried.attempt == 2 and retried.request == work.request
    old = settle(db, again.epoch, work)  # attempt 1 is not the open attempt
    assert isinstance(old, Conflict) and "stale attempt" in old.evidence
    assert isinstance(settle(db, again.epoch, retried), Applied)
    assert effect_status(db, work.effect_id) == ("applied", 2)
    with db.read() as tx:
        message = store.message_of_effect(tx, work.effect_id)
    assert message is not None and message.status is ChannelMessageStatus.CONFIRMED
    assert violations(db) == []


def test_confirm_settles_an_ambiguous_send_without_a_new_attempt(db: StateDatabase) -> None:
    decision_id = park(db, decision_flow())
    adapter = start(db)
    work = deliver(db, adapter.epoch, decision_id)
    indeterminate = settle(db, adapter.epoch, work, outcome="indeterminate", result=None)
    assert isinstance(indeterminate, Applied)
    assert effect_status(db, work.effect_id) == ("ambiguous", 1)
    with db.write() as tx:
        assert isinstance(cd.recover(tx, work.effect_id, "confirm", actor=SERVER), Applied)
        assert cd.resume_pending(tx, CHANNEL, adapter.epoch, actor=SERVER) == []
    assert effect_status(db, work.effect_id) == ("applied", 1)


def test_an_allowed_press_answers_as_a_human_and_a_stranger_is_refused(
    db: StateDatabase,
) -> None:
    decision_id = park(db, decision_flow())
    adapter = start(db)
    work = deliver(db, adapter.epoch, decision_id)
    settle(db, adapter.epoch, work)
    buttons = work.request["buttons"]  # type: ignore[index, call-overload]
    (data,) = [b["data"] for b in buttons if b["text"] == "ship"]
    refused = press(db, adapter.epoch, adapter.revision, 10, data=data, allowed=False,
                    identity="telegram:99")  # fmt: skip
    assert isinstance(refused, Applied) and refused.value.outcome == "refused"
    with db.read() as tx:
        assert decision_store.get_resolution(tx, decision_id) is None
    # A stale revision (the refusal bumped it) changes nothing.
    assert isinstance(press(db, adapter.epoch, adapter.revision, 11, data=data), Conflict)
    won = press(db, adapter.epoch, refused.value.revision, 11, data=data)
    assert isinstance(won, Applied) and won.value.outcome == "won", won
    with db.read() as tx:
        resolution = decision_store.get_resolution(tx, decision_id)
        assert store.read_cursor(tx, CHANNEL, cd.UPDATE_OFFSET) == "12"
    assert resolution is not None
    assert resolution.provenance is ResolutionProvenance.HUMAN
    assert (resolution.actor_type, resolution.actor_id) == ("human", "telegram:42")
    assert resolution.response == {"choice": "ship"}
    # The same update again (behind the cursor) is adopted and writes nothing.
    repeat = press(db, adapter.epoch, won.value.revision, 11, data=data)
    assert isinstance(repeat, Adopted)
    # The settled delivery is edited once.
    with db.write() as tx:
        (delivery,) = store.unedited_deliveries(tx, CHANNEL)
        edit = cd.edit_settled(tx, CHANNEL, adapter.epoch, delivery, render=render_edit,
                               actor=SERVER)  # fmt: skip
        assert store.unedited_deliveries(tx, CHANNEL) == []
    assert isinstance(edit, cd.Work)
    assert edit.request == {
        "method": "editMessageText",
        "messageRef": {"chatId": 7, "messageId": 70},
        "text": "done",
    }
    assert violations(db) == []


def test_a_refused_delivery_is_sent_again_a_bounded_number_of_times_and_an_ambiguous_one_never(
    db: StateDatabase,
) -> None:
    refused_id = park(db, decision_flow(), "run-1")
    unsure_id = park(db, decision_flow(), "run-2")
    adapter = start(db)
    refused = deliver(db, adapter.epoch, refused_id)
    unsure = deliver(db, adapter.epoch, unsure_id)
    settle(db, adapter.epoch, refused, outcome="rejected", result=None, error="chat not found")
    settle(db, adapter.epoch, unsure, outcome="indeterminate", result=None, error="timed out")
    for resend in range(1, cd.MAX_RESENDS + 1):
        with db.write() as tx:
            assert cd.resend_refused(tx, CHANNEL, actor=SERVER) == [refused_id]
            # Once: until the new send is refused too, there is nothing to send again.
            assert cd.resend_refused(tx, CHANNEL, actor=SERVER) == []
            (work,) = cd.resume_pending(tx, CHANNEL, adapter.epoch, actor=SERVER)
            sent = fx.get_effect(tx, work.effect_id)
        assert sent is not None and cd.resends_of(sent) == resend and work.attempt == 1
        assert work.request == refused.request  # the same message, buttons and token
        assert effect_status(db, refused.effect_id) == ("rejected", 1)  # kept as history
        settle(db, adapter.epoch, work, outcome="rejected", result=None, error="chat not found")
    with db.write() as tx:
        assert cd.resend_refused(tx, CHANNEL, actor=SERVER) == []  # bounded
        (failed,) = store.failed_open_deliveries(tx, CHANNEL)
        assert failed.decision_id == refused_id and failed.effect_id == work.effect_id
    assert effect_status(db, unsure.effect_id) == ("ambiguous", 1)  # never sent blindly
    assert violations(db) == []


def test_a_decision_answered_elsewhere_is_not_delivered(db: StateDatabase) -> None:
    decision_id = park(db, decision_flow())
    assert isinstance(answer(db, decision_id, {"choice": "hold"}), Applied)
    adapter = start(db)
    with db.write() as tx:
        assert store.undelivered_decisions(tx, CHANNEL) == []
        assert cd.deliver(tx, CHANNEL, adapter.epoch, decision_id, render=render,
                          actor=SERVER) is None  # fmt: skip
    with db.read() as tx:
        channel = store.get_channel(tx, CHANNEL)
        assert channel is not None
        assert [e.status for e in cd.open_effects(tx, channel)] == []
    assert EffectStatus.AMBIGUOUS.value == "ambiguous"


def test_what_a_dispatch_reads_walks_the_open_requests_and_effects_not_the_history(
    db: StateDatabase,
) -> None:
    """A channel's dispatch runs on every run change: its reads of undelivered decisions,
    refused deliveries and unsettled sends must start from what is open (an index of open
    requests, the effects' status index), never scan every request or effect ever made."""
    plans = {}
    with db.read() as tx:
        for name, sql in (
            ("undelivered", store._UNDELIVERED),
            ("failed", store._FAILED_OPEN),
            ("unsettled", fx._SELECT_UNSETTLED),
        ):
            rows = tx.all("EXPLAIN QUERY PLAN " + sql, _plan_parameters(sql))
            plans[name] = [str(row[3]) for row in rows]
    assert plans["undelivered"][0] == "SCAN i USING INDEX interactive_requests_open_run_idx"
    assert plans["failed"][0] == "SCAN i USING INDEX interactive_requests_open_run_idx"
    assert plans["unsettled"][0].startswith("SEARCH e USING INDEX effects_pending_idx (status=?")
    for plan in plans.values():
        assert not any(step.startswith("SCAN") and "USING" not in step for step in plan), plan


def _plan_parameters(sql: str) -> dict[str, Any] | tuple[str]:
    return {"channel": "telegram:ops", "limit": 16} if ":channel" in sql else ("run:1",)
