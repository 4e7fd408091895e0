"""The lifeline module on its own, in real child processes (it ends the process it runs in).

Each case runs a short Python program in a new session that begins a lifeline and reports what
it saw as one JSON line on stdout; the program's own processes are checked by identity.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import suppress

import pytest

from piwf.processes import is_alive


@pytest.fixture
def programs() -> Iterator[list[subprocess.Popen[str]]]:
    """Programs a test starts; each one's session is killed afterwards, whatever happened."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def run_program(
    programs: list[subprocess.Popen[str]], source: str, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(source)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        pass_fds=pass_fds,
    )
    programs.append(process)
    return process


def report(process: subprocess.Popen[str]) -> dict[str, object]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"the program ended without a report (status {process.wait(timeout=10)})"
    facts: dict[str, object] = json.loads(line)
    return facts


def test_end_descendants_ends_a_subprocess_and_an_adopted_daemon_and_the_process_lives_on(
    programs: list[subprocess.Popen[str]],
) -> None:
    program = run_program(
        programs,
        """
        import json, os, subprocess, sys, time
        from piwf.runner import lifeline
        from piwf.processes import start_identity

        life = lifeline.begin(None, None)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        reader, writer = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(writer, str(os.getpid()).encode())
                time.sleep(60)
            os._exit(0)
        os.waitpid(middle, 0)
        daemon = int(os.read(reader, 64))
        deadline = time.monotonic() + 10
        while start_identity(daemon) is None and time.monotonic() < deadline:
            time.sleep(0.005)
        identities = [start_identity(child.pid), start_identity(daemon)]
        adopted = open(f"/proc/{daemon}/stat").read().rsplit(")", 1)[1].split()[1]
        life.end_descendants()
        print(json.dumps({"identities": identities, "adopted_by": int(adopted),
                          "me": os.getpid()}), flush=True)
        time.sleep(60)
        """,
    )
    facts = report(program)
    identities = facts["identities"]
    assert isinstance(identities, list) and all(isinstance(i, str) for i in identities)
    assert facts["adopted_by"] == facts["me"] == program.pid, "a subreaper adopts the daemon"
    assert not any(is_alive(identity) for identity in identities)
    assert program.poll() is None, "ending its descendants does not end the process"


def test_a_child_forked_by_workflow_code_gets_the_default_sigterm_and_no_wake_up_descriptor(
    programs: list[subprocess.Popen[str]],
) -> None:
    program = run_program(
        programs,
        """
        import json, os, signal
        from piwf.runner import lifeline

        life = lifeline.begin(None, None)
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            seen = {"sigterm": str(signal.getsignal(signal.SIGTERM)),
                    "wakeup": signal.set_wakeup_fd(-1)}
            os.write(writer, json.dumps(seen).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = json.loads(os.read(reader, 4096))
        parent = {"sigterm": str(signal.getsignal(signal.SIGTERM)) != str(signal.SIG_DFL)}
        print(json.dumps({"child": child, "parent": parent}), flush=True)
        """,
    )
    facts = report(program)
    assert facts["child"] == {"sigterm": str(signal.SIG_DFL), "wakeup": -1}
    assert facts["parent"] == {"sigterm": True}, "the process itself keeps its handler"
    assert program.wait(timeout=10) == 0


@pytest.mark.parametrize("trigger", ["end-of-file", "sigterm"])
def test_the_lifeline_ends_the_process_its_subprocess_and_its_daemon(
    programs: list[subprocess.Popen[str]], trigger: str
) -> None:
    """End-of-file on the watched descriptor (the server is gone) or a SIGTERM to the process
    alone (the server's stop): either way the tree goes, the daemon outside the group too."""
    reader, writer = os.pipe()
    try:
        program = run_program(
            programs,
            f"""
            import json, os, subprocess, sys, time
            from piwf.runner import lifeline
            from piwf.processes import start_identity

            life = lifeline.begin({reader}, None)
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            pipe_reader, pipe_writer = os.pipe()
            middle = os.fork()
            if middle == 0:
                os.setsid()
                if os.fork() == 0:
                    os.write(pipe_writer, str(os.getpid()).encode())
                    time.sleep(60)
                os._exit(0)
            os.waitpid(middle, 0)
            daemon = int(os.read(pipe_reader, 64))
            print(json.dumps([start_identity(child.pid), start_identity(daemon)]), flush=True)
            time.sleep(60)
            """,
            pass_fds=(reader,),
        )
    finally:
        os.close(reader)
    try:
        assert program.stdout is not None
        identities = json.loads(program.stdout.readline())
        assert len(identities) == 2 and all(is_alive(identity) for identity in identities)
        if trigger == "sigterm":
            program.send_signal(signal.SIGTERM)  # the watched pipe stays open meanwhile
        else:
            os.close(writer)
            writer = -1
        assert program.wait(timeout=10) == -signal.SIGKILL, "it ended its own group last"
    finally:
        if writer != -1:
            os.close(writer)
    assert not any(is_alive(identity) for identity in identities)


def test_a_parent_gone_before_the_lifeline_began_ends_the_process_at_once(
    programs: list[subprocess.Popen[str]],
) -> None:
    # Pid 1 is never this program's parent here: as if the parent died before it began.
    program = run_program(
        programs,
        """
        import time
        from piwf.runner import lifeline

        lifeline.begin(None, 1)
        time.sleep(60)
        """,
    )
    assert program.wait(timeout=10) == -signal.SIGKILL
