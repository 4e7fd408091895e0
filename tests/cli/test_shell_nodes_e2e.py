"""Shell nodes against a real server, through the installed script: deadlines and stubborn
commands.

A shell node's deadline is kept by the engine inside the runner (SIGTERM to the command's
group, SIGKILL after a grace, then the node ends ``timed_out``); the server's own kill of an
overdue runner is only a backstop for a runner that cannot report. A command that ignores
SIGTERM must still end the node ``timed_out`` once, not kill its runner and run again.
"""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

import psutil

from tests.cli.test_cli_e2e import Piwf, piwf, processes_of  # noqa: F401 (the fixture)
from tests.server.harness import wait_for

DEADLINE_S = 30.0


def sleepers(piwf: Piwf) -> list[psutil.Process]:  # noqa: F811
    """Live processes of the home that a test command started to sleep."""
    found = []
    for process in processes_of(piwf.home):
        with contextlib.suppress(psutil.Error):
            if "sleep" in " ".join(process.cmdline()):
                found.append(process)
    return found


STUBBORN = """
    from piwf.workflow import define_workflow, idempotent_effect, shell

    SCRIPT = 'trap "" TERM; echo started >> {log}; sleep 60 & wait; sleep 60'

    workflow = define_workflow(
        name="stubborn",
        start_at="stubborn",
        nodes={{
            "stubborn": shell(
                effect=idempotent_effect("stubborn.run"),
                command=["sh", "-c", SCRIPT],
                timeout_ms=1000,
            ),
        }},
        edges=[],
    )
    """


def test_a_command_that_ignores_sigterm_times_out_once_and_leaves_no_process(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    log = tmp_path / "started.log"
    flow = tmp_path / "stubborn.py"
    flow.write_text(textwrap.dedent(STUBBORN.format(log=log)).lstrip())
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    waited = piwf.json("run", "wait", run_id, "--timeout", str(DEADLINE_S), exit_code=1)
    assert waited["run"]["status"] == "timed_out", waited
    assert log.read_text().splitlines() == ["started"], "the command ran exactly once"
    steps = piwf.json("run", "steps", run_id)["steps"]
    assert [(s["path"], s["outcome"], s["attempt"]) for s in steps] == [
        ("stubborn", "timed_out", 1)
    ]
    wait_for(lambda: not sleepers(piwf), DEADLINE_S, "the command's processes to end")


DAEMON = """
    import sys

    from piwf.workflow import define_workflow, idempotent_effect, shell

    # The command starts a process in a session of its own that keeps the command's stdout
    # and stderr open for a minute, then exits at once.
    SCRIPT = (
        "import subprocess, sys; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "start_new_session=True); "
        "print('done')"
    )

    workflow = define_workflow(
        name="daemon",
        start_at="start",
        nodes={
            "start": shell(
                effect=idempotent_effect("daemon.start"), command=[sys.executable, "-c", SCRIPT]
            ),
        },
        edges=[],
    )
    """


def test_a_command_whose_daemon_keeps_its_output_open_ends_when_the_command_exits(
    piwf: Piwf,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow = tmp_path / "daemon.py"
    flow.write_text(textwrap.dedent(DAEMON).lstrip())
    run_id = piwf.json("run", "start", str(flow))["run"]["runId"]
    waited = piwf.json("run", "wait", run_id, "--timeout", "20")
    assert waited["run"]["status"] == "completed", waited
    assert waited["output"]["stdout"] == "done\n"
    assert waited["output"]["exit_code"] == 0
    wait_for(lambda: not sleepers(piwf), DEADLINE_S, "the daemon to be ended with its node")
