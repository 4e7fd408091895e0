"""Each node attempt's output in its own log, read with ``piwf run logs`` and ``run.logs``.

Real ``piwf server run`` processes execute each run in real runner children; the nodes print
to their real stdout and stderr, the server captures the pipes, and the installed ``piwf``
script, the Python ``Client`` and a raw protocol client read the logs back.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.errors import NotFoundError, RejectedError
from piwf.protocol.log_payloads import MAX_LOG_CHUNK_BYTES, LogCursor
from piwf.server.children.capture import (
    ATTEMPT_LOG_CAP,
    ATTEMPT_LOG_TAIL,
    head_marker,
    tail_marker,
)
from tests.cli_process import PIWF
from tests.server.harness import (
    WITH_DEFAULT_SIGINT,
    ServerFactory,
    ServerProcess,
    raw_client,
    runner_processes,
    wait_for,
)
from tests.server.test_content_refs import cli_json, piwf_cli, write
from tests.server.test_execution import FAST

TWO_NODES = """
import sys
from piwf.workflow import compute, define_workflow


def first(ctx):
    print("first says hello")
    print("first complains", file=sys.stderr)
    print("first again")
    return {"n": 1}


def second(ctx):
    print("second says hello")
    return {"n": 2}


workflow = define_workflow(
    name="two",
    start_at="first",
    nodes={"first": compute(run=first), "second": compute(run=second)},
    edges=[{"from": "first", "to": "second"}],
)
"""

FIRST_BYTES = len("first says hello\nfirst complains\nfirst again\n")

#: 300 KiB of output: past the attempt cap (256 KiB), under the runner's cap (1 MiB).
LOUD = """
import sys
from piwf.workflow import compute, define_workflow


def loud(ctx):
    for line in range(300):
        sys.stdout.write(f"{line:04d}" + "y" * 1019 + "\\n")
    return {"loud": True}


workflow = define_workflow(
    name="loud", start_at="loud", nodes={"loud": compute(run=loud)}, edges=[]
)
"""
LOUD_BYTES = 300 * 1024
#: LOUD's lines as it prints them, 1 KiB each.
LOUD_LINES = [f"{line:04d}".encode() + b"y" * 1019 + b"\n" for line in range(300)]

#: The first attempt prints and kills its own runner; the crash retry prints and completes.
CRASH_ONCE = """
import os, pathlib, signal
from piwf.workflow import compute, define_workflow

MARK = pathlib.Path({mark!r})


