"""A server's epoch lease that lapsed, and an epoch another server took.

The outside report: after a full disk kept the epoch from being renewed, ``server stop``
answered ``claimLost … expired`` and the server did not exit. Here the lease simply runs out
(1 s lease, renewal every 60 s) while the server is stopped with SIGSTOP, which is what a
stopped, starved or disk-full server suffers, so no renewal notices first. The server still
holds the single-instance lock, so no other server can have started: it takes the next epoch
as a new server would and serves the command.
An epoch that another owner holds is a real loss: the server stops at once and writes nothing.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.errors import UnavailableError
from piwf.state import StateDatabase
from tests.server.harness import ServerFactory, ServerProcess, wait_for

EXPIRING = {"PIWF_IDLE_EXIT_S": "0", "PIWF_SERVER_LEASE_MS": "1000", "PIWF_SERVER_RENEW_S": "0.5"}
HELLO = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py")


def epoch_expired(server: ServerProcess) -> bool:
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        expires_at = int(tx.scalar("SELECT expires_at FROM server_state WHERE id = 1"))
    return expires_at < time.time() * 1000


def expiring_server(servers: ServerFactory) -> ServerProcess:
    """A server that was stopped (SIGSTOP) until its epoch lease ran out, then continued."""
    server = servers.start(env=EXPIRING)
    assert server.ready.get("ok") is True, server.ready
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: epoch_expired(server), 20, "the server lease to run out")
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    return server


def test_server_stop_after_the_lease_ran_out_stops_the_process(servers: ServerFactory) -> None:
    server = expiring_server(servers)
    with Client(server.home, autostart=False, request_timeout_s=15) as client:
        assert client.stop_server().stopping is True
    assert server.process.wait(timeout=30) == 0, "a clean stop under the next epoch"
    log_text = (server.home / "server" / "server.log").read_text()
    assert "server epoch 1 lapsed while this server held the lock" in log_text
    assert epoch_of(server) == 2, "one new epoch, kept by renewal after that"


def test_a_command_after_the_lease_ran_out_is_served_under_the_next_epoch(
    servers: ServerFactory,
) -> None:
    server = expiring_server(servers)
    with Client(server.home, autostart=False, request_timeout_s=15) as client:
        run = client.start_run(HELLO, input={"who": "late"})
        assert client.wait_run(run.run_id, timeout_s=30).run.status == "completed"
    assert server.alive()
    assert epoch_of(server) >= 2


def test_a_command_that_finds_another_server_owns_the_epoch_stops_the_server(
    servers: ServerFactory,
) -> None:
    server = servers.start(env=EXPIRING)
    assert server.ready.get("ok") is True, server.ready
    # Another owner takes the epoch behind this server's back (as a server sharing the file
    # over a network file system could; piwf does not support that, but must not write on).
    with StateDatabase(server.home / "state.sqlite") as db, db.write() as tx:
        tx.execute(
            "UPDATE server_state SET epoch = epoch + 1, server_id = 'server-other',"
            " expires_at = ? WHERE id = 1",
            (int(time.time() * 1000) + 600_000,),
        )
    with (
        Client(server.home, autostart=False, request_timeout_s=15) as client,
        pytest.raises(UnavailableError) as refused,
    ):
        client.start_run(HELLO, input={"who": "late"})
    # Whichever notices the loss first answers: the start's own command (claimLost), or the
    # server stopping under it while the resolver still loads the workflow (resolverFailed,
    # "the server is stopping"; more likely when the machine is busy). Both say: retry later.
    assert (refused.value.error_code, str(refused.value)) in {
        ("claimLost", str(refused.value)),
        ("resolverFailed", "the server is stopping"),
    }, refused.value
    assert server.process.wait(timeout=30) == 1, "stopped at once, not at the next renewal"
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        assert tx.scalar("SELECT count(*) FROM runs") == 0, "nothing was written"


def epoch_of(server: ServerProcess) -> int:
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        return int(tx.scalar("SELECT epoch FROM server_state WHERE id = 1"))
