"""Channel adapters against a Bot API that fails, through real processes: a server, its
Telegram adapter child and the local fake Bot API on loopback. A decision left undelivered
while the API is down is posted once when it answers again, across a server restart too, and
nothing an API answers can forge a line of status or of the server log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.fake_bot_api import FakeBotApi
from tests.server.harness import ServerFactory, raw_client, wait_for
from tests.server.test_channels import adapter, configure, degraded, effects
from tests.server.test_decisions import decision_workflow, waiting_request
from tests.server.test_execution import FAST, start


@pytest.fixture
def bot() -> Iterator[FakeBotApi]:
    fake = FakeBotApi().start()
    yield fake
    fake.stop()


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
