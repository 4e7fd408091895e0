"""State homes a server cannot use, met by the installed script as a user meets them.

A home, server directory or state file this user cannot write: ``piwf server start``, ``piwf
server run`` and a client's auto-start all refuse it as ``stateIo``, naming the path and what
to do, and change nothing (no ``-wal``/``-shm`` appears beside a read-only file). A start
failure is printed once. A home whose socket path the OS cannot hold is not even created.

The unwritable cases run the commands as an ordinary user: ``nobody`` (uid 65534) when that
user can run this interpreter, else root without capabilities (``setpriv --bounding-set=-all``),
whom the mode bits of root's own files then bind like any owner. Both need root (CI runs as
root) and ``setpriv``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.cli.test_cli_e2e import Piwf, processes_of, wait_gone
from tests.cli_process import PIWF
from tests.server.harness import NOBODY_UID
from tests.state.files import snapshot


@cache
def ordinary_user() -> tuple[int, tuple[str, ...]]:
    """The uid the unwritable cases run as and the command prefix that runs as it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run commands as another user (CI runs as root)")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv(1) is not installed")
    nobody = (setpriv, f"--reuid={NOBODY_UID}", f"--regid={NOBODY_UID}", "--clear-groups")
    # What a start does as that user: import piwf, then run this interpreter again.
    starts_a_server = (
        "import subprocess, sys, piwf.server.lifecycle; "
        "sys.exit(subprocess.run([sys.executable, '-c', 'import piwf.cli']).returncode)"
    )
    usable = subprocess.run(
        [*nobody, sys.executable, "-c", starts_a_server],
        capture_output=True,
        cwd="/",
        timeout=60,
        check=False,
    )
    if usable.returncode == 0:
        return NOBODY_UID, nobody
    return 0, (setpriv, "--bounding-set=-all", "--inh-caps=-all")


