"""Channel adapters against a Bot API that fails, through real processes: a server, its
Telegram adapter child and the local fake Bot API on loopback. A decision left undelivered
while the API is down is posted once when it answers again, across a server restart too, and
nothing an API answers can forge a line of status or of the server log. A press whose write
fails is not acknowledged, and lands when the adapter relays it again."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.fake_bot_api import FakeBotApi
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_channels import (
    ALLOWED,
    adapter,
    buttons,
    configure,
    degraded,
    effects,
    piwf,
    send_message_id,
    status,
)
from tests.server.test_decisions import decision_workflow, waiting_request
from tests.server.test_execution import FAST, query, start, wait_run


@pytest.fixture
def bot() -> Iterator[FakeBotApi]:
    fake = FakeBotApi().start()
    yield fake
    fake.stop()


@pytest.fixture
def channel_server(servers: ServerFactory, bot: FakeBotApi) -> ServerProcess:
    configure(servers.home, bot)
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def test_a_decision_left_undelivered_is_sent_once_after_a_restart_while_the_api_is_down(
    servers: ServerFactory, bot: FakeBotApi, tmp_path: Path
) -> None:
    configure(servers.home, bot)
    bot.go_offline()
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    first = servers.start(env=FAST)
    assert first.ready["ok"] is True, first.ready
    with raw_client(first) as client:
        wait_for(lambda: degraded(client, "unreachable"), timeout_s=30, what="unreachable")
        waiting_request(client, start(client, workflow, None, "r1"))
    assert effects(first) == []  # nothing is sent while the API cannot be reached
    assert first.terminate() == 0
    # The new adapter must not send before its API has answered once: a send refused at the
    # door is not retried, so the decision would never be posted.
    second = servers.start(env=FAST)
    assert second.ready["ok"] is True, second.ready
    with raw_client(second) as client:
        wait_for(lambda: degraded(client, "unreachable"), timeout_s=30, what="unreachable")
        assert effects(second) == []
        bot.go_online()
        adapter(client, epoch=2)
        wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send")
        wait_for(lambda: effects(second) == [("channel.send", "applied", 1)], what="sent")
    assert len(bot.of("sendMessage")) == 1
    # A send that did arrive has nothing to recover: the refusal names the channel's list and
    # warns of no duplicate, since nothing is sent again.
    (effect_id,) = (row[0] for row in query(second, "SELECT effect_id FROM effects"))
    refused = piwf(second.home, "channel", "recover", effect_id, "retry", "--json")
    assert refused.returncode == 1, refused
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "runCommand", error
    assert error["message"].startswith(f"{effect_id}: effect is applied, not ambiguous"), error
    assert "piwf channel status" in error["message"] and "run show" not in error["message"]
    assert "duplicate" not in refused.stderr, refused.stderr


def test_what_an_api_answers_cannot_forge_status_or_log_lines(
    channel_server: ServerProcess, bot: FakeBotApi
) -> None:
    forged = "2026-01-01 00:00:00,000 INFO channel ops: the Bot API answers again"
    with raw_client(channel_server) as client:
        adapter(client)
        bot.poll_answer = {"ok": False, "description": f"nope\x1b]0;title\x07\n{forged}"}
        found = wait_for(lambda: degraded(client, "apiError"), timeout_s=30, what="apiError")
        assert "\n" not in found["error"] and "\x1b" not in found["error"], found
        assert "\\n2026" in found["error"] and "\\x1b" in found["error"], found
    shown = piwf(channel_server.home, "channel", "status")
    assert shown.returncode == 0, shown
    assert "\x1b" not in shown.stdout, shown
    assert not any(line.startswith(forged) for line in shown.stdout.splitlines()), shown
    log = (channel_server.home / "server" / "server.log").read_text()
    assert not any(line.startswith(forged) for line in log.splitlines()), log
    assert "\x1b" not in log


def refused_delivery(
    server: ServerProcess, bot: FakeBotApi, client: RawClient, directory: Path
) -> tuple[str, str]:
    """A decision whose delivery the API refused ("chat not found"): its run and request."""
    bot.send_refusal = {
        "ok": False,
        "error_code": 400,
        "description": "Bad Request: chat not found",
    }
    workflow = decision_workflow(directory, "refused", 600_000)
    adapter(client)
    run_id = start(client, workflow, None, "r1")
    request_id = waiting_request(client, run_id)["requestId"]
    wait_for(lambda: effects(server) == [("channel.send", "rejected", 1)], what="refused")
    return run_id, request_id


def test_a_decision_the_api_refused_to_post_is_listed_until_it_is_answered(
    channel_server: ServerProcess, bot: FakeBotApi, tmp_path: Path
) -> None:
    """A refused send is not retried by itself, so status names the open decision the chat
    never showed, with the API's reason and the command that answers it another way."""
    with raw_client(channel_server) as client:
        _, request_id = refused_delivery(channel_server, bot, client, tmp_path)
        status = json.loads(piwf(channel_server.home, "channel", "status", "--json").stdout)
        (profile,) = status["profiles"]
        (failed,) = profile["failed"]
        assert failed["decisionId"] == request_id, failed
        assert "chat not found" in failed["error"], failed
        human = piwf(channel_server.home, "channel", "status").stdout
        assert "failed 1" in human, human
        assert f"the API refused to post decision {request_id}" in human, human
        assert f"piwf answer {request_id}" in human, human
        answered = client.request(
            "decision.answer", {"requestId": request_id, "response": {"choice": "ship"}}, key="a"
        )
        assert answered.outcome == "accepted", answered
    status = json.loads(piwf(channel_server.home, "channel", "status", "--json").stdout)
    assert status["profiles"][0]["failed"] == [], "an answered decision is no longer listed"


