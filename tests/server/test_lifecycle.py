"""Server lifecycle against real processes: one server per home, epochs, sockets, stopping."""

from __future__ import annotations

import select
import stat
from pathlib import Path

import psutil

from piwf.client import Client
from piwf.state import StateDatabase
from piwf.state.server_epoch import read_server_owner
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for

HELLO = Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py"


def owner_epoch(home: Path) -> tuple[int, str | None]:
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        owner = read_server_owner(tx)
    return owner.epoch, owner.server_id


def test_server_starts_reports_ready_and_answers(server: ServerProcess) -> None:
    assert server.ready["epoch"] == 1
    assert server.ready["pid"] == server.process.pid
    with raw_client(server) as client:
        assert client.hello.server_epoch == 1
        response = client.request("server.status")
    assert response.outcome == "accepted"
    assert response.receipt is not None
    assert response.receipt["state"] == "running"


def test_files_are_private(server: ServerProcess) -> None:
    home = server.home
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "server").stat().st_mode) == 0o700
    socket_info = server.socket_path.lstat()
    assert stat.S_ISSOCK(socket_info.st_mode)
    assert stat.S_IMODE(socket_info.st_mode) == 0o600
    for name in ("state.sqlite", "server/server.lock", "server/server.log"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name


# conformance: X11
def test_a_second_server_is_refused_and_leaves_the_live_socket(
    servers: ServerFactory, server: ServerProcess
) -> None:
    inode = server.socket_path.stat().st_ino
    second = servers.start()
    assert second.ready["ok"] is False
    assert second.ready["error"]["code"] == "serverRunning"
    assert second.process.wait(timeout=15) == 1
    assert server.socket_path.stat().st_ino == inode
    with raw_client(server) as client:
        assert client.request("server.status").outcome == "accepted"


# conformance: X11
def test_a_killed_server_is_replaced_with_the_next_epoch(
    servers: ServerFactory, server: ServerProcess
) -> None:
    server.kill()
    assert server.socket_path.exists(), "a SIGKILLed server leaves its socket behind"
    successor = servers.start(env={"PIWF_IDLE_EXIT_S": "0"})
    assert successor.ready["ok"] is True, successor.ready
    assert successor.ready["epoch"] == 2
    with raw_client(successor) as client:
        assert client.hello.server_epoch == 2
        assert client.request("server.status").receipt["epoch"] == 2  # type: ignore[index]


def test_sigterm_stops_cleanly_and_releases_the_epoch(server: ServerProcess) -> None:
    assert server.terminate() == 0
    assert not server.socket_path.exists()
    assert owner_epoch(server.home) == (1, None)


def test_server_stop_answers_then_exits(server: ServerProcess) -> None:
    with raw_client(server) as client:
        response = client.request("server.stop", key="stop-1")
        assert response.outcome == "accepted"
        assert response.receipt == {"stopping": True}
    assert server.process.wait(timeout=15) == 0
    assert not server.socket_path.exists()


def test_a_stopped_server_has_ended_every_process_of_its_own_when_its_connection_closes(
    server: ServerProcess,
) -> None:
    """The fork server and the resource tracker are the server's children too: they are ended
    and reaped before the stop's connection closes, not left to notice the server's exit."""
    with Client(server.home, autostart=False) as client:
        run = client.start_run(HELLO, input={"who": "ada"})
        assert client.wait_run(run.run_id, timeout_s=30).run.status == "completed"
    descendants = psutil.Process(server.process.pid).children(recursive=True)
    titles = " | ".join(_command_line(child) for child in descendants)
    assert "forkserver" in titles and "resource_tracker" in titles, titles
    with raw_client(server) as raw:
        assert raw.request("server.stop", key="stop-1").outcome == "accepted"
        assert raw.closed_by_server(timeout_s=15)
        left = [child for child in descendants if _alive(child)]
        assert left == [], "still running once the stop's connection closed"
    assert server.process.wait(timeout=15) == 0


def _command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # a runner child that has just ended (a zombie) or is gone
        return ""


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_stopping_server_closes_its_clients_only_once_it_let_go_of_the_home(
    servers: ServerFactory,
) -> None:
    """`piwf server stop` returns when its connection closes: by then the database is closed
    (its WAL checkpointed into it and removed) and the lock released, however long that took
    (here a second more), so a script may copy the files or start another server at once."""
    server = servers.start(env={"PIWF_FAULTS": "server.before_release@1=delay:1000"})
    with raw_client(server) as client:
        assert client.request("server.stop", key="stop-1").outcome == "accepted"
        assert client.closed_by_server(timeout_s=15)
        left = sorted(path.name for path in server.home.glob("state.sqlite*"))
        assert left == ["state.sqlite"], "the connection closed before the database did"
        assert owner_epoch(server.home) == (1, None), "the epoch is released"
    assert server.process.wait(timeout=15) == 0


def test_an_idle_server_exits_by_itself(servers: ServerFactory) -> None:
    started = servers.start(env={"PIWF_IDLE_EXIT_S": "0.5"})
    assert started.ready["ok"] is True
    wait_for(lambda: not started.alive(), timeout_s=20, what="idle exit")
    assert started.process.returncode == 0
    assert not started.socket_path.exists()


def test_a_connected_client_keeps_an_idle_server_alive(servers: ServerFactory) -> None:
    started = servers.start(env={"PIWF_IDLE_EXIT_S": "0.5"})
    client = RawClient(started.socket_path)
    try:
        # Four idle periods pass with a silent client connected: nothing arrives, no exit.
        readable, _, _ = select.select([client.sock], [], [], 2.0)
        assert readable == []
        assert started.alive()
    finally:
        client.close()
    wait_for(lambda: not started.alive(), timeout_s=20, what="idle exit after disconnect")


def test_a_socket_path_over_the_os_limit_is_refused_before_listening(
    tmp_path: Path,
) -> None:
    home = tmp_path / ("x" * 120)
    factory = ServerFactory(home)
    try:
        started = factory.start()
        assert started.ready["ok"] is False
        assert "OS limit" in started.ready["error"]["message"]
        assert started.process.wait(timeout=15) == 1
        assert not (home / "server" / "server.sock").exists()
    finally:
        factory.cleanup()


def test_a_stale_non_socket_file_is_not_replaced(servers: ServerFactory, short_home: Path) -> None:
    (short_home / "server").mkdir(parents=True, mode=0o700)
    short_home.chmod(0o700)
    (short_home / "server" / "server.sock").write_text("not a socket")
    started = servers.start()
    assert started.ready["ok"] is False
    assert "not a socket" in started.ready["error"]["message"]
    assert (short_home / "server" / "server.sock").read_text() == "not a socket"


def test_the_log_holds_no_tokens(server: ServerProcess) -> None:
    with raw_client(server) as client:
        client.request("server.status")
    server.terminate()
    log = (server.home / "server" / "server.log").read_text()
    assert "server started: epoch 1" in log
    assert "token" not in log.lower()


def test_an_unexpected_error_at_start_is_logged_with_its_traceback_and_reported(
    servers: ServerFactory,
) -> None:
    """A bug (here an SQLite error no check expects) is not a crash that leaves nothing: the
    ready report names it and the log, the log has its traceback, and the home is let go."""
    failed = servers.start(env={"PIWF_FAULTS": "server.after_epoch@1=ioerror"})
    assert failed.ready["ok"] is False
    assert failed.ready["error"]["code"] == "serverStart"
    log_path = failed.home / "server" / "server.log"
    assert failed.ready["error"]["message"] == (
        "server did not start: unexpected OperationalError: disk I/O error;"
        f" the traceback is in {log_path}"
    )
    assert failed.process.wait(timeout=15) != 0
    logged = log_path.read_text()
    assert "server did not start: unexpected error" in logged
    assert "Traceback (most recent call last)" in logged and "disk I/O error" in logged
    again = servers.start()
    assert again.ready["ok"] is True, again.ready