class UserPiwf(Piwf):
    """The console script run as :func:`ordinary_user`."""

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        _, prefix = ordinary_user()
        return subprocess.run(
            [*prefix, str(PIWF), *args],
            env=self.env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def user_piwf() -> Iterator[UserPiwf]:
    """A home of the ordinary user with the files a server leaves (it ran once and stopped);
    at the end every mode is restored, the server stopped and every process of it killed."""
    uid, _ = ordinary_user()
    root = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    root.chmod(0o755)
    cli = UserPiwf(root / "h")
    cli.env["HOME"] = str(root)
    cli.home.mkdir(mode=0o700)
    os.chown(cli.home, uid, uid)
    try:
        cli.json("server", "start")
        cli.json("server", "stop")
        yield cli
    finally:
        for path in [cli.home, *cli.home.rglob("*")]:
            os.chown(path, uid, uid, follow_symlinks=False)
            path.chmod(0o700 if path.is_dir() else 0o600)
        with contextlib.suppress(subprocess.TimeoutExpired):
            cli.run("server", "stop")
        for process in processes_of(cli.home):
            if process.pid != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                wait_gone(process.pid, 10)
        shutil.rmtree(root, ignore_errors=True)


def crash_server(cli: UserPiwf) -> None:
    """Start a server and SIGKILL it, so its -wal and -shm stay beside the database."""
    pid = cli.json("server", "start")["pid"]
    os.killpg(pid, signal.SIGKILL)
    assert wait_gone(pid, 10)
    assert (cli.home / "state.sqlite-shm").exists()


def state_files(home: Path) -> dict[str, tuple[str, int, int]]:
    """The database files of ``home`` (not the server's log and lock, which a failed start
    rewrites)."""
    return {name: kept for name, kept in snapshot(home).items() if "/" not in name}


def unwritable_home(cli: UserPiwf) -> tuple[Path, str]:
    cli.home.chmod(0o500)
    return cli.home, f"the state home {cli.home} is not writable by this user"


def unwritable_server_directory(cli: UserPiwf) -> tuple[Path, str]:
    (cli.home / "server").chmod(0o500)
    return cli.home / "server", f"the server directory {cli.home}/server is not writable"


def read_only_database(cli: UserPiwf) -> tuple[Path, str]:
    (cli.home / "state.sqlite").chmod(0o400)
    return cli.home / "state.sqlite", f"{cli.home}/state.sqlite is not writable by this user"


def read_only_wal(cli: UserPiwf) -> tuple[Path, str]:
    crash_server(cli)
    (cli.home / "state.sqlite-wal").chmod(0o400)
    return cli.home / "state.sqlite-wal", f"{cli.home}/state.sqlite-wal is not writable"


def shm_of_another_user(cli: UserPiwf) -> tuple[Path, str]:
    crash_server(cli)
    uid, _ = ordinary_user()
    other = 0 if uid == NOBODY_UID else NOBODY_UID
    os.chown(cli.home / "state.sqlite-shm", other, other)
    return cli.home / "state.sqlite-shm", f"it belongs to uid {other}; give it to this user"


@pytest.mark.parametrize(
    "make_unwritable",
    [
        unwritable_home,
        unwritable_server_directory,
        read_only_database,
        read_only_wal,
        shm_of_another_user,
    ],
)
def test_what_this_user_cannot_write_is_refused_by_name_and_nothing_changes(
    user_piwf: UserPiwf, make_unwritable: Callable[[UserPiwf], tuple[Path, str]]
) -> None:
    path, says = make_unwritable(user_piwf)
    before = state_files(user_piwf.home)
    uid, _ = ordinary_user()

    started = user_piwf.json("server", "start", exit_code=1)
    assert started["error"]["code"] == "stateIo", started
    message = started["error"]["message"]
    assert says in message
    assert f"(uid {uid})" in message
    assert f" {path}`" in message, "the fix names the path"
    assert message.endswith("or set PIWF_HOME to another directory. Nothing was changed")

    run = user_piwf.run("server", "run")
    assert (run.returncode, run.stdout, run.stderr) == (1, "", f"Error: {message}\n")
    auto_started = user_piwf.json("run", "list", exit_code=1)
    assert auto_started["error"] == started["error"], "a client's auto-start says the same"
    assert user_piwf.json("server", "status") == {"state": "stopped"}
    assert state_files(user_piwf.home) == before


def test_a_start_failure_of_server_run_is_printed_once(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    refused = Piwf(home).run("server", "run")
    assert refused.returncode == 1
    assert refused.stderr == f"Error: {home} has mode 0755; run `chmod 700 {home}`\n"
    as_json = Piwf(home).run("server", "run", "--json")
    assert as_json.stderr == ""
    assert json.loads(as_json.stdout)["error"]["code"] == "unsafeStateHome"


def test_a_home_whose_socket_path_is_too_long_is_never_created(tmp_path: Path) -> None:
    home = tmp_path / ("h" * 120)
    cli = Piwf(home)
    started = cli.json("server", "start", exit_code=1)
    assert started["error"]["code"] == "serverStart"
    message = started["error"]["message"]
    assert "over the OS limit of 107; set PIWF_HOME to a shorter directory" in message
    run = cli.run("server", "run")
    assert run.returncode == 1
    assert run.stderr.count("over the OS limit") == 1
    assert not home.exists()


def test_a_database_of_another_user_is_refused_with_the_fix_and_nothing_changes(
    user_piwf: UserPiwf, tmp_path: Path
) -> None:
    uid, _ = ordinary_user()
    other = 0 if uid == NOBODY_UID else NOBODY_UID
    database = user_piwf.home / "state.sqlite"
    os.chown(database, other, other)
    before = state_files(user_piwf.home)

    started = user_piwf.json("server", "start", exit_code=1)
    assert started["error"] == {
        "code": "unsafeStateHome",
        "message": f"{database} is not this user's (uid {uid}): it belongs to uid {other}; give"
        f" it to this user (`chown {uid} {database}` as root), or set PIWF_HOME to another"
        " directory",
    }
    assert user_piwf.json("run", "list", exit_code=1)["error"] == started["error"]
    assert state_files(user_piwf.home) == before