def test_status_shows_the_newest_reason_and_clears_it_as_soon_as_the_api_answers(
    servers: ServerFactory, bot: FakeBotApi
) -> None:
    """A failure whose reason changes shows the newest reason (one log line, not one per
    reason), and once the API answers again the profile is ready without a reason at once,
    not after a long poll of a minute."""
    bot.longest_wait_s = 120
    configure(servers.home, bot, poll_timeout_s=60)
    server = servers.start(env=FAST)
    assert server.ready["ok"] is True, server.ready
    with raw_client(server) as client:
        adapter(client)
        # The adapter's long poll is waiting (the fake holds its lock until it waits).
        wait_for(lambda: bot.polls >= 2, what="the long poll")
        bot.poll_answer = {"ok": False, "description": "Conflict: first reason"}
        bot.wake()
        first = wait_for(lambda: degraded(client, "apiError"), timeout_s=30, what="apiError")
        assert "first reason" in first["error"], first

        def newest() -> dict[str, Any] | None:
            found = degraded(client, "apiError")
            return found if found is not None and "second reason" in found["error"] else None

        bot.poll_answer = {"ok": False, "description": "Conflict: second reason"}
        shown = wait_for(newest, timeout_s=30, what="the newest reason")
        assert "first reason" not in shown["error"] and shown["since"] == first["since"], shown
        human = piwf(server.home, "channel", "status").stdout
        assert "second reason" in human and "first reason" not in human, human
        bot.poll_answer = None
        back = adapter(client)  # within 30 s: the poll after a failure does not wait
        assert "error" not in back and "problem" not in back, back
    human = piwf(server.home, "channel", "status")
    assert "reason" not in human.stdout and "  since " not in human.stdout, human.stdout
    log = (server.home / "server" / "server.log").read_text()
    assert log.count("channel ops: the Bot API answers with an error") == 1, log
    assert log.count("channel ops: the Bot API answers again") == 1, log


