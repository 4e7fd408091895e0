"""The ``piwf`` command against a real server, as a user drives it.

Each command runs in its own process: a fork of a process that imported the CLI, calling the
function the installed script calls (tests/cli_process.py; ``TESTS_PIWF_CLI=exec`` starts the
script itself for every command). Each test gets a private ``PIWF_HOME`` under /tmp (short:
the socket path must fit in ``sun_path``); the fixture always runs ``piwf server stop`` and
then kills whatever process still runs for that home, found by its ``PIWF_HOME`` (the server
and any child it started).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from piwf.cli import render
from piwf.client import Client
from piwf.state import StateDatabase
from tests.cli_process import run_piwf
from tests.server.harness import state_violations
from tests.unit.test_lazy_cli import run_probe

REPO = Path(__file__).resolve().parents[2]
HELLO = "fixtures/workflows/hello.py"
COMMAND_TIMEOUT_S = 60


class Piwf:
    """Runs the console script with one state home, from the repository root."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = dict(os.environ, PIWF_HOME=str(home))

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_piwf(args, env=self.env, cwd=REPO, timeout=COMMAND_TIMEOUT_S)

    def json(self, *args: str, exit_code: int = 0) -> Any:
        """Run with --json; check the exit code and that stdout is exactly one document."""
        result = self.run(*args, "--json")
        assert result.returncode == exit_code, (result.stdout, result.stderr)
        assert result.stdout.count("\n") == 1, result.stdout
        return json.loads(result.stdout)


def processes_of(home: Path) -> list[psutil.Process]:
    """Every live process whose environment selects ``home``."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("PIWF_HOME") == str(home):
                found.append(process)
    return found


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait for ``pid`` to exit (a pidfd becomes readable then); True if it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(fd)


@pytest.fixture
def piwf() -> Iterator[Piwf]:
    root = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    cli = Piwf(root / "h")
    try:
        yield cli
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            cli.run("server", "stop")
        for process in processes_of(cli.home):
            if process.pid != os.getpid():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(psutil.Error):
                    process.kill()
                wait_gone(process.pid, 10)
        violations = state_violations(cli.home)
        shutil.rmtree(root, ignore_errors=True)
    assert violations == [], f"the test left a database that fails verify: {violations}"


HOLD = """
import time
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="hold", start_at="hold", nodes={"hold": compute(lambda ctx: time.sleep(120))}, edges=[]
)
"""


def test_a_run_from_start_to_completion_and_a_cancel(piwf: Piwf, tmp_path: Path) -> None:
    assert piwf.json("server", "status") == {"state": "stopped"}

    started = piwf.json(
        "run", "start", HELLO, "--input", '{"who": "Ada"}', "--title", "e2e", "--wait"
    )
    run = started["run"]
    run_id = run["runId"]
    assert run["status"] == "completed"
    assert run["title"] == "e2e"
    assert run["workflowRef"] == str(REPO / HELLO)

    listing = piwf.json("run", "list")
    assert [item["runId"] for item in listing["runs"]] == [run_id]

    detail = piwf.json("run", "show", run_id)
    assert detail["run"]["runId"] == run_id
    assert detail["sources"][0]["sourceRef"] == str(REPO / HELLO)
    assert detail["output"] == {"shouted": "HELLO ADA"}

    status = piwf.json("server", "status")
    assert status["state"] == "running"

    state = piwf.json("state", "status")
    assert state["runs"]["completed"] == 1

    assert piwf.json("state", "verify") == {"valid": True, "violations": []}

    destination = tmp_path / "backup.sqlite"
    backup = piwf.json("state", "backup", str(destination))
    assert backup["destination"] == str(destination)
    assert backup["bytes"] > 0
    assert destination.stat().st_size > 0
    assert piwf.json("state", "verify", str(destination)) == {"valid": True, "violations": []}
    assert sorted(p.name for p in destination.parent.iterdir() if "backup" in p.name) == [
        "backup.sqlite"
    ], "offline verification leaves no -wal or -shm beside the backup"

    hold = tmp_path / "hold.py"
    hold.write_text(HOLD)
    held = piwf.json("run", "start", str(hold))["run"]["runId"]
    cancelled = piwf.json("run", "cancel", held)
    assert cancelled["run"]["status"] == "cancelled"

    waited = piwf.json("run", "wait", held, "--timeout", "5", exit_code=1)
    assert waited["timedOut"] is False
    assert waited["run"]["status"] == "cancelled"

    missing = piwf.json("run", "show", "run-does-not-exist", exit_code=1)
    assert missing["error"]["code"] == "runNotFound"

    stop = piwf.run("server", "stop")
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout == "piwf server stopped\n"
    assert piwf.json("server", "status") == {"state": "stopped"}


FAIL = """
from piwf.workflow import compute, define_workflow


