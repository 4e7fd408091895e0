"""``piwf session attach`` on a session no run has used (most often a mistyped id, or a run id
typed for the session's), as a real subprocess against a real server: it says so, names where
the used sessions are listed, and goes on waiting for a run that may still start there.
"""

from __future__ import annotations

import subprocess

from piwf.client import Client
from tests.server.harness import ServerProcess
from tests.server.test_session_attach_ends import REVIEW, Host, hosts, server, start_host

__all__ = ["hosts", "server"]


def test_attaching_to_a_session_no_run_has_used_says_so_and_waits(
    server: ServerProcess, hosts: list[Host]
) -> None:
    """It said only "attached ...; waiting for messages" and waited, silent, for ever."""
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "x"})  # headless: its id is no session
        host = start_host(hosts, server, run.run_id, stdin=subprocess.PIPE)
        host.wait_for_stderr("waiting for a run")
        said = host.stderr()
        assert (
            f"no run has used session {run.run_id} yet (piwf session list shows the sessions"
            f" runs were bound to); waiting for a run started with --session {run.run_id}"
        ) in said, said
        assert host.process.poll() is None, "it goes on waiting"
        bound = client.start_run(REVIEW, input={"topic": "x"}, session="used-1")
        used = start_host(hosts, server, "used-1", stdin=subprocess.PIPE)
        used.wait_for_stderr("output JSON>")
        assert "no run has used" not in used.stderr()
        client.cancel_run(bound.run_id)