def test_a_reload_sends_a_refused_delivery_again_once_and_it_can_be_answered_there(
    channel_server: ServerProcess, bot: FakeBotApi, tmp_path: Path
) -> None:
    """A refused send never reached the chat, so a reload (the operator fixed the cause) sends
    it again: once per reload, never a duplicate of one that was posted."""
    with raw_client(channel_server) as client:
        run_id, request_id = refused_delivery(channel_server, bot, client, tmp_path)
        (failed,) = status(client)["profiles"][0]["failed"]
        assert failed["resendsLeft"] == 5, failed
        human = piwf(channel_server.home, "channel", "status").stdout
        assert "then piwf channel reload sends it again" in human, human
        bot.send_refusal = None  # the operator fixed the chat
        reloaded = piwf(channel_server.home, "channel", "reload", "--json")
        assert json.loads(reloaded.stdout)["resent"] == [request_id], reloaded
        wait_for(
            lambda: (
                effects(channel_server)
                == [("channel.send", "rejected", 1), ("channel.send", "applied", 1)]
            ),
            what="sent again",
        )
        assert status(client)["profiles"][0]["failed"] == []
        again = piwf(channel_server.home, "channel", "reload", "--json")
        assert json.loads(again.stdout)["resent"] == [], again  # posted: never sent twice
        refused_send, posted = bot.of("sendMessage")
        assert posted.body == refused_send.body  # the same message and buttons
        bot.press(ALLOWED, buttons(posted)["Ship it"])
        assert wait_run(client, run_id)["status"] == "completed"
        (edit,) = wait_for(lambda: bot.of("editMessageText"), timeout_s=30, what="the edit")
    assert edit.body["message_id"] == send_message_id(channel_server, applied=True)
    assert len(bot.of("sendMessage")) == 2


def test_a_reply_or_update_of_another_shape_is_a_bad_reply_and_polling_goes_on(
    channel_server: ServerProcess, bot: FakeBotApi, tmp_path: Path
) -> None:
    """JSON that is no Bot API reply, or an update without a usable id, leaves the profile
    degraded with ``badReply`` (not an API refusal, not a dead poll thread behind a ``ready``
    state); once the API answers properly a decision is delivered and answered."""
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    with raw_client(channel_server) as client:
        adapter(client)
        for answer in (
            {"weird": 1},
            {"ok": True, "result": [{"callback_query": {"from": {"id": ALLOWED}}}]},
            {"ok": True, "result": [{"update_id": float("inf")}]},  # int() overflows
        ):
            bot.poll_answer = answer
            bot.wake()
            found = wait_for(lambda: degraded(client, "badReply"), timeout_s=30, what="badReply")
            assert found["state"] == "degraded", found
            bot.poll_answer = None
            adapter(client)  # the same adapter polls on and answers again
        run_id = start(client, workflow, None, "r1")
        waiting_request(client, run_id)
        (send,) = wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send")
        bot.press(ALLOWED, buttons(send)["Ship it"])
        assert wait_run(client, run_id)["status"] == "completed"


def test_a_poll_that_fails_in_a_way_no_check_expects_ends_the_adapter_and_it_starts_again(
    servers: ServerFactory, bot: FakeBotApi
) -> None:
    """Not a poll thread dead behind a ``ready`` profile: the adapter exits (its traceback in
    its log, which the exit names) and is started again as the next epoch."""
    configure(servers.home, bot)
    server = servers.start(env={**FAST, "PIWF_CHILD_FAULTS": "channel.after_poll@2=raise"})
    assert server.ready["ok"] is True, server.ready
    log = server.home / "server" / "server.log"
    exited = wait_for(
        lambda: re.search(
            r"channel ops: the adapter exited \(code 5; its log: (\S+)\)", log.read_text()
        ),
        timeout_s=30,
        what="the adapter's exit in the server log",
    )
    assert "FaultInjectedError" in Path(exited.group(1)).read_text()
    with raw_client(server) as client:
        wait_for(
            lambda: status(client)["profiles"][0].get("epoch", 0) >= 2,
            timeout_s=30,
            what="the adapter started again",
        )


