"""The zygote: children forked from a pre-imported interpreter, with the spawn path as fallback.

Three layers. The zygote's own protocol, driven directly (a real ``python -m
piwf.runner.zygote`` on a socket pair): allow-list, descriptor passing, exit reports, end of
file. The supervisor with a zygote forker in this process: fork when ready, spawn otherwise, an
orphan of a dead zygote, the restart. Then real servers: a forked runner completes a run in its
own session with its start identity recorded, output capture and its cap, a killed forked
runner, a killed zygote (its children end with it), a killed server (zygote and runner end
with it), a resolver that dies, and ``PIWF_ZYGOTE=0``. Every
wait polls a condition against a deadline; workflow code reports what it saw in marker files.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf import canonical
from piwf.config import MAX_FRAME_BYTES
from piwf.server.children.supervisor import SpawnedProcess, Supervisor
from piwf.server.children.zygote import ForkedProcess, ZygoteForker
from piwf.server.loop import EventLoop
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for

FAST = {"PIWF_IDLE_EXIT_S": "0", "PIWF_CLAIM_POLL_S": "0.05", "PIWF_RUN_RENEW_S": "0.2"}
HELLO = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py")
_HEADER = struct.Struct("!i")


# -- the zygote's protocol, driven directly ----------------------------------------------------


class ZygoteUnderTest:
    """A zygote process on the test's end of its control socket."""

    def __init__(self) -> None:
        self.control, child_end = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "piwf.runner.zygote", "--fd", str(child_end.fileno())],
            pass_fds=(child_end.fileno(),),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        child_end.close()
        self.inbox = b""

    def frame(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The next frame the zygote sent."""
        while True:
            if len(self.inbox) >= _HEADER.size:
                (length,) = _HEADER.unpack_from(self.inbox)
                assert 0 <= length <= MAX_FRAME_BYTES
                if len(self.inbox) >= _HEADER.size + length:
                    body = self.inbox[_HEADER.size : _HEADER.size + length]
                    self.inbox = self.inbox[_HEADER.size + length :]
                    frame = canonical.decode(body)
                    assert isinstance(frame, dict)
                    return frame
            readable, _, _ = select.select([self.control], [], [], timeout_s)
            assert readable, "the zygote sent nothing in time"
            data = self.control.recv(65536)
            assert data, "the zygote closed its control socket"
            self.inbox += data

    def send(self, frame: dict[str, Any], descriptors: list[int]) -> None:
        body = canonical.encode(frame)
        socket.send_fds(self.control, [_HEADER.pack(len(body)) + body], descriptors)

    def close(self) -> None:
        self.control.close()
        if self.process.poll() is None:
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        assert self.process.stderr is not None
        self.process.stderr.close()


@pytest.fixture
def zygote() -> Iterator[ZygoteUnderTest]:
    started = ZygoteUnderTest()
    try:
        yield started
    finally:
        started.close()


def descriptor_targets(pid: int) -> dict[int, str]:
    """What each open descriptor of ``pid`` points at (``pipe:[N]``, ``socket:[N]``, a path)."""
    targets = {}
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with suppress(OSError):
            targets[int(entry.name)] = str(entry.readlink())
    return targets


def access_modes(pid: int, target: str) -> set[int]:
    """The access modes (``O_RDONLY``, ``O_WRONLY``) of ``pid``'s descriptors of ``target``."""
    modes = set()
    for fd, found in descriptor_targets(pid).items():
        if found == target:
            with suppress(OSError):
                info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
                flags = re.search(r"^flags:\s+([0-7]+)", info, re.MULTILINE)
                assert flags is not None, info
                modes.add(int(flags.group(1), 8) & os.O_ACCMODE)
    return modes


class ChildEnds:
    """The descriptors of one child: its channel pair and one pipe for stdout and stderr."""

    def __init__(self) -> None:
        self.channel, self.child_channel = socket.socketpair()
        self.output, self.child_output = os.pipe()

    @property
    def for_child(self) -> list[int]:
        return [self.child_channel.fileno(), self.child_output, self.child_output]

    def handed_over(self) -> None:
        self.child_channel.close()
        os.close(self.child_output)

    def output_text(self) -> str:
        chunks = []
        while chunk := os.read(self.output, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()

    def close(self) -> None:
        self.channel.close()
        os.close(self.output)


def test_the_zygote_forks_an_entry_module_into_its_own_session_and_reports_its_exit(
    zygote: ZygoteUnderTest, tmp_path: Path
) -> None:
    ready = zygote.frame()
    assert ready == {"kind": "ready", "pid": zygote.process.pid}
    assert " ".join(psutil.Process(zygote.process.pid).cmdline()).strip("\x00 ") == "piwf zygote"
    ends = ChildEnds()
    try:
        zygote.send(
            {"cwd": str(tmp_path), "id": 1, "kind": "fork", "module": "piwf.runner.resolver"},
            ends.for_child,
        )
        ends.handed_over()
        forked = zygote.frame()
        assert forked["kind"] == "forked" and forked["id"] == 1
        pid = forked["pid"]
        # Its own session and group before the answer; its identity taken before any reaping.
        assert os.getsid(pid) == pid and os.getpgid(pid) == pid
        assert forked["identity"].startswith(f"{pid}:")
        child = psutil.Process(pid)
        assert child.ppid() == zygote.process.pid
        # The child moves to its directory and closes what it inherited right after the fork;
        # past its channel it holds only the wake-up pipe its lifeline made (this zygote has no
        # lifeline pipe to pass on).
        wait_for(
            lambda: (
                child.cwd() == str(tmp_path)
                and sorted(descriptor_targets(pid)) == [0, 1, 2, 3, 4, 5]
            ),
            timeout_s=10,
            what="the forked child to set itself up",
        )
        own = descriptor_targets(pid)
        inherited = set(descriptor_targets(zygote.process.pid).values())
        assert own[4] == own[5] and own[4].startswith("pipe:") and own[4] not in inherited
        # The resolver answers one request on its channel (descriptor 3), then exits.
        request = canonical.encode({"workflow": HELLO, "projectPath": None, "stateHome": "/"})
        ends.channel.sendall(_HEADER.pack(len(request)) + request)
        ends.channel.settimeout(30)
        header = ends.channel.recv(_HEADER.size, socket.MSG_WAITALL)
        (length,) = _HEADER.unpack(header)
        reply = canonical.decode(ends.channel.recv(length, socket.MSG_WAITALL))
        assert isinstance(reply, dict) and reply["ok"] is True
        assert reply["workflowName"] == "hello"
        assert zygote.frame() == {"kind": "exited", "pid": pid, "exitCode": 0}
        assert ends.output_text() == ""
    finally:
        ends.close()
    # End of file on the control socket ends the zygote.
    zygote.control.shutdown(socket.SHUT_WR)
    assert zygote.process.wait(timeout=10) == 0


def test_a_module_off_the_allow_list_is_refused_and_a_bad_frame_ends_the_zygote(
    zygote: ZygoteUnderTest,
) -> None:
    assert zygote.frame()["kind"] == "ready"
    for module in ("os", "piwf.server.lifecycle", "piwf.runner.zygote"):
        ends = ChildEnds()
        try:
            zygote.send({"cwd": "/", "id": 7, "kind": "fork", "module": module}, ends.for_child)
            ends.handed_over()
            assert zygote.frame() == {"kind": "refused", "id": 7, "error": "not an entry module"}
            # The zygote closed the descriptors it was given: nothing holds the pipe open.
            assert ends.output_text() == ""
        finally:
            ends.close()
    zygote.send({"kind": "pickle"}, [])
    assert zygote.process.wait(timeout=10) == 2


def test_a_signalled_child_is_reported_with_its_signal(zygote: ZygoteUnderTest) -> None:
    assert zygote.frame()["kind"] == "ready"
    ends = ChildEnds()
    try:
        module = "piwf.runner.workflow_runner"
        zygote.send({"cwd": "/", "id": 1, "kind": "fork", "module": module}, ends.for_child)
        ends.handed_over()
        pid = zygote.frame()["pid"]
        # The child names itself right after the fork; until then it shows the zygote's title.
        wait_for(
            lambda: "piwf.runner.workflow_runner --fd 3" in " ".join(psutil.Process(pid).cmdline()),
            timeout_s=10,
            what="the forked child to take its module's title",
        )
        os.killpg(pid, signal.SIGKILL)
        assert zygote.frame() == {"kind": "exited", "pid": pid, "signal": 9}
    finally:
        ends.close()


# -- the supervisor's side, in this process ----------------------------------------------------


def run_loop_until(loop: EventLoop, condition: Callable[[], object], what: str) -> None:
    """Turn ``loop`` until ``condition`` holds; fail at a deadline."""
    wait_for(lambda: condition() or loop.run_once(), timeout_s=30, what=what)


def test_the_supervisor_forks_when_a_zygote_is_ready_and_spawns_otherwise(tmp_path: Path) -> None:
    loop = EventLoop()
    supervisor = Supervisor(loop, tmp_path / "logs")
    forker = ZygoteForker(loop, supervisor)
    supervisor.forker = forker
    loop.every(0.25, supervisor.poll)
    try:
        # No zygote yet: this child is spawned, and the first zygote starts.
        first = supervisor.start("first", "piwf.runner.resolver")
        assert isinstance(first.process, SpawnedProcess)
        assert psutil.Process(first.pid).ppid() == os.getpid()
        run_loop_until(loop, lambda: forker.ready, "the zygote to be ready")
        assert forker.handle is not None
        zygote = forker.handle.pid
        # A module off the allow-list is never sent to the zygote.
        assert forker.fork("piwf.server.lifecycle", "/", (0, 1, 2)) is None
        second = supervisor.start("second", "piwf.runner.resolver")
        assert isinstance(second.process, ForkedProcess)
        assert psutil.Process(second.pid).ppid() == zygote
        assert second.identity is not None and second.identity.startswith(f"{second.pid}:")
        assert os.getpgid(second.pid) == second.pid == os.getsid(second.pid)
        # The zygote dies: the next child is spawned (no new zygote is ready yet), and the
        # forked one is still supervised as an orphan.
        os.kill(zygote, signal.SIGKILL)
        run_loop_until(loop, lambda: forker.handle is None, "the zygote to be given up")
        third = supervisor.start("third", "piwf.runner.resolver")
        assert isinstance(third.process, SpawnedProcess)
        assert second.process.orphaned
        for handle in (first, second, third):
            supervisor.kill(handle)
        run_loop_until(
            loop,
            lambda: first.exited and second.exited and third.exited,
            "the three children to be seen ended",
        )
        assert first.returncode == third.returncode == -signal.SIGKILL
        assert second.returncode is None, "an orphan's status is unknown"
        # After the backoff a new zygote comes up.
        run_loop_until(loop, lambda: forker.ready, "a new zygote")
        assert forker.handle is not None and forker.handle.pid != zygote
    finally:
        supervisor.stop_all(grace_s=2.0)
        loop.close()
    assert supervisor.children == {}


def test_a_fork_request_without_an_answer_gives_the_zygote_up_and_spawns(tmp_path: Path) -> None:
    loop = EventLoop()
    supervisor = Supervisor(loop, tmp_path / "logs")
    forker = ZygoteForker(loop, supervisor)
    supervisor.forker = forker
    loop.every(0.25, supervisor.poll)
    try:
        supervisor.kill(supervisor.start("first", "piwf.runner.resolver"))
        run_loop_until(loop, lambda: forker.ready, "the zygote to be ready")
        assert forker.handle is not None
        zygote = forker.handle.pid
        os.kill(zygote, signal.SIGSTOP)  # alive, but it will never answer
        child = supervisor.start("second", "piwf.runner.resolver")
        assert isinstance(child.process, SpawnedProcess), "spawned after the fork timeout"
        assert forker.handle is None
        run_loop_until(loop, lambda: gone(zygote), "the silent zygote to be killed")
        supervisor.kill(child)
        run_loop_until(loop, lambda: forker.ready, "a new zygote")
    finally:
        supervisor.stop_all(grace_s=2.0)
        loop.close()
    assert supervisor.children == {}


# -- through a real server ---------------------------------------------------------------------


def write_workflow(directory: Path, name: str, body: str) -> str:
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def facts_workflow(directory: Path, name: str, out: Path, extra: str = "") -> str:
    """A one-node workflow whose node writes what its process looks like to ``out``."""
    return write_workflow(
        directory,
        name,
        f"""
        import json, os, pathlib, sys, time
        from piwf.processes import start_identity
        from piwf.workflow import compute, define_workflow

        def target(fd):
            try:
                return os.readlink(f"/proc/self/fd/{{fd}}")
            except OSError:
                return None  # the descriptor of the directory listing, closed by now

        def facts(ctx):
            pid = os.getpid()
            record = {{
                "pid": pid, "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                "identity": start_identity(pid), "argv": sys.argv, "cwd": os.getcwd(),
                "fds": {{fd: target(fd) for fd in os.listdir("/proc/self/fd")}},
            }}
            pathlib.Path({str(out)!r}).write_text(json.dumps(record))
            {extra}
            return {{"ok": True}}

        workflow = define_workflow(
            name={name!r}, start_at="a", nodes={{"a": compute(facts)}}, edges=[]
        )
        """,
    )


def start(client: RawClient, workflow: str, key: str) -> str:
    response = client.request("run.start", {"workflow": workflow, "input": {"who": "z"}}, key=key)
    assert response.outcome == "accepted", response
    assert response.receipt is not None
    return str(response.receipt["run"]["runId"])


def wait_run(client: RawClient, run_id: str) -> dict[str, Any]:
    response = client.request("run.wait", {"timeoutMs": 30_000}, run_id=run_id)
    assert response.receipt is not None
    run: dict[str, Any] = response.receipt["run"]
    return run


def query(server: ServerProcess, sql: str) -> list[tuple[Any, ...]]:
    from piwf.state import StateDatabase

    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        return [tuple(row) for row in tx.all(sql)]


def zygote_pids(home: Path) -> list[int]:
    """Every zygote the servers of ``home`` reported ready, in order (from the server log)."""
    log = home / "server" / "server.log"
    text = log.read_text() if log.exists() else ""
    return [int(pid) for pid in re.findall(r"zygote ready: pid (\d+)", text)]


def live_zygotes(home: Path) -> list[int]:
    """Live zygote processes of ``home`` (found by title and environment)."""
    found: dict[int, int] = {}  # pid -> parent pid
    for process in psutil.process_iter():
        with suppress(psutil.Error):
            if (
                "piwf zygote" in " ".join(process.cmdline())
                and process.environ().get("PIWF_HOME") == str(home)
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                found[process.pid] = process.ppid()
    # A child forked a moment ago still carries its zygote's title until it names itself.
    return [pid for pid, parent in found.items() if parent not in found]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def warm_server(servers: ServerFactory, env: dict[str, str] | None = None) -> ServerProcess:
    """A server whose zygote is ready (the first run starts it; its children are spawned)."""
    server = servers.start(env={**FAST, **(env or {})})
    assert server.ready["ok"] is True, server.ready
    with raw_client(server, "warm-up") as client:
        assert wait_run(client, start(client, HELLO, "warm-up"))["status"] == "completed"
    wait_for(lambda: zygote_pids(server.home), timeout_s=30, what="the zygote to be ready")
    return server


def read_facts(path: Path) -> dict[str, Any]:
    wait_for(path.exists, timeout_s=30, what=f"{path.name}")
    facts: dict[str, Any] = wait_for(lambda: _json_or_none(path), what=f"{path.name} written")
    return facts


def _json_or_none(path: Path) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except ValueError:
        return None
    return loaded


def test_a_forked_runner_completes_a_run_in_its_own_session_with_its_identity_recorded(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = warm_server(servers)
    (zygote,) = zygote_pids(server.home)
    out = tmp_path / "facts.json"
    project = tmp_path / "project"
    project.mkdir()
    workflow = facts_workflow(tmp_path, "facts", out)
    with raw_client(server) as client:
        response = client.request(
            "run.start",
            {"workflow": workflow, "input": {}, "projectPath": str(project)},
            key="facts",
        )
        assert response.outcome == "accepted", response
        assert response.receipt is not None
        run = wait_run(client, str(response.receipt["run"]["runId"]))
    assert run["status"] == "completed"
    facts = read_facts(out)
    assert facts["ppid"] == zygote, "the runner is a fork of the zygote"
    assert facts["pgid"] == facts["pid"] and facts["sid"] == facts["pid"]
    assert facts["argv"][1:] == ["--fd", "3", "--lifeline-fd", "4", "--parent-pid", str(zygote)]
    assert facts["argv"][0].endswith("workflow_runner.py")
    assert facts["cwd"] == str(project)
    # Only its standard streams, its channel, the server's lifeline pipe (the zygote's copy),
    # its own lifeline wake-up pipe and the directory being listed: nothing of the server
    # (listening socket, clients, database) and nothing else of the zygote.
    descriptors = {int(fd): target for fd, target in facts["fds"].items()}
    assert {0, 1, 2, 3, 4} <= set(descriptors) and len(descriptors) == 8, descriptors
    assert not any("sqlite" in str(target) for target in descriptors.values())
    # The lifeline pipe: the zygote holds its read end only, the server its write end.
    assert access_modes(zygote, descriptors[4]) == {os.O_RDONLY}
    assert os.O_WRONLY in access_modes(server.process.pid, descriptors[4])
    wake = [target for fd, target in descriptors.items() if fd > 4 and target is not None]
    assert len(wake) == 2 and wake[0] == wake[1] and wake[0].startswith("pipe:"), descriptors
    runners = "SELECT pid, process_start_identity, status FROM run_runners ORDER BY started_at"
    wait_for(
        lambda: query(server, runners)[-1] == (facts["pid"], facts["identity"], "exited"),
        what="the forked runner's row: its pid, its start identity and a clean exit",
    )


def test_a_forked_childs_output_is_captured_and_capped(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = warm_server(servers)
    (zygote,) = zygote_pids(server.home)
    out, flooded = tmp_path / "facts.json", tmp_path / "flooded"
    flood = f"""
            if not pathlib.Path({str(flooded)!r}).exists():
                pathlib.Path({str(flooded)!r}).touch()
                print("before the flood", flush=True)
                for _ in range(200):
                    sys.stdout.write("x" * 65536)
                    sys.stdout.flush()"""
    workflow = facts_workflow(tmp_path, "flood", out, extra=flood.strip())
    with raw_client(server) as client:
        run = wait_run(client, start(client, workflow, "flood"))
    assert run["status"] == "completed"
    assert read_facts(out)["ppid"] == zygote
    wait_for(
        lambda: (
            sorted(row[0] for row in query(server, "SELECT status FROM run_runners"))
            == ["crashed", "exited", "exited"]
        ),
        what="the flooded runner killed and its run finished by the next",
    )
    (epoch,) = query(server, "SELECT runner_epoch FROM run_runners WHERE status = 'crashed'")[0]
    log = server.home / "server" / "runners" / f"{epoch}.log"
    assert log.stat().st_size == 1024 * 1024
    assert log.read_bytes().startswith(b"before the flood\nxxxx")


def test_a_killed_forked_runner_is_a_crash_and_the_run_recovers(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = warm_server(servers)
    (zygote,) = zygote_pids(server.home)
    out, entered = tmp_path / "facts.json", tmp_path / "entered"
    workflow = write_workflow(
        tmp_path,
        "killed",
        f"""
        import json, os, pathlib, time
        from piwf.workflow import compute, define_workflow

        def first(ctx):
            return {{"step": 1}}

        def hold(ctx):
            marker = pathlib.Path({str(entered)!r})
            if not marker.exists():
                pathlib.Path({str(out)!r}).write_text(
                    json.dumps({{"pid": os.getpid(), "ppid": os.getppid()}}))
                marker.touch()
                time.sleep(60)  # the test kills this runner here
            return {{"step": 2}}

        workflow = define_workflow(
            name="killed", start_at="first",
            nodes={{"first": compute(first), "hold": compute(hold)}},
            edges=[{{"from": "first", "to": "hold"}}],
        )
        """,
    )
    with raw_client(server) as client:
        run_id = start(client, workflow, "killed")
        facts = read_facts(out)
        assert facts["ppid"] == zygote
        os.kill(facts["pid"], signal.SIGKILL)
        run = wait_run(client, run_id)
    assert run["status"] == "completed"
    rows = "SELECT status, exit_code, signal FROM run_runners ORDER BY started_at"
    wait_for(lambda: query(server, rows)[-1][0] == "exited", what="the second runner's exit")
    assert ("crashed", None, "signal 9") in query(server, rows)


def test_a_killed_zygote_takes_its_running_child_along_and_a_new_one_comes_up(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = warm_server(servers)
    (first_zygote,) = zygote_pids(server.home)
    out, entered, gate = tmp_path / "facts.json", tmp_path / "entered", tmp_path / "gate"
    hold = f"""
            pathlib.Path({str(entered)!r}).touch()
            while not pathlib.Path({str(gate)!r}).exists():
                time.sleep(0.01)"""
    workflow = facts_workflow(tmp_path, "held", out, extra=hold.strip())
    with raw_client(server) as client:
        run_id = start(client, workflow, "held")
        wait_for(entered.exists, timeout_s=30, what="the node")
        runner = read_facts(out)["pid"]
        assert psutil.Process(runner).ppid() == first_zygote
        # The zygote dies under a running child: the kernel's parent-death signal (SIGTERM)
        # ends the child (nothing else would: the server and its lifeline pipe live on), the
        # server sees that end with an unknown status and the run gets a new runner.
        os.kill(first_zygote, signal.SIGKILL)
        wait_for(lambda: gone(runner), what="the zygote's child to end with it")
        wait_for(
            lambda: (
                query(server, f"SELECT status FROM run_runners WHERE pid = {runner}")
                == [("crashed",)]
            ),
            what="the child's end seen (its status is unknown: crashed)",
        )
        wait_for(
            lambda: len(zygote_pids(server.home)) == 2,
            timeout_s=30,
            what="a new zygote after the backoff",
        )
        assert gone(first_zygote)
        gate.touch()
        assert wait_run(client, run_id)["status"] == "completed"
        # The next child is forked by the new zygote.
        second_zygote = zygote_pids(server.home)[-1]
        out.unlink()
        second = facts_workflow(tmp_path, "after", out)
        assert wait_run(client, start(client, second, "after"))["status"] == "completed"
    assert read_facts(out)["ppid"] == second_zygote
    assert live_zygotes(server.home) == [second_zygote]


def test_a_killed_server_leaves_no_zygote_nor_runner_and_its_run_is_recovered(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = warm_server(servers)
    (zygote,) = zygote_pids(server.home)
    out, entered = tmp_path / "facts.json", tmp_path / "entered"
    hold = f"""
            marker = pathlib.Path({str(entered)!r})
            if not marker.exists():
                marker.touch()
                time.sleep(60)  # the runner's lifeline ends it here"""
    workflow = facts_workflow(tmp_path, "orphan", out, extra=hold.strip())
    with raw_client(server) as client:
        run_id = start(client, workflow, "orphan")
    runner = read_facts(out)["pid"]
    assert psutil.Process(runner).ppid() == zygote
    server.kill()
    # The zygote and the runner both end with their server (tests/server/test_orphans.py
    # bounds how fast); the next server recovers the run from its committed state.
    wait_for(lambda: gone(zygote), timeout_s=10, what="the zygote to exit with its server")
    wait_for(lambda: gone(runner), timeout_s=10, what="the runner to exit with its server")
    second = servers.start(env=FAST)
    assert second.ready["ok"] is True, second.ready
    with raw_client(second) as client:
        assert wait_run(client, run_id)["status"] == "completed"
    statuses = "SELECT status FROM run_runners ORDER BY started_at"
    wait_for(
        lambda: query(second, statuses)[-2:] == [("orphaned",), ("exited",)],
        what="the orphan closed by recovery and the run finished by a new runner",
    )
    assert zygote not in live_zygotes(second.home)


def test_a_resolver_that_dies_answers_unavailable_and_stores_nothing(
    servers: ServerFactory, tmp_path: Path
) -> None:
    server = warm_server(servers)
    workflow = write_workflow(
        tmp_path,
        "dies_resolving",
        """
        import os, sys
        from piwf.workflow import compute, define_workflow

        if sys.argv[0].endswith("resolver.py"):  # only inside the resolver child
            os._exit(1)

        workflow = define_workflow(
            name="dies_resolving", start_at="a", nodes={"a": compute(lambda ctx: 1)}, edges=[]
        )
        """,
    )
    with raw_client(server) as client:
        response = client.request("run.start", {"workflow": workflow, "input": {}}, key="dies")
        again = client.request("run.start", {"workflow": workflow, "input": {}}, key="dies")
    for answer in (response, again):
        assert answer.outcome == "unavailable", answer
        assert answer.error is not None and answer.error.code == "resolverFailed"
    assert query(server, "SELECT count(*) FROM runs") == [(1,)], "only the warm-up run"
    receipts = "SELECT count(*) FROM server_commands WHERE idempotency_key = 'dies'"
    assert query(server, receipts) == [(0,)]


def test_with_the_zygote_off_every_child_is_spawned(servers: ServerFactory, tmp_path: Path) -> None:
    server = servers.start(env={**FAST, "PIWF_ZYGOTE": "0"})
    assert server.ready["ok"] is True, server.ready
    out = tmp_path / "facts.json"
    workflow = facts_workflow(tmp_path, "spawned", out)
    with raw_client(server) as client:
        for key in ("one", "two"):
            with suppress(FileNotFoundError):
                out.unlink()
            assert wait_run(client, start(client, workflow, key))["status"] == "completed"
            facts = read_facts(out)
            assert facts["ppid"] == server.process.pid, "spawned by the server itself"
            assert facts["pgid"] == facts["pid"] and facts["sid"] == facts["pid"]
    assert zygote_pids(server.home) == []
    assert live_zygotes(server.home) == []
