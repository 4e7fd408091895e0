"""The client against real ``piwf server run`` processes: starting one on first use, and a wait
that outlives the server it began on.

Servers started by the harness are reaped by ``servers``; those a client starts on its own
(autostart) by ``autostarted``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.errors import (
    ClientClosedError,
    NotFoundError,
    PiwfError,
    ServerUnavailableError,
    WatchIdleError,
)
from tests.server.conftest import servers  # noqa: F401 - a fixture used by name
from tests.server.harness import ServerFactory, ServerProcess, wait_for
from tests.server.test_execution import FAST

CHECKPOINT = str(
    Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "checkpoint_review.py"
)

#: wait_run's timeout in the kill test, and when in it the server goes: after the client's
#: retry_timeout_s (RETRY_S) has passed, since the time a run.wait is held is no failure.
WAIT_S = 8.0
KILL_AFTER_S = 3.0
RETRY_S = 1.0
#: What the call may take beyond its timeout: asking once more after the reconnect.
MARGIN_S = 2.5


@pytest.mark.parametrize("watch", ["run", "runs"])
def test_a_watch_starts_a_server_as_every_call_does(
    watch: str, short_home: Path, autostarted: list[int]
) -> None:
    with Client(short_home) as client:
        if watch == "run":
            with pytest.raises(NotFoundError):
                next(client.watch_run("run-missing"))
        else:
            assert next(client.watch_runs()) == []
    assert len(autostarted) == 1


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_wait_run_honours_its_timeout_across_a_server_restart(
    stop: str,
    servers: ServerFactory,  # noqa: F811
    autostarted: list[int],
) -> None:
    first = servers.start(env=FAST)
    assert first.ready["ok"] is True, first.ready
    stop_server: Callable[[], object] = first.kill if stop == "SIGKILL" else first.terminate
    with Client(first.home, retry_timeout_s=RETRY_S) as client:
        run = client.start_run(CHECKPOINT, input={"steps": ["a"]})
        wait_for(lambda: client.get_run(run.run_id).run.status == "waiting", what="the checkpoint")

        started = time.monotonic()
        killer = threading.Thread(target=_stop_mid_wait, args=(client, first, stop_server, started))
        killer.start()
        try:
            receipt = client.wait_run(run.run_id, timeout_s=WAIT_S)
        finally:
            killer.join()
        elapsed = time.monotonic() - started
    assert not first.alive() and len(autostarted) == 1  # the wait went on on a new server
    assert receipt.timed_out is True and receipt.run.status == "waiting"
    assert WAIT_S - 0.5 <= elapsed <= WAIT_S + MARGIN_S, f"wait_run took {elapsed:.1f} s"


def _stop_mid_wait(
    client: Client, server: ServerProcess, stop_server: Callable[[], object], started: float
) -> None:
    """Stop ``server`` once the ``run.wait`` is in flight and KILL_AFTER_S of it have passed."""

    def mid_wait() -> bool:
        connection = client._connection
        in_flight = connection is not None and bool(connection._pending)
        return in_flight and time.monotonic() - started >= KILL_AFTER_S

    wait_for(mid_wait, timeout_s=WAIT_S, what="the run.wait in flight")
    stop_server()


def test_close_ends_a_wait_and_a_watch_in_flight_on_other_threads(
    servers: ServerFactory,  # noqa: F811
) -> None:
    server = servers.start(env=FAST)
    client = Client(server.home, autostart=False)
    run = client.start_run(CHECKPOINT, input={"steps": ["a"]})
    wait_for(lambda: client.get_run(run.run_id).run.status == "waiting", what="the checkpoint")
    seen: list[int] = []
    ended: dict[str, BaseException] = {}

    def watch() -> None:
        try:
            for view in client.watch_run(run.run_id):
                seen.append(view.revision)
        except BaseException as error:
            ended["watch"] = error

    def wait() -> None:
        try:
            client.wait_run(run.run_id, timeout_s=60)
        except BaseException as error:
            ended["wait"] = error

    callers = [threading.Thread(target=watch), threading.Thread(target=wait)]
    for caller in callers:
        caller.start()

    def both_in_flight() -> bool:
        connection = client._connection
        return bool(seen) and connection is not None and bool(connection._pending)

    wait_for(both_in_flight, what="the first view and the run.wait in flight")
    client.close()
    for caller in callers:
        caller.join(timeout=10)
    assert not any(caller.is_alive() for caller in callers), "close() left a call waiting"
    assert sorted(ended) == ["wait", "watch"]
    assert all(isinstance(error, ClientClosedError) for error in ended.values()), ended
    assert str(ended["watch"]) == f"the client was closed while watching run {run.run_id}"
    assert str(ended["wait"]) == "the client was closed during run.wait"
    assert server.alive()
    assert client.get_run(run.run_id).run.status == "waiting"  # a later call connects again
    client.close()


#: Timeouts far beyond any wait a thread or socket can take (about 292 years): each stands for
#: "as good as no limit" and must not reach a wait as an OverflowError.
HUGE_TIMEOUTS = [1e10, 1e300, 10**400]


@pytest.mark.parametrize("huge", HUGE_TIMEOUTS, ids=["1e10", "1e300", "10**400"])
def test_a_timeout_longer_than_any_wait_works_as_no_limit(
    huge: float,
    servers: ServerFactory,  # noqa: F811
) -> None:
    server = servers.start(env=FAST)
    timeouts = {"connect_timeout_s": huge, "request_timeout_s": huge, "retry_timeout_s": huge}
    with Client(server.home, autostart=False, **timeouts) as client:
        assert client.request("server.status", timeout_s=huge).outcome == "accepted"
        run = client.start_run(CHECKPOINT, input={"steps": ["a"]})
        wait_for(lambda: client.get_run(run.run_id).run.status == "waiting", what="the checkpoint")
        assert client.wait_run(run.run_id, timeout_s=0).timed_out is True
        views = client.watch_run(run.run_id, idle_timeout_s=huge)
        assert next(views).detail.run.run_id == run.run_id
        views.close()
        runs = client.watch_runs(idle_timeout_s=huge)
        assert [info.run_id for info in next(runs)] == [run.run_id]
        runs.close()
        logs = client.follow_run_logs(run.run_id, interval_s=huge)
        assert next(logs)[0].node_path == "prepare"
        logs.close()
    assert server.alive()


@pytest.mark.parametrize("watch", ["run", "runs"])
def test_a_watch_idle_past_its_timeout_ends_with_a_typed_error(
    watch: str,
    servers: ServerFactory,  # noqa: F811
) -> None:
    server = servers.start(env=FAST)
    with Client(server.home, autostart=False) as client:
        run = client.start_run(CHECKPOINT, input={"steps": ["a"]})
        wait_for(lambda: client.get_run(run.run_id).run.status == "waiting", what="the checkpoint")
        pushes: Iterator[object]
        if watch == "run":
            pushes = client.watch_run(run.run_id, idle_timeout_s=0.5)
        else:
            pushes = client.watch_runs(idle_timeout_s=0.5)
        next(pushes)  # the state now; nothing changes after it
        with pytest.raises(WatchIdleError) as raised:
            next(pushes)
        assert isinstance(raised.value, PiwfError) and isinstance(raised.value, TimeoutError)
        assert "came in 0.5 s (idle_timeout_s)" in str(raised.value)
        assert "watch again" in str(raised.value)
        assert client.get_run(run.run_id).run.status == "waiting"  # the client goes on


def test_a_stopped_server_is_named_with_its_pid_and_what_lets_it_go_on(
    servers: ServerFactory,  # noqa: F811
) -> None:
    server = servers.start(env=FAST)
    assert server.ready["ok"] is True, server.ready
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
    try:
        quick = Client(
            server.home,
            autostart=False,
            connect_timeout_s=0.5,
            request_timeout_s=0.5,
            retry_timeout_s=0.5,
        )
        with quick, pytest.raises(ServerUnavailableError) as silent:
            quick.server_status()
    finally:
        os.kill(pid, signal.SIGCONT)
    message = str(silent.value)
    assert "the server sent no hello in time" in message
    assert f"if its process (pid {pid}) was stopped" in message
    assert f"`kill -CONT {pid}` lets it go on" in message
    assert f"`kill {pid}` ends it" in message
    with Client(server.home, autostart=False) as client:  # going on, it answers again
        assert client.server_status().epoch == server.ready["epoch"]