def test_a_press_whose_write_fails_is_not_acknowledged_and_lands_when_relayed_again(
    servers: ServerFactory, bot: FakeBotApi, tmp_path: Path
) -> None:
    """The transaction applying a press fails at its end (a disk I/O error): nothing of it is
    stored, so neither the person nor the run may be told it was. The adapter keeps the update
    (its offset does not move) and relays it again; the failed write recorded no cursor, so
    that retry of the same update is applied, the person is told once, and the run goes on.
    The server is frozen inside the retry's transaction to look at what the failure left."""
    configure(servers.home, bot)
    faults_log = tmp_path / "faults.log"
    point = "channel.before_answer_commit"
    server = servers.start(
        env={
            **FAST,
            "PIWF_FAULTS": f"{point}@1=ioerror;{point}@2=stop",
            "PIWF_FAULTS_LOG": str(faults_log),
        }
    )
    assert server.ready["ok"] is True, server.ready
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    hits = [f"{point} 1 ioerror", f"{point} 2 stop"]

    def hit() -> list[str]:
        text = faults_log.read_text() if faults_log.exists() else ""
        return [line.split(" ", 1)[1] for line in text.splitlines()]

    with raw_client(server) as client:
        adapter(client)
        run_id = start(client, workflow, None, "r1")
        request_id = waiting_request(client, run_id)["requestId"]
        (send,) = wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send")
        update_id = bot.press(ALLOWED, buttons(send)["Ship it"])
        wait_for(
            lambda: hit() == hits or bot.of("answerCallbackQuery"),
            timeout_s=30,
            what="the press relayed again (or acknowledged)",
        )
        # Frozen inside the retry's transaction: the failed write left nothing behind.
        assert bot.of("answerCallbackQuery") == [], "a press that was not stored was acknowledged"
        assert hit() == hits
        sql = "SELECT status FROM interactive_requests WHERE request_id = ?"
        assert query(server, sql, (request_id,)) == [("pending",)]
        assert query(server, "SELECT count(*) FROM human_decision_resolutions") == [(0,)]
        assert query(server, "SELECT cursor_value FROM channel_cursors") == []
        os.kill(server.process.pid, signal.SIGCONT)
        assert wait_run(client, run_id)["status"] == "completed"
        (told,) = wait_for(lambda: bot.of("answerCallbackQuery"), what="the callback answer")
    assert told.body == {"callback_query_id": f"cb{update_id}", "text": "Answer recorded"}
    assert query(server, "SELECT cursor_value FROM channel_cursors") == [(str(update_id + 1),)]
    assert query(server, "SELECT actor_id FROM events WHERE event_type = 'channel.update'") == [
        (f"telegram:{ALLOWED}",)
    ]
    log = (server.home / "server" / "server.log").read_text()
    assert f"channel ops: update {update_id} was not recorded (the adapter relays" in log, log


def test_a_press_of_an_unexpected_shape_is_passed_over_and_the_next_one_lands(
    channel_server: ServerProcess, bot: FakeBotApi, tmp_path: Path
) -> None:
    """Presses the adapter cannot read (a sender that is no object, data that is no string)
    stood first in the API's queue: each poll refused the batch, so every press behind them
    waited until the API dropped them, a day later. Each is now relayed without content
    (recorded ``ignored``, the cursor past it, a line in the adapter's log), and the
    person's press behind them decides the run."""
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    with raw_client(channel_server) as client:
        adapter(client)
        run_id = start(client, workflow, None, "r1")
        waiting_request(client, run_id)
        (send,) = wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send")
        message = {"message_id": 1, "chat": {"id": bot.chat_id}}
        odd = [
            bot.queue_update({"callback_query": {"id": "cbx", "from": "x", "message": message}}),
            bot.queue_update(
                {"callback_query": {"id": "cby", "from": {"id": ALLOWED}, "data": {"no": 1}}}
            ),
        ]
        pressed = bot.press(ALLOWED, buttons(send)["Ship it"])
        assert wait_run(client, run_id)["status"] == "completed"
        assert adapter(client)["state"] == "ready"
    assert query(channel_server, "SELECT cursor_value FROM channel_cursors") == [
        (str(pressed + 1),)
    ]
    (told,) = bot.of("answerCallbackQuery")
    assert told.body == {"callback_query_id": f"cb{pressed}", "text": "Answer recorded"}
    logs = "".join(path.read_text() for path in (channel_server.home / "server").rglob("*.log"))
    for update_id in odd:
        assert f"update {update_id}: a button press of an unexpected shape, passed over" in logs
