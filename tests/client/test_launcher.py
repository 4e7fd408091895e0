"""The launcher's ready protocol, with small scripts standing in for the server process."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.client import launcher
from piwf.config import ServerPaths
from piwf.errors import ServerRunningError, ServerStartError

# argv: ready-fd, mode, pid file. Writes its pid (and PIWF_HOME) first, then acts out `mode`.
FAKE_SERVER = r"""
import os, signal, sys
fd, mode, pid_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(pid_file + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {os.environ['PIWF_HOME']}")
os.rename(pid_file + ".tmp", pid_file)
log = os.path.join(os.environ["PIWF_HOME"], "server", "server.log")
if mode == "ok":
    os.write(fd, b'{"epoch":7,"ok":true,"pid":%d}\n' % os.getpid())
    os.close(fd)
    signal.pause()
elif mode == "running":
    os.write(fd, b'{"error":{"code":"serverRunning","message":"held by epoch 3"},"ok":false}\n')
    sys.exit(1)
elif mode == "refused":
    os.write(fd, b'{"error":{"code":"serverStart","message":"state is incompatible"},"ok":false}\n')
    sys.exit(1)
elif mode == "dies":
    with open(log, "a") as f:
        f.write("ERROR cannot open the state database\n")
    sys.exit(3)
elif mode == "garbage":
    os.write(fd, b"ready!\n")
    signal.pause()
else:  # silent: never reports
    signal.pause()
"""


@pytest.fixture
def fake_server(
    tmp_path: Path, short_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Path]]:
    """Make the launcher run FAKE_SERVER; kill whatever it started at the end."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    pid_file = tmp_path / "pid"
    ServerPaths(short_home).server_dir.mkdir(parents=True)
    state = {"mode": Path("ok"), "pid_file": pid_file}

    def command(ready_fd: int, **options: object) -> list[str]:
        return [sys.executable, str(script), str(ready_fd), str(state["mode"]), str(pid_file)]

    monkeypatch.setattr(launcher, "server_command", command)
    yield state
    if pid_file.exists():
        pid = int(pid_file.read_text().split()[0])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def started_pid(state: dict[str, Path]) -> int:
    return int(state["pid_file"].read_text().split()[0])


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ready_line_returns_pid_and_epoch_of_a_detached_server(
    fake_server: dict[str, Path], short_home: Path
) -> None:
    started = launcher.start_server(short_home, timeout_s=10)
    pid = started_pid(fake_server)
    assert started == launcher.ServerStarted(pid=pid, epoch=7)
    assert os.getsid(pid) == pid, "the server must lead its own session"
    for fd in (0, 1, 2):
        assert Path(f"/proc/{pid}/fd/{fd}").readlink() == Path("/dev/null")
    assert fake_server["pid_file"].read_text().split()[1] == str(short_home)


def test_another_running_server_is_reported_and_ensure_accepts_it(
    fake_server: dict[str, Path], short_home: Path
) -> None:
    fake_server["mode"] = Path("running")
    with pytest.raises(ServerRunningError, match="held by epoch 3"):
        launcher.start_server(short_home, timeout_s=10)
    assert not is_running(started_pid(fake_server))
    assert launcher.ensure_server(short_home, timeout_s=10) is None


def test_a_refusal_is_a_start_error_with_the_servers_reason(
    fake_server: dict[str, Path], short_home: Path
) -> None:
    fake_server["mode"] = Path("refused")
    with pytest.raises(ServerStartError, match="state is incompatible"):
        launcher.ensure_server(short_home, timeout_s=10)


def test_death_without_a_ready_line_quotes_the_new_log_lines(
    fake_server: dict[str, Path], short_home: Path
) -> None:
    log = ServerPaths(short_home).log
    log.write_text("ERROR an old failure from last week\n")
    fake_server["mode"] = Path("dies")
    with pytest.raises(ServerStartError) as caught:
        launcher.start_server(short_home, timeout_s=10)
    message = str(caught.value)
    assert "exited with status 3" in message
    assert "cannot open the state database" in message
    assert "old failure" not in message


@pytest.mark.parametrize("mode", ["silent", "garbage"])
def test_a_server_that_does_not_report_properly_is_killed(
    fake_server: dict[str, Path], short_home: Path, mode: str
) -> None:
    fake_server["mode"] = Path(mode)
    with pytest.raises(ServerStartError, match="stopped"):
        launcher.start_server(short_home, timeout_s=0.5 if mode == "silent" else 10)
    assert not is_running(started_pid(fake_server))


def test_server_command_passes_options() -> None:
    argv = launcher.server_command(5, max_workers=2, idle_exit_s=1.5)
    assert argv[:3] == [sys.executable, "-m", "piwf"]
    assert argv[3:] == [
        "server",
        "run",
        "--ready-fd",
        "5",
        "--max-workers",
        "2",
        "--idle-exit",
        "1.5",
    ]
    assert launcher.server_command(3)[3:] == ["server", "run", "--ready-fd", "3"]


def test_socket_path_is_under_the_server_directory(short_home: Path) -> None:
    assert launcher.socket_path(short_home) == short_home / "server" / "server.sock"
    assert launcher.socket_path() == short_home / "server" / "server.sock"
