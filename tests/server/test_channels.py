"""Channel adapters through real processes: a server, its Telegram adapter child and a local
fake Bot API on loopback. A protected decision is presented as a message with buttons, answered
there by an allowed identity (a stranger is refused), edited once settled; an adapter killed
mid-send leaves the send ambiguous and nothing is resent until the operator recovers it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf.config import ServerPaths
from piwf.protocol.channel_v1 import AnswerFrame, Update, fence_refusal
from tests.server.fake_bot_api import FakeBotApi
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_decisions import decision_workflow, waiting_request
from tests.server.test_execution import FAST, query, start, wait_run

ALLOWED = 4242
STRANGER = 999
TOKEN = "123456:TEST-credential-value"


@pytest.fixture
def bot() -> Iterator[FakeBotApi]:
    fake = FakeBotApi().start()
    yield fake
    fake.stop()


def configure(home: Path, bot: FakeBotApi, *, mode: int = 0o600, poll_timeout_s: int = 1) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "channels").mkdir(mode=0o700, exist_ok=True)
    token = home / "channels" / "ops.token"
    token.write_text(TOKEN + "\n")
    token.chmod(mode)
    profile = {
        "kind": "telegram",
        "apiBaseUrl": bot.url,
        "chatId": str(bot.chat_id),
        "allowedUserIds": [ALLOWED],
        "credentialFile": "channels/ops.token",
        "pollTimeoutS": poll_timeout_s,
        "requestTimeoutS": 60,
    }
    (home / "channels.json").write_text(json.dumps({"profiles": {"ops": profile}}))


@pytest.fixture
def channel_server(servers: ServerFactory, bot: FakeBotApi) -> ServerProcess:
    configure(servers.home, bot)
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def status(client: RawClient) -> dict[str, Any]:
    response = client.request("channel.status")
    assert response.outcome == "accepted", response
    assert response.receipt is not None
    return response.receipt


def adapter(client: RawClient, *, epoch: int = 1) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        (profile,) = status(client)["profiles"]
        good = profile["state"] == "ready" and profile.get("epoch") == epoch
        return profile if good else None

    found: dict[str, Any] = wait_for(ready, timeout_s=30, what=f"adapter epoch {epoch} ready")
    return found


def buttons(send: Any) -> dict[str, str]:
    rows = send.body["reply_markup"]["inline_keyboard"]
    return {row[0]["text"]: row[0]["callback_data"] for row in rows}


def piwf(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "piwf", *args],
        env={**os.environ, "PIWF_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def effects(server: ServerProcess) -> list[tuple[Any, ...]]:
    return query(
        server, "SELECT effect_type, status, attempt_count FROM effects ORDER BY created_at"
    )


# conformance: I9
def test_a_decision_is_answered_on_telegram_and_the_run_completes(
    channel_server: ServerProcess, bot: FakeBotApi, tmp_path: Path
) -> None:
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    with raw_client(channel_server) as client:
        profile = adapter(client)
        run_id = start(client, workflow, None, "r1")
        request = waiting_request(client, run_id)
        (send,) = wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send")
        assert send.token == TOKEN and send.body["chat_id"] == str(bot.chat_id)
        choices = buttons(send)
        assert set(choices) == {"Ship it", "Hold back"}
        assert all(len(data.encode()) <= 64 for data in choices.values())
        assert request["requestId"] not in json.dumps(send.body)  # a token, not the payload
        # The adapter is transport only: it holds no file of the state database.
        opened = [f.path for f in psutil.Process(profile["pid"]).open_files()]
        home = str(channel_server.home)
        assert not [
            p
            for p in opened
            if p.startswith(home) and p.endswith((".sqlite", ".db", "-wal", "-shm"))
        ], opened
        bot.press(ALLOWED, choices["Ship it"])
        run = wait_run(client, run_id)
        assert run["status"] == "completed", run
        (edit,) = wait_for(lambda: bot.of("editMessageText"), timeout_s=30, what="the edit")
        (answered,) = wait_for(lambda: bot.of("answerCallbackQuery"), what="the callback answer")
    assert edit.body["message_id"] == send_message_id(channel_server)
    assert "Ship it" in edit.body["text"]
    assert answered.body["text"] == "Answer recorded"
    assert query(
        channel_server,
        "SELECT provenance, actor_type, actor_id FROM human_decision_resolutions",
    ) == [("human", "human", f"telegram:{ALLOWED}")]
    # The fake API records the edit before it answers: the adapter's settle may still be on
    # its way to the server.
    wait_for(
        lambda: (
            effects(channel_server)
            == [("channel.send", "applied", 1), ("channel.edit", "applied", 1)]
        ),
        what="the send and the edit settled applied",
    )
    # Credentials never enter the database or the server's log.
    assert TOKEN.encode() not in (channel_server.home / "state.sqlite").read_bytes()
    log = channel_server.home / "server" / "server.log"
    assert not log.exists() or TOKEN not in log.read_text()


def send_message_id(server: ServerProcess, *, applied: bool = False) -> int:
    sql = "SELECT external_ref FROM effects WHERE effect_type = 'channel.send'"
    (ref,) = query(server, sql + (" AND status = 'applied'" if applied else ""))
    return int(str(ref[0]).split(":")[1])


# conformance: I9
def test_a_strangers_answer_is_refused_and_the_decision_stays_open(
    channel_server: ServerProcess, bot: FakeBotApi, tmp_path: Path
) -> None:
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    with raw_client(channel_server) as client:
        adapter(client)
        run_id = start(client, workflow, None, "r1")
        request = waiting_request(client, run_id)
        (send,) = wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send")
        bot.press(STRANGER, buttons(send)["Ship it"])
        (refused,) = wait_for(lambda: bot.of("answerCallbackQuery"), what="the refusal")
        assert refused.body["text"] == "You are not allowed to answer here"
        listed = client.request("requests.list", {"runId": run_id}).receipt
        assert listed is not None
        assert [r["requestId"] for r in listed["requests"]] == [request["requestId"]]
        events = query(
            channel_server,
            "SELECT actor_id FROM events WHERE event_type = 'channel.update'",
        )
        assert events == [(f"telegram:{STRANGER}",)]
        assert query(channel_server, "SELECT count(*) FROM human_decision_resolutions") == [(0,)]
        # The decision answered elsewhere (piwf answer) gets its message edited.
        answer = piwf(channel_server.home, "answer", request["requestId"], '{"choice":"hold"}')
        assert answer.returncode == 0, answer.stderr
        assert wait_run(client, run_id)["status"] == "completed"
        (edit,) = wait_for(lambda: bot.of("editMessageText"), timeout_s=30, what="the edit")
    assert edit.body["message_id"] == send_message_id(channel_server)
    assert "Hold back" in edit.body["text"]


# conformance: I9
def test_an_adapter_killed_mid_send_leaves_it_ambiguous_until_recovered(
    channel_server: ServerProcess, bot: FakeBotApi, tmp_path: Path
) -> None:
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    bot.hang_sends = True
    with raw_client(channel_server) as client:
        first = adapter(client)
        run_id = start(client, workflow, None, "r1")
        wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send in flight")
        assert effects(channel_server) == [("channel.send", "applying", 1)]
        os.kill(first["pid"], signal.SIGKILL)
        wait_for(
            lambda: effects(channel_server) == [("channel.send", "ambiguous", 1)],
            what="the send to become ambiguous",
        )
        second = adapter(client, epoch=2)
        assert second["pid"] != first["pid"]
        (ambiguous,) = second["ambiguous"]
        polls = bot.polls
        wait_for(lambda: bot.polls >= polls + 2, what="the new adapter to poll twice")
        assert len(bot.of("sendMessage")) == 1  # nothing was resent
        bot.hang_sends = False
        shown = piwf(channel_server.home, "channel", "status")
        assert "ambiguous" in shown.stdout and TOKEN not in shown.stdout + shown.stderr
        retry = piwf(channel_server.home, "channel", "recover", ambiguous["effectId"], "retry")
        assert retry.returncode == 0, retry.stderr
        assert "duplicate" in retry.stderr
        wait_for(lambda: len(bot.of("sendMessage")) == 2, timeout_s=30, what="the retry")
        wait_for(lambda: effects(channel_server) == [("channel.send", "applied", 2)], what="sent")
        bot.press(ALLOWED, buttons(bot.of("sendMessage")[1])["Ship it"])
        assert wait_run(client, run_id)["status"] == "completed"
    attempts = query(channel_server, "SELECT attempt_number, outcome FROM effect_attempts")
    assert ("1", "interrupted") in {(str(a), o) for a, o in attempts}


# conformance: I9
def test_confirm_records_an_ambiguous_send_as_sent_and_sends_nothing(
    channel_server: ServerProcess, bot: FakeBotApi, tmp_path: Path
) -> None:
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    bot.hang_sends = True
    with raw_client(channel_server) as client:
        first = adapter(client)
        start(client, workflow, None, "r1")
        wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send in flight")
        os.kill(first["pid"], signal.SIGKILL)
        (ambiguous,) = adapter(client, epoch=2)["ambiguous"]
        confirm = piwf(
            channel_server.home, "channel", "recover", ambiguous["effectId"], "confirm", "--json"
        )
        assert confirm.returncode == 0, confirm.stderr
        assert json.loads(confirm.stdout)["effect"]["status"] == "applied"
        polls = bot.polls
        wait_for(lambda: bot.polls >= polls + 2, what="the adapter to poll twice")
        assert len(bot.of("sendMessage")) == 1
        assert status(client)["profiles"][0]["ambiguous"] == []
    assert effects(channel_server) == [("channel.send", "applied", 1)]


def test_a_credential_file_with_a_loose_mode_is_refused(
    servers: ServerFactory, bot: FakeBotApi
) -> None:
    configure(servers.home, bot, mode=0o644)
    server = servers.start(env=FAST)
    assert server.ready["ok"] is True  # the server stays available
    with raw_client(server) as client:
        (profile,) = wait_for(lambda: status(client)["profiles"], what="the profile")
        assert profile["state"] == "failed" and "chmod 600" in profile["error"]
        assert TOKEN not in json.dumps(status(client))
    assert bot.calls == []


def test_a_credential_path_that_is_no_regular_file_fails_its_profile_and_says_why(
    channel_server: ServerProcess, bot: FakeBotApi
) -> None:
    home = channel_server.home
    config = home / "channels.json"
    profile = json.loads(config.read_text())["profiles"]["ops"]
    (home / "channels" / "link.token").symlink_to(home / "channels" / "ops.token")
    os.mkfifo(home / "channels" / "fifo.token", 0o600)  # opening it for reading must not block
    with raw_client(channel_server) as client:
        adapter(client)
        for credential_file, problem in (
            ("channels", "not a regular file; name the token file itself"),
            ("channels/fifo.token", "not a regular file; name the token file itself"),
            ("channels/link.token", "is a symbolic link; put the token in a regular file"),
        ):
            changed = {"profiles": {"ops": {**profile, "credentialFile": credential_file}}}
            config.write_text(json.dumps(changed))
            reloaded = piwf(home, "channel", "reload", "--json")
            assert reloaded.returncode == 0, reloaded  # the server and other profiles go on
            report = json.loads(reloaded.stdout)
            assert report["restarted"] == ["ops"], reloaded
            (failed,) = status(client)["profiles"]
            assert failed["state"] == "failed", failed
            assert failed["error"].startswith(f"credential file {credential_file}: {problem}"), (
                failed
            )
            # The reload itself says so, not only the status asked afterwards.
            assert report["failed"] == [{"profile": "ops", "reason": failed["error"]}], report
        again = piwf(home, "channel", "reload")
        assert again.returncode == 0, again
        assert again.stdout.startswith("unchanged: ops\nfailed: ops: credential file"), again
        assert "(it is tried again with a back-off; piwf channel status shows it)" in again.stdout


# conformance: I9
def test_a_stale_adapter_epoch_is_refused_before_its_payload() -> None:
    frame = AnswerFrame(
        adapter_epoch=1,
        profile="ops",
        sequence=5,
        expected_revision=3,
        attempt_id="update-7",
        update=Update(update_id=7, identity="telegram:1", data="x:0", allowed=True),
    )
    assert fence_refusal(frame, epoch=2, profile="ops", last_sequence=0) is not None
    assert fence_refusal(frame, epoch=1, profile="other", last_sequence=0) is not None
    assert fence_refusal(frame, epoch=1, profile="ops", last_sequence=5) is not None
    assert fence_refusal(frame, epoch=1, profile="ops", last_sequence=4) is None


def test_reload_restarts_a_changed_profile_and_stops_a_removed_one(
    channel_server: ServerProcess, bot: FakeBotApi
) -> None:
    with raw_client(channel_server) as client:
        first = adapter(client)
        config = channel_server.home / "channels.json"
        document = json.loads(config.read_text())
        unchanged = client.request("channel.reload", key="reload-1")
        assert unchanged.outcome == "accepted", unchanged
        assert unchanged.receipt == {
            "started": [],
            "restarted": [],
            "stopped": [],
            "unchanged": ["ops"],
            "resent": [],
            "failed": [],
        }
        document["profiles"]["ops"]["allowedUserIds"] = [ALLOWED, STRANGER]
        config.write_text(json.dumps(document))
        changed = client.request("channel.reload", key="reload-2")
        assert changed.receipt is not None and changed.receipt["restarted"] == ["ops"], changed
        second = adapter(client, epoch=2)
        assert second["pid"] != first["pid"]
        wait_for(lambda: not psutil.pid_exists(first["pid"]), timeout_s=30, what="the old adapter")
        config.write_text(json.dumps({"profiles": {}}))
        removed = client.request("channel.reload", key="reload-3")
        assert removed.receipt is not None and removed.receipt["stopped"] == ["ops"], removed
        assert status(client)["profiles"] == []
        wait_for(lambda: not psutil.pid_exists(second["pid"]), timeout_s=30, what="the adapter")
        config.write_text("{not json")
        broken = client.request("channel.reload", key="reload-4")
        assert broken.outcome == "rejected", broken
        assert broken.error is not None and broken.error.code == "channelConfig", broken


def test_reload_without_a_server_starts_one_and_says_it_started_the_adapters(
    servers: ServerFactory, bot: FakeBotApi
) -> None:
    """The server a reload starts reads channels.json as it starts; its adapters were started
    by this command, not found unchanged."""
    configure(servers.home, bot)
    try:
        reloaded = piwf(servers.home, "channel", "reload")
        assert reloaded.returncode == 0, reloaded.stderr
        started, adapters = reloaded.stdout.splitlines()
        assert started.startswith("started piwf server (pid "), started
        assert started.endswith(f" for {servers.home}; it read channels.json"), started
        assert adapters == "started: ops", reloaded.stdout
        again = piwf(servers.home, "channel", "reload", "--json")
        assert json.loads(again.stdout) == {
            "restarted": [],
            "resent": [],
            "failed": [],
            "serverStarted": False,
            "started": [],
            "stopped": [],
            "unchanged": ["ops"],
        }, again
        stopped = piwf(servers.home, "server", "stop")
        assert stopped.returncode == 0, stopped.stderr
        fresh = piwf(servers.home, "channel", "reload", "--json")
        assert json.loads(fresh.stdout) == {
            "restarted": [],
            "resent": [],
            "failed": [],
            "serverStarted": True,
            "started": ["ops"],
            "stopped": [],
            "unchanged": [],
        }, fresh
    finally:
        piwf(servers.home, "server", "stop")


def test_reload_of_an_unusable_file_fails_and_the_adapter_keeps_its_configuration(
    channel_server: ServerProcess, bot: FakeBotApi
) -> None:
    config = channel_server.home / "channels.json"
    valid = config.read_text()
    profile = json.loads(valid)["profiles"]["ops"]
    public_http = {"profiles": {"ops": {**profile, "apiBaseUrl": "http://example.com"}}}
    with raw_client(channel_server) as client:
        first = adapter(client)
        for document, problem in (
            ("{not json", "not valid JSON"),
            ("[]", "the document must be a JSON object"),
            (json.dumps(public_http), "apiBaseUrl must be https (or http on a loopback host)"),
        ):
            config.write_text(document)
            as_json = piwf(channel_server.home, "channel", "reload", "--json")
            assert as_json.returncode == 1, as_json
            error = json.loads(as_json.stdout)["error"]
            assert error["code"] == "channelConfig"
            assert error["message"].startswith(f"{config}: "), error
            assert problem in error["message"], error
            assert "ops keeps the last valid configuration" in error["message"], error
            plain = piwf(channel_server.home, "channel", "reload")
            assert plain.returncode == 1, plain
            assert plain.stdout == ""
            assert plain.stderr.startswith(f"Error: {config}: "), plain.stderr
            # The error stays visible as the channel's state; the adapter runs on unchanged.
            shown = status(client)
            assert shown["configFile"] == str(config)
            assert (
                shown["configError"].startswith(f"{config}: ") and problem in shown["configError"]
            ), shown
            (kept,) = shown["profiles"]
            assert (kept["state"], kept["pid"], kept["epoch"]) == ("ready", first["pid"], 1)
        config.write_text(valid)
        fixed = piwf(channel_server.home, "channel", "reload", "--json")
        assert fixed.returncode == 0, fixed
        assert json.loads(fixed.stdout)["unchanged"] == ["ops"]
        assert "configError" not in status(client)


def test_reload_refuses_wrong_types_and_secrets_in_the_url_and_changes_nothing(
    channel_server: ServerProcess, bot: FakeBotApi
) -> None:
    config = channel_server.home / "channels.json"
    profile = json.loads(config.read_text())["profiles"]["ops"]
    secret = "url-secret-4711"
    near_misses = (
        ({"allowedUserIds": [True]}, "allowedUserIds.0: Input should be a valid integer"),
        ({"allowedUserIds": [str(ALLOWED)]}, "allowedUserIds.0: Input should be a valid integer"),
        ({"allowedUserIds": [2**60]}, "allowedUserIds.0: Input should be less than or equal"),
        ({"allowedUserIds": [-1]}, "allowedUserIds.0: Input should be greater than or equal"),
        ({"pollTimeoutS": "1"}, "pollTimeoutS: Input should be a valid integer"),
        ({"requestTimeoutS": float("nan")}, "requestTimeoutS: Input should be a finite number"),
        ({"chatId": "1\n"}, "chatId must be a numeric chat id"),
        ({"apiBaseUrl": f"https://user:{secret}@api.example"}, "takes no user name, password"),
        ({"apiBaseUrl": f"{bot.url}/?token={secret}"}, "takes no user name, password"),
    )
    with raw_client(channel_server) as client:
        first = adapter(client)
        for change, problem in near_misses:
            config.write_text(json.dumps({"profiles": {"ops": {**profile, **change}}}))
            refused = piwf(channel_server.home, "channel", "reload", "--json")
            assert refused.returncode == 1, (change, refused)
            error = json.loads(refused.stdout)["error"]
            assert error["code"] == "channelConfig", (change, error)
            assert problem in error["message"], (change, error)
            (kept,) = status(client)["profiles"]
            assert (kept["pid"], kept["epoch"]) == (first["pid"], 1), (change, kept)
        snake = {k: v for k, v in profile.items() if k != "allowedUserIds"}
        config.write_text(json.dumps({"profiles": {"ops": {**snake, "allowed_user_ids": [1]}}}))
        assert piwf(channel_server.home, "channel", "reload").returncode == 1
        shown = json.dumps(status(client))
    log = ServerPaths(channel_server.home).log.read_text()
    assert secret not in shown and secret not in log


def test_status_without_profiles_names_the_file_to_write(servers: ServerFactory) -> None:
    server = servers.start(env=FAST)
    assert server.ready["ok"] is True, server.ready
    shown = piwf(server.home, "channel", "status")
    assert shown.returncode == 0, shown
    assert shown.stdout.strip() == (
        f"no channel profiles (configure them in {server.home / 'channels.json'})"
    )


def degraded(client: RawClient, problem: str) -> dict[str, Any] | None:
    (profile,) = status(client)["profiles"]
    found = profile["state"] == "degraded" and profile.get("problem") == problem
    return profile if found else None


def test_an_adapter_whose_api_fails_is_degraded_with_why_until_the_api_answers(
    servers: ServerFactory, bot: FakeBotApi, tmp_path: Path
) -> None:
    configure(servers.home, bot)
    bot.go_offline()
    server = servers.start(env=FAST)
    assert server.ready["ok"] is True, server.ready
    log = server.home / "server" / "server.log"
    workflow = decision_workflow(tmp_path, "approve", 600_000)
    with raw_client(server) as client:
        unreachable = wait_for(
            lambda: degraded(client, "unreachable"), timeout_s=30, what="unreachable"
        )
        assert unreachable["error"].startswith("the Bot API cannot be reached (getUpdates: ")
        assert unreachable["since"] > 0 and unreachable["epoch"] == 1
        # A wrong token: the API answers 401.
        bot.refuse_credential = True
        bot.go_online()
        refused = wait_for(
            lambda: degraded(client, "credentialRefused"), timeout_s=30, what="the 401"
        )
        assert refused["error"].startswith(
            "the API refused the credential (getUpdates: HTTP 401: Unauthorized): fix the token in "
            "channels/ops.token, then run piwf channel reload"
        ), refused
        shown = piwf(server.home, "channel", "status")
        assert "ops  telegram  degraded  " in shown.stdout, shown.stdout
        assert "the API refused the credential" in shown.stdout, shown.stdout
        # Nothing is sent through an adapter whose API fails; the decision waits.
        run_id = start(client, workflow, None, "r1")
        waiting_request(client, run_id)
        refusals = bot.refusals
        wait_for(lambda: bot.refusals >= refusals + 3, timeout_s=30, what="3 refused polls")
        assert effects(server) == []
        assert refused["pid"] == status(client)["profiles"][0]["pid"]
        # The API answers again: ready, and the waiting decision is sent.
        bot.refuse_credential = False
        back = adapter(client)
        assert "error" not in back and "problem" not in back, back
        wait_for(lambda: bot.of("sendMessage"), timeout_s=30, what="the send")
        wait_for(lambda: "answers again" in log.read_text(), what="the recovery's log line")
        everything = json.dumps(status(client)) + shown.stdout + shown.stderr
    logged = log.read_text()
    # One line per change, not one per failed poll; never the credential or its URL.
    assert logged.count("channel ops: the Bot API cannot be reached") == 1, logged
    assert logged.count("channel ops: the API refused the credential") == 1, logged
    assert logged.count("channel ops: the Bot API answers again") == 1, logged
    assert TOKEN not in logged and "/bot" not in logged
    assert TOKEN not in everything and "/bot" not in everything