def flaky(ctx):
    if not MARK.exists():
        MARK.touch()
        print("attempt one was here", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    print("attempt two was here")
    return {{"ok": True}}


workflow = define_workflow(
    name="flaky", start_at="flaky", nodes={{"flaky": compute(run=flaky)}}, edges=[]
)
"""

#: The first node prints, then waits (bounded) until the test opens the gate.
GATED = """
import pathlib, sys, time
from piwf.workflow import compute, define_workflow

GATE = pathlib.Path({gate!r})


def gated(ctx):
    print("before the gate", flush=True)
    deadline = time.monotonic() + 120
    while not GATE.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("after the gate")
    return {{"opened": GATE.exists()}}


def last(ctx):
    print("the last node")
    return {{}}


workflow = define_workflow(
    name="gated",
    start_at="gated",
    nodes={{"gated": compute(run=gated), "last": compute(run=last)}},
    edges=[{{"from": "gated", "to": "last"}}],
)
"""


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(home=server.home, autostart=False) as connected:
        yield connected


def interleaves(text: str, out: str, err: str) -> bool:
    """Whether ``text`` is the lines of ``out`` and ``err``, each kept in its own order."""
    lines, out_lines, err_lines = (part.splitlines() for part in (text, out, err))
    for line in lines:
        if out_lines and line == out_lines[0]:
            out_lines.pop(0)
        elif err_lines and line == err_lines[0]:
            err_lines.pop(0)
        else:
            return False
    return not out_lines and not err_lines


def run_to_end(client: Client, workflow: str) -> str:
    run = client.start_run(workflow)
    receipt = client.wait_run(run.run_id, timeout_s=60)
    assert receipt.run.status == "completed", receipt
    return run.run_id


def test_two_nodes_logs_appear_under_their_own_headers_in_order(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    run_id = run_to_end(client, write(tmp_path, "two", TWO_NODES))

    first_out, first_err = "first says hello\nfirst again\n", "first complains\n"
    second_text = "second says hello\n"
    shown = piwf_cli(server, "run", "logs", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines(keepends=True)
    assert lines[0] == (
        f"== first (visit 1, attempt 1) completed: stdout {len(first_out)} B, "
        f"stderr {len(first_err)} B ==\n"
    )
    # Each stream in its own order; between the two streams, as the server read them.
    first_text = "".join(lines[1:4])
    assert interleaves(first_text, first_out, first_err), first_text
    assert lines[4:] == [
        f"== second (visit 1, attempt 1) completed: stdout {len(second_text)} B ==\n",
        second_text,
    ]

    only_second = piwf_cli(server, "run", "logs", run_id, "--node", "second")
    assert only_second.returncode == 0, only_second.stderr
    assert only_second.stdout == (
        f"== second (visit 1, attempt 1) completed: stdout {len(second_text)} B ==\n{second_text}"
    )

    document = cli_json(server, "run", "logs", run_id)
    assert (document["runId"], document["runStatus"], document["terminal"]) == (
        run_id,
        "completed",
        True,
    )
    described = [
        (a["log"], a["nodePath"], a["visit"], a["attempt"], a["streams"], a["text"])
        for a in document["attempts"]
    ]
    assert described == [
        (1, "first", 1, 1, ["stdout", "stderr"], first_text),
        (2, "second", 1, 1, ["stdout"], second_text),
    ]
    first = document["attempts"][0]
    counts = (first["stdoutBytes"], first["stderrBytes"], first["keptBytes"])
    assert counts == (len(first_out), len(first_err), len(first_text))
    assert first["droppedBytes"] == 0

    # The files: private, under a private directory, named relative to the home in the
    # database; the runner logs and the server log hold none of the nodes' output.
    logs_root = server.home / "logs"
    assert stat.S_IMODE(logs_root.stat().st_mode) == 0o700
    assert stat.S_IMODE((logs_root / run_id).stat().st_mode) == 0o700
    files = sorted((logs_root / run_id).iterdir())
    assert len(files) == 2
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
    for path in [*(server.home / "server").rglob("*.log"), server.home / "server" / "server.log"]:
        assert b"says hello" not in path.read_bytes(), path


#: The first node prints nothing; the second prints one line.
QUIET_THEN_LOUD = """
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="quiet",
    start_at="quiet",
    nodes={
        "quiet": compute(lambda ctx: {"n": 1}),
        "talks": compute(lambda ctx: print("talks says hello") or {"n": 2}),
    },
    edges=[{"from": "quiet", "to": "talks"}],
)
"""


def test_an_attempt_that_prints_nothing_has_an_empty_log_and_no_file(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    run_id = run_to_end(client, write(tmp_path, "quiet", QUIET_THEN_LOUD))

    page = client.run_logs_page(run_id)
    described = [(a.log, a.node_path, a.size, a.stdout_bytes, a.data) for a in page.attempts]
    hello = "talks says hello\n"
    encoded = base64.b64encode(hello.encode()).decode()
    assert described == [(1, "quiet", 0, 0, ""), (2, "talks", len(hello), len(hello), encoded)]
    shown = piwf_cli(server, "run", "logs", run_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "== quiet (visit 1, attempt 1) completed: no output =="
    # Only the attempt that printed has a file.
    files = [path.name for path in (server.home / "logs" / run_id).iterdir()]
    assert len(files) == 1, files


def test_an_attempt_log_that_cannot_be_made_leaves_the_output_in_the_runner_log(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    # The logs root is a file: no attempt's directory can be made under it.
    (server.home / "logs").write_bytes(b"not a directory")
    run_id = run_to_end(client, write(tmp_path, "two", TWO_NODES))

    page = client.run_logs_page(run_id)
    assert [(a.node_path, a.size, a.data) for a in page.attempts] == [
        ("first", 0, ""),
        ("second", 0, ""),
    ]
    runner_logs = b"".join(p.read_bytes() for p in (server.home / "server").rglob("*.log"))
    assert b"first says hello" in runner_logs and b"second says hello" in runner_logs
    server_log = (server.home / "server" / "server.log").read_text()
    assert f"attempt log 1 of run {run_id} not opened" in server_log
    assert "says hello" not in server_log


def test_an_attempt_past_its_cap_keeps_its_head_and_its_last_words_and_the_run_completes(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    run_id = run_to_end(client, write(tmp_path, "loud", LOUD))

    (log,) = client.read_run_logs(run_id).attempts
    head, tail = ATTEMPT_LOG_CAP - ATTEMPT_LOG_TAIL, ATTEMPT_LOG_TAIL
    kept_head, kept_tail = LOUD_LINES[: head // 1024], LOUD_LINES[-(tail // 1024) :]
    markers = head_marker(head, tail) + tail_marker(LOUD_BYTES - ATTEMPT_LOG_CAP, tail)
    assert log.data == b"".join(kept_head) + markers + b"".join(kept_tail)
    assert log.data.endswith(LOUD_LINES[-1])  # the last line printed is kept
    info = log.info
    assert (info.stdout_bytes, info.kept_bytes) == (LOUD_BYTES, ATTEMPT_LOG_CAP)
    assert info.dropped_bytes == LOUD_BYTES - ATTEMPT_LOG_CAP

    # One page carries at most 256 KiB; the next one goes on from its cursor.
    page = client.run_logs_page(run_id)
    assert len(base64.b64decode(page.attempts[0].data)) == MAX_LOG_CHUNK_BYTES
    assert page.more is True and page.cursor == LogCursor(log=1, offset=MAX_LOG_CHUNK_BYTES)
    rest = client.run_logs_page(run_id, cursor=page.cursor)
    assert base64.b64decode(rest.attempts[0].data) == log.data[MAX_LOG_CHUNK_BYTES:]
    assert rest.more is False

    shown = piwf_cli(server, "run", "logs", run_id)
    header = shown.stdout.splitlines()[0]
    assert header == (
        f"== loud (visit 1, attempt 1) completed: stdout {LOUD_BYTES} B; "
        f"{LOUD_BYTES - ATTEMPT_LOG_CAP} B dropped past the cap =="
    )


def test_a_crash_retry_gets_its_own_log_and_the_crashed_attempt_keeps_its_output(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    source = CRASH_ONCE.format(mark=str(tmp_path / "crashed-once"))
    run_id = run_to_end(client, write(tmp_path, "flaky", source))

    logs = client.read_run_logs(run_id, node="flaky").attempts
    assert [(log.info.attempt, log.info.status, log.text) for log in logs] == [
        (1, "interrupted", "attempt one was here\n"),
        (2, "completed", "attempt two was here\n"),
    ]
    # The crashed attempt's counts were stored at its runner's exit.
    written = len("attempt one was here\n")
    assert (logs[0].info.stdout_bytes, logs[0].info.kept_bytes) == (written, written)


def test_an_attempt_a_killed_server_never_counted_shows_the_size_of_what_it_kept(
    servers: ServerFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    first = servers.start(env=FAST)
    with Client(home=first.home, autostart=False) as client:
        run = client.start_run(write(tmp_path, "gated", GATED.format(gate=str(gate))))
        # The whole line: print() may write the text and its newline in two writes, and the
        # size the next server reports is what the file held when the runner ended.
        wait_for(
            lambda: any(
                "before the gate\n" in log.text
                for log in client.read_run_logs(run.run_id, node="gated").attempts
            ),
            timeout_s=30,
        )
    first.kill()  # its counts are stored when an attempt ends: these never were
    gate.touch()
    second = servers.start(env=FAST)
    with Client(home=second.home, autostart=False) as client:
        assert client.wait_run(run.run_id, timeout_s=60).run.status == "completed"
    shown = piwf_cli(second, "run", "logs", run.run_id, "--node", "gated")
    assert shown.returncode == 0, shown.stderr
    kept = len("before the gate\n")
    assert (
        f"== gated (visit 1, attempt 1) interrupted: {kept} B, not counted by stream"
        in shown.stdout
    ), shown.stdout
    assert "no output" not in shown.stdout


def _read_until(process: subprocess.Popen[bytes], wanted: bytes, timeout_s: float) -> bytes:
    """Read the process's stdout until ``wanted`` appears (bounded by ``timeout_s``)."""
    assert process.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout_s
    while wanted not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {wanted!r} within {timeout_s} s; read {seen[-500:]!r}")
        readable, _, _ = select.select([process.stdout], [], [], remaining)
        if readable:
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"the follower ended before {wanted!r}; read {seen!r}")
            seen += chunk
    return seen