def fail(ctx):
    raise RuntimeError("no")


workflow = define_workflow(name="fail", start_at="f", nodes={"f": compute(fail)}, edges=[])
"""


def test_run_list_prints_the_full_clients_table_from_its_quick_read(
    piwf: Piwf, tmp_path: Path
) -> None:
    # No server yet: the quick read finds none, and the full client starts one as before.
    assert piwf.run("run", "list").stdout == "no runs\n"
    assert piwf.json("server", "status")["state"] == "running"
    piwf.json("run", "start", HELLO, "--input", '{"who": "Ada"}', "--title", "Ada", "--wait")
    (tmp_path / "fail.py").write_text(FAIL)
    piwf.json("run", "start", str(tmp_path / "fail.py"), "--wait", exit_code=1)
    (tmp_path / "hold.py").write_text(HOLD)
    held = piwf.json("run", "start", str(tmp_path / "hold.py"))["run"]["runId"]
    piwf.json("run", "pause", held)

    with Client(home=piwf.home) as client:
        for limit, status in [(50, None), (2, None), (50, "completed"), (50, "failed")]:
            arguments = ["run", "list", "--limit", str(limit)]
            arguments += [] if status is None else ["--status", status]
            found, stdout = run_probe(arguments, ["pydantic"], tmp_path / "imported.json", piwf.env)
            assert found["status"] == 0, stdout
            assert found["heavy"] == [], "the quick path was not taken"
            same = arguments[2:] if limit == 2 else arguments[4:]  # --limit 50 is the default
            expected = render.run_page(client.list_runs(limit=limit, status=status), same)
            assert stdout == expected + "\n"
    paused_row = next(
        line for line in piwf.run("run", "list").stdout.splitlines() if line.startswith(held)
    )
    assert paused_row.split()[1:3] == ["paused", "hold"], paused_row  # not "paused (paused)"


def test_run_list_pages_on_with_the_command_its_table_ends_with(piwf: Piwf) -> None:
    started = [
        piwf.json("run", "start", HELLO, "--input", f'{{"who": "{who}"}}', "--wait")["run"]
        for who in ("a", "b", "c")
    ]
    newest_first = [run["runId"] for run in reversed(started)]
    first = piwf.run("run", "list", "--limit", "2").stdout.splitlines()
    assert [line.split()[0] for line in first[1:3]] == newest_first[:2]
    assert first[-1] == (
        f"(more runs exist; the next page: piwf run list --limit 2 --before {newest_first[1]})"
    )
    command = first[-1].removeprefix("(more runs exist; the next page: piwf ").removesuffix(")")
    second = piwf.run(*command.split()).stdout.splitlines()
    assert [line.split()[0] for line in second[1:]] == newest_first[2:], second
    as_json = piwf.json("run", "list", "--limit", "2", "--before", newest_first[1])
    assert [run["runId"] for run in as_json["runs"]] == newest_first[2:]
    assert "nextCursor" not in as_json
    unknown = piwf.json("run", "list", "--before", "run-0b9c", exit_code=1)
    assert unknown["error"]["code"] == "runNotFound", unknown


def test_server_start_and_stop(piwf: Piwf, tmp_path: Path) -> None:
    def quickly(*arguments: str) -> Any:
        """``piwf ARGUMENTS --json`` in a new interpreter that must not import pydantic:
        start, stop and a stopped status take the quick paths (no protocol models)."""
        found, stdout = run_probe(
            [*arguments, "--json"], ["pydantic"], tmp_path / "imported.json", piwf.env
        )
        assert found["status"] == 0, stdout
        assert found["heavy"] == [], f"piwf {' '.join(arguments)} loaded the protocol's models"
        return json.loads(stdout)

    assert quickly("server", "status") == {"state": "stopped"}
    first = piwf.json("server", "start", "--max-workers", "2", "--idle-exit", "60")
    assert first["started"] is True
    pid = first["pid"]
    assert psutil.Process(pid).environ()["PIWF_HOME"] == str(piwf.home)

    again = quickly("server", "start")
    assert again == {"started": False, "epoch": first["epoch"]}
    status = piwf.json("server", "status")
    assert (status["maxWorkers"], status["pid"]) == (2, pid), "the pid start printed"
    assert (
        f"piwf server running (pid {pid}, epoch {first['epoch']},"
        in piwf.run("server", "status").stdout
    )

    assert quickly("server", "stop") == {"state": "stopped", "wasRunning": True}
    # Returned only once the server let go of the home: its database closed (the WAL
    # checkpointed into it and removed), so a script may copy the files at once.
    assert sorted(path.name for path in piwf.home.glob("state.sqlite*")) == ["state.sqlite"]
    assert wait_gone(pid, 15), "the server process did not exit after stop"
    assert quickly("server", "stop") == {"state": "stopped", "wasRunning": False}
    with StateDatabase(piwf.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        stops = tx.all("SELECT outcome FROM server_commands WHERE operation = 'server.stop'")
    assert [str(row[0]) for row in stops] == ["accepted"], "one stop, recorded as accepted"

    restarted = quickly("server", "start")
    assert restarted["started"] is True
    assert restarted["epoch"] > first["epoch"]
    assert psutil.Process(restarted["pid"]).is_running()


def test_runtime_error_without_json_goes_to_stderr(piwf: Piwf) -> None:
    result = piwf.run("run", "show", "run-nope")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ")


def test_state_prune_lists_then_deletes_an_old_tree_after_a_verified_backup(
    piwf: Piwf, tmp_path: Path
) -> None:
    # The servers this test starts keep 60 days, so their own sweep leaves a 40-day-old tree
    # for the prune below to find.
    piwf.env["PIWF_RETENTION_DAYS"] = "60"
    old = piwf.json("run", "start", HELLO, "--input", '{"who": "old"}', "--wait")["run"]
    assert piwf.json("server", "stop")["wasRunning"] is True
    day_ms = 86_400_000
    with StateDatabase(piwf.home / "state.sqlite") as db, db.write() as tx:
        tx.execute("UPDATE runs SET finished_at = finished_at - ?", (40 * day_ms,))
    fresh = piwf.json("run", "start", HELLO, "--input", '{"who": "new"}', "--wait")["run"]
    before = str(old["finishedAt"] - 40 * day_ms + 1)

    preview = piwf.json("state", "prune", "--before", before, "--dry-run")
    assert (preview["applied"], preview["treeCount"], preview["runCount"]) == (False, 1, 1)
    assert preview["trees"] == [{"rootRunId": old["runId"], "runs": 1, "runIds": [old["runId"]]}]

    backup = tmp_path / "before-prune.sqlite"
    applied = piwf.json("state", "prune", "--before", before, "--backup", str(backup), "--apply")
    assert (applied["applied"], applied["treeCount"]) == (True, 1)
    assert applied["backup"]["destination"] == str(backup)
    assert applied["blobsDeleted"] > 0

    assert [run["runId"] for run in piwf.json("run", "list")["runs"]] == [fresh["runId"]]
    backed_up = piwf.json("state", "verify", str(backup))
    assert backed_up == {"valid": True, "violations": []}, "the backup holds the old tree"


def test_state_status_counts_the_trees_a_prune_deleted(piwf: Piwf, tmp_path: Path) -> None:
    """A manual prune adds to the running total: the human form shows it too, although no
    sweep has completed (it said only "last sweep -")."""
    run = piwf.json("run", "start", HELLO, "--input", '{"who": "old"}', "--wait")["run"]
    before = str(run["finishedAt"] + 1)
    backup = str(tmp_path / "before-prune.sqlite")
    assert (
        piwf.json("state", "prune", "--before", before, "--backup", backup, "--apply")["treeCount"]
        == 1
    )
    assert piwf.json("state", "status")["retention"]["totalTreesDeleted"] == 1
    shown = piwf.run("state", "status")
    assert shown.returncode == 0, shown.stderr
    (line,) = [line for line in shown.stdout.splitlines() if "retention" in line]
    assert line.split(None, 1)[1] == "last sweep -; 1 tree(s) deleted in all", line


def test_state_prune_shows_its_cutoff_with_the_local_offset(piwf: Piwf) -> None:
    """``--before 2024-05-01`` means midnight UTC; a reader in Berlin sees it as 02:00 and is
    told the offset, not a bare 02:00:00 that reads as a different cutoff."""
    piwf.env["TZ"] = "Europe/Berlin"
    shown = piwf.run("state", "prune", "--before", "2024-05-01", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == (
        "would delete 0 run tree(s), 0 run(s), finished before 2024-05-01 02:00:00 +02:00"
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # Beyond what SQLite's integers hold: the epoch claim's expiry overflowed (a traceback).
        ("PIWF_SERVER_LEASE_MS", "99999999999999999999"),
        # Beyond what the protocol carries exactly: the server ran, `server status` could not.
        ("PIWF_MAX_WORKERS", "99999999999999999999"),
        # Every retention sweep failed with an OverflowError, retried every 5 minutes.
        ("PIWF_RETENTION_DAYS", "99999999999999999"),
        # Intervals of 0 spun the server's loop at full CPU, writing on every turn.
        ("PIWF_SERVER_RENEW_S", "0"),
        ("PIWF_RUN_RENEW_S", "0"),
        ("PIWF_CLAIM_POLL_S", "0"),
        # A deadline past any clock: the validation frame's timeout was no exact integer.
        ("PIWF_VALIDATION_TIMEOUT_S", "1e300"),
    ],
)
def test_a_setting_no_server_can_use_is_refused_before_it_starts(
    piwf: Piwf, variable: str, value: str
) -> None:
    piwf.env[variable] = value
    error = piwf.json("server", "start", exit_code=1)["error"]
    assert error["code"] == "serverStart"
    assert f"{variable} must be " in error["message"] and "at most" in error["message"]
    human = piwf.run("server", "start")
    assert human.returncode == 1
    assert human.stderr.startswith("Error: ") and "Traceback" not in human.stderr
    assert piwf.json("server", "status") == {"state": "stopped"}


def test_a_lease_that_lapses_between_renewals_is_refused_before_the_server_starts(
    piwf: Piwf,
) -> None:
    """With ``PIWF_RUN_LEASE_MS=1000`` (renewed every 10 s) a 3 s action lost its claim every
    second: the run was taken up again and again, and its effect applied each time."""
    piwf.env["PIWF_RUN_LEASE_MS"] = "1000"
    error = piwf.json("server", "start", exit_code=1)["error"]
    assert error["code"] == "serverStart"
    assert "PIWF_RUN_LEASE_MS (1000) must be at least twice PIWF_RUN_RENEW_S" in error["message"]
    assert piwf.json("server", "status") == {"state": "stopped"}
    piwf.env["PIWF_RUN_RENEW_S"] = "0.5"
    piwf.env["PIWF_SERVER_LEASE_MS"] = "1"  # the server lost its epoch at its first command
    error = piwf.json("server", "start", exit_code=1)["error"]
    assert "PIWF_SERVER_LEASE_MS (1) must be at least twice PIWF_SERVER_RENEW_S" in error["message"]
    del piwf.env["PIWF_SERVER_LEASE_MS"]
    started = piwf.json("server", "start")
    assert started["started"] is True
    # A running server is left alone, whatever the environment of a later start holds: it is
    # not launched again, so its settings are not read, and the start names those it ignored
    # (every PIWF_* server setting of its environment, never a value).
    piwf.env["PIWF_RUN_LEASE_MS"] = "1000"
    piwf.env["PIWF_MAX_WORKERS"] = "abc"
    assert piwf.json("server", "start") == {
        "started": False,
        "epoch": started["epoch"],
        "notApplied": ["PIWF_MAX_WORKERS", "PIWF_RUN_LEASE_MS", "PIWF_RUN_RENEW_S"],
    }
    piwf.json("server", "stop")


def test_a_server_option_beyond_its_limit_is_a_usage_error(piwf: Piwf) -> None:
    for option, value in (("--max-workers", "99999999999999999999"), ("--idle-exit", "1e300")):
        error = piwf.json("server", "start", option, value, exit_code=2)["error"]
        assert error["code"] == "usage" and option in error["message"]
    assert piwf.json("server", "status") == {"state": "stopped"}
