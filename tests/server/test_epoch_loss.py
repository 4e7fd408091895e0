"""A server whose epoch lease ran out stops at the first command that finds it out.

The outside report: after a full disk kept the epoch from being renewed, ``server stop``
answered ``claimLost … expired`` and the server did not exit. Here the lease simply runs out
(1 s lease, renewal every 60 s), which is what a full disk does to it, so no renewal notices
first: the command must.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.errors import UnavailableError
from piwf.state import StateDatabase
from tests.server.harness import ServerFactory, ServerProcess, wait_for

EXPIRING = {"PIWF_IDLE_EXIT_S": "0", "PIWF_SERVER_LEASE_MS": "1000", "PIWF_SERVER_RENEW_S": "60"}
HELLO = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py")


def epoch_expired(server: ServerProcess) -> bool:
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        expires_at = int(tx.scalar("SELECT expires_at FROM server_state WHERE id = 1"))
    return expires_at < time.time() * 1000


def expiring_server(servers: ServerFactory) -> ServerProcess:
    server = servers.start(env=EXPIRING)
    assert server.ready.get("ok") is True, server.ready
    wait_for(lambda: epoch_expired(server), 20, "the server lease to run out")
    return server


def test_server_stop_after_the_lease_ran_out_stops_the_process(servers: ServerFactory) -> None:
    server = expiring_server(servers)
    with Client(server.home, autostart=False, request_timeout_s=15) as client:
        assert client.stop_server().stopping is True
    assert server.process.wait(timeout=30) == 1, "an epoch lost is a failed exit"
    log_text = (server.home / "server" / "server.log").read_text()
    assert "server epoch lost (expired); stopping without further writes" in log_text


def test_any_durable_command_that_finds_the_epoch_lost_stops_the_server(
    servers: ServerFactory,
) -> None:
    server = expiring_server(servers)
    with (
        Client(server.home, autostart=False, request_timeout_s=15) as client,
        pytest.raises(UnavailableError) as refused,
    ):
        client.start_run(HELLO, input={"who": "late"})
    assert refused.value.error_code == "claimLost", "retry later: a new server will take it"
    assert server.process.wait(timeout=30) == 1, "stopped at once, not at the next renewal"
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 0, "nothing was written"