def _follower(server: ServerProcess, run_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", WITH_DEFAULT_SIGINT, str(PIWF), "run", "logs", run_id, "--follow"],
        # faulthandler: a follower that does not end in time is asked for its threads' stacks.
        env={**os.environ, "PIWF_HOME": str(server.home), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


_SIGNAL_FIELDS = ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")


def _signal_state(pid: int) -> str:
    """Each thread's blocked, pending, ignored and caught signal masks (``/proc``), for a
    failure message."""
    lines = []
    for status in sorted(Path(f"/proc/{pid}/task").glob("*/status")):
        with suppress(OSError):
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines())
            masks = " ".join(f"{key}={fields[key].strip()}" for key in _SIGNAL_FIELDS)
            lines.append(f"thread {status.parent.name}: {masks}")
    return "\n".join(lines)


def _exit_status(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    """The process's exit status within ``timeout_s``; else fail with its threads' signal masks
    and what every thread was doing (SIGABRT makes faulthandler print the stacks)."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        masks = _signal_state(process.pid)
        process.send_signal(signal.SIGABRT)
        process.wait(timeout=10)
        assert process.stderr is not None
        stacks = process.stderr.read().decode(errors="replace")
        raise AssertionError(
            f"still running after {timeout_s} s; signal masks:\n{masks}\nits threads:\n{stacks}"
        ) from None


def _reap(process: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def test_follow_prints_output_while_the_run_runs_and_exits_when_it_completes(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    run = client.start_run(write(tmp_path, "gated", GATED.format(gate=str(gate))))
    follower = _follower(server, run.run_id)
    interrupted = _follower(server, run.run_id)
    try:
        seen = _read_until(follower, b"before the gate\n", timeout_s=60)
        assert seen == b"== gated (visit 1, attempt 1) running ==\nbefore the gate\n"
        assert client.get_run(run.run_id).run.status == "running"  # the gate is still shut

        # Ctrl-C stops a follower cleanly with 130.
        _read_until(interrupted, b"before the gate\n", timeout_s=60)
        os.killpg(interrupted.pid, signal.SIGINT)
        assert _exit_status(interrupted, timeout_s=30) == 130
        assert interrupted.stderr is not None and b"Traceback" not in interrupted.stderr.read()

        gate.touch()
        seen += _read_until(follower, b"the last node\n", timeout_s=60)
        assert _exit_status(follower, timeout_s=60) == 0
        assert follower.stdout is not None
        seen += follower.stdout.read()
    finally:
        _reap(follower)
        _reap(interrupted)
    gated_lines = (
        b"== gated (visit 1, attempt 1) running ==\nbefore the gate\nafter the gate\n"
        b"== gated (visit 1, attempt 1) completed: stdout 31 B ==\n"
    )
    # "last" is first seen running (then a line says how it ended) or already completed.
    assert seen == gated_lines + (
        b"== last (visit 1, attempt 1) running ==\nthe last node\n"
        b"== last (visit 1, attempt 1) completed: stdout 14 B ==\n"
    ) or seen == gated_lines + (
        b"== last (visit 1, attempt 1) completed: stdout 14 B ==\nthe last node\n"
    )
    assert client.get_run(run.run_id).run.status == "completed"


def test_follow_shows_how_an_attempt_whose_runner_was_killed_ended(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    run = client.start_run(write(tmp_path, "gated", GATED.format(gate=str(gate))))
    follower = _follower(server, run.run_id)
    try:
        seen = _read_until(follower, b"before the gate\n", timeout_s=60)
        (runner,) = runner_processes(server.home)
        runner.kill()
        # The crash retry runs the node again as attempt 2; the follower first says how
        # attempt 1 ended, not leaving its "running" header as the last word on it.
        seen += _read_until(follower, b"attempt 2) running ==\nbefore the gate\n", timeout_s=60)
        gate.touch()
        assert _exit_status(follower, timeout_s=60) == 0
        assert follower.stdout is not None
        seen += follower.stdout.read()
    finally:
        _reap(follower)
    lines = seen.decode().splitlines()
    assert lines[:4] == [
        "== gated (visit 1, attempt 1) running ==",
        "before the gate",
        "== gated (visit 1, attempt 1) interrupted: stdout 16 B ==",
        "== gated (visit 1, attempt 2) running ==",
    ], lines
    assert "== gated (visit 1, attempt 2) completed: stdout 31 B ==" in lines
    assert client.get_run(run.run_id).run.status == "completed"


def test_a_prune_removes_the_log_files_of_the_runs_it_deletes(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    run_id = run_to_end(client, write(tmp_path, "two", TWO_NODES))
    directory = server.home / "logs" / run_id
    assert len(list(directory.iterdir())) == 2

    cutoff = int(time.time() * 1000) + 60_000  # every finished run is older than this
    # Its runner's exit is recorded just after the run ends; until then the tree is protected.
    wait_for(lambda: client.prune_preview(cutoff).tree_count == 1, what="the tree unprotected")
    report = client.prune(cutoff, tmp_path / "before-prune.sqlite")
    assert report.tree_count == 1, report.protected
    wait_for(lambda: not directory.exists(), what="the pruned run's log directory removed")
    with pytest.raises(NotFoundError):
        client.run_logs_page(run_id)


def test_bad_log_reads_are_typed_errors_that_change_nothing(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    run_id = run_to_end(client, write(tmp_path, "two", TWO_NODES))
    before = client.get_run(run_id).run.revision

    with pytest.raises(NotFoundError) as unknown_run:
        client.run_logs_page("run-doesnotexist")
    assert unknown_run.value.error_code == "runNotFound"
    assert "piwf run list" in str(unknown_run.value)

    with pytest.raises(NotFoundError) as unknown_node:
        client.run_logs_page(run_id, node="third")
    assert unknown_node.value.error_code == "nodeNotFound"
    assert "its nodes: first, second" in str(unknown_node.value)

    with pytest.raises(RejectedError) as past_end:
        client.run_logs_page(run_id, cursor=LogCursor(log=1, offset=FIRST_BYTES + 1))
    assert past_end.value.error_code == "logCursor"
    with pytest.raises(RejectedError) as no_such_log:
        client.run_logs_page(run_id, cursor=LogCursor(log=3, offset=0))
    assert no_such_log.value.error_code == "logCursor"

    with raw_client(server) as raw:
        for cursor in (
            {"log": 1, "offset": -1},
            {"log": 0, "offset": 0},
            {"log": 1, "offset": 1.5},
        ):
            answer = raw.request("run.logs", {"cursor": cursor}, run_id=run_id)
            assert answer.outcome == "rejected", answer
            assert answer.error is not None and answer.error.code == "invalidPayload"
        huge = raw.request("run.logs", {"cursor": {"log": 1, "offset": 2**53 - 1}}, run_id=run_id)
        assert huge.outcome == "rejected" and huge.error is not None
        assert huge.error.code == "logCursor"
        too_much = raw.request("run.logs", {"maxBytes": MAX_LOG_CHUNK_BYTES + 1}, run_id=run_id)
        assert too_much.error is not None and too_much.error.code == "invalidPayload"
        no_run = raw.request("run.logs", {})
        assert no_run.error is not None and no_run.error.code == "invalidPayload"

    unknown = piwf_cli(server, "run", "logs", run_id, "--node", "third", "--json")
    assert unknown.returncode == 1
    assert json.loads(unknown.stdout)["error"]["code"] == "nodeNotFound"
    assert client.get_run(run_id).run.revision == before
    assert len(client.read_run_logs(run_id).attempts) == 2
