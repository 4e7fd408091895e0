"""A state database with a damaged page: a clear ``stateCorrupt`` on every path, no hang.

The database is a real one: a server ran three workflows to completion in it. It is copied with
SQLite's backup API and one b-tree page of a table (never the file header) is overwritten in
the copy. Then:

- a server started on it refuses at once with ``stateCorrupt`` (its bounded ``quick_check`` at
  open), saying to restore a backup or move the file aside, and leaves the file as it was; the
  CLI that autostarts it exits 1 with that reason;
- with the open check switched off (``PIWF_QUICK_CHECK_S=0``, as for a file too large to check
  in its budget) the server starts, and every command that touches the damaged page answers
  ``stateCorrupt`` at once while the others answer normally; no request waits for its timeout
  (the client's timeout is short: an unanswered request fails the test), the server log holds
  one line per failure and no traceback, and ``server stop`` ends the process although it
  cannot store its receipt.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.errors import StateCorruptCommandError
from piwf.state import StateDatabase
from tests.cli_process import run_piwf
from tests.server.harness import ServerFactory, raw_client

REPO = Path(__file__).resolve().parents[2]
HELLO = str(REPO / "fixtures" / "workflows" / "hello.py")
FAST = {"PIWF_IDLE_EXIT_S": "0", "PIWF_CLAIM_POLL_S": "0.05"}


@pytest.fixture
def finished_state(servers: ServerFactory) -> tuple[Path, list[str]]:
    """A state file in which a real server ran three runs to completion, and their ids."""
    server = servers.start(env=FAST)
    assert server.ready.get("ok") is True, server.ready
    run_ids = []
    with raw_client(server) as client:
        for n in range(3):
            started = client.request(
                "run.start", {"workflow": HELLO, "input": {"who": f"w{n}"}}, key=f"k{n}"
            )
            assert started.receipt is not None, started
            run_id = started.receipt["run"]["runId"]
            done = client.request("run.wait", {"timeoutMs": 30_000}, run_id=run_id)
            assert done.receipt is not None and done.receipt["run"]["status"] == "completed"
            run_ids.append(run_id)
    assert server.terminate() == 0
    return server.home / "state.sqlite", run_ids


def damaged_copy(source: Path, home: Path, table: str) -> Path:
    """Copy ``source`` into ``home`` with the backup API, then overwrite the start of the
    b-tree page of ``table`` (its page header and first cells)."""
    home.mkdir(mode=0o700)
    target = home / "state.sqlite"
    with StateDatabase(source, mode="read-only") as db:
        copy = sqlite3.connect(target)
        try:
            db.connection.backup(copy)
            copy.execute("PRAGMA journal_mode = DELETE")
            page_size = copy.execute("PRAGMA page_size").fetchone()[0]
            (root,) = copy.execute(
                "SELECT rootpage FROM sqlite_schema WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
        finally:
            copy.close()
    assert root > 1, "never the first page: it holds the file header"
    target.chmod(0o600)
    with open(target, "r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(b"\xa5" * 200)
    return target


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("table", ["runs", "schema_meta"])  # schema_meta: the identity read
def test_a_damaged_page_is_refused_at_start_and_the_file_is_left_alone(
    finished_state: tuple[Path, list[str]], tmp_path: Path, table: str
) -> None:
    source, _ = finished_state
    home = tmp_path / "damaged"
    target = damaged_copy(source, home, table)
    before = digest(target)
    servers = ServerFactory(home, verify=False)  # damaged on purpose
    try:
        refused = servers.start(env=FAST)
        assert refused.ready.get("ok") is False, refused.ready
        error = refused.ready["error"]
        assert error["code"] == "stateCorrupt", error
        assert "damaged" in error["message"] and "piwf state restore" in error["message"]
        assert "move state.sqlite aside" in error["message"]
        assert refused.process.wait(timeout=30) == 1
    finally:
        servers.cleanup()
    assert digest(target) == before, "the damaged file was not changed"
    assert not (home / "state.sqlite-wal").exists() and not (home / "state.sqlite-shm").exists()

    # The CLI autostarts a server for this home; it fails the same way, at once, exit 1.
    cli = run_piwf(["run", "list"], env=dict(os.environ, PIWF_HOME=str(home)), cwd=REPO)
    assert cli.returncode == 1, (cli.stdout, cli.stderr)
    assert "damaged (SQLITE_CORRUPT)" in cli.stderr and "piwf state restore" in cli.stderr
    as_json = run_piwf(
        ["run", "list", "--json"], env=dict(os.environ, PIWF_HOME=str(home)), cwd=REPO
    )
    assert json.loads(as_json.stdout)["error"]["code"] == "stateCorrupt", as_json.stdout
    assert "Traceback" not in cli.stderr
    assert digest(target) == before


def test_with_the_open_check_off_every_command_answers_at_once(
    finished_state: tuple[Path, list[str]], tmp_path: Path
) -> None:
    source, run_ids = finished_state
    home = tmp_path / "damaged"
    damaged_copy(source, home, "blobs")  # outputs and receipts live there; runs do not
    servers = ServerFactory(home, verify=False)  # damaged on purpose
    try:
        server = servers.start(env={**FAST, "PIWF_QUICK_CHECK_S": "0"})
        assert server.ready.get("ok") is True, server.ready
        with Client(home, autostart=False, request_timeout_s=15) as client:
            assert client.server_status().state == "running"
            listed = {run.run_id for run in client.list_runs().runs}
            assert listed == set(run_ids), "reads that miss the damaged page answer normally"
            with pytest.raises(StateCorruptCommandError) as reading:
                client.get_run(run_ids[0])  # its output is a blob
            with pytest.raises(StateCorruptCommandError) as writing:
                client.start_run(HELLO, input={"who": "late"})  # its input would be a blob
            for error in (reading.value, writing.value):
                assert error.error_code == "stateCorrupt"
                assert "damaged" in str(error) and "piwf state restore" in str(error)
            assert client.server_status().state == "running", "still serving after them"
            client.stop_server()
        assert server.process.wait(timeout=30) == 0, "server stop ended the process"
        log_text = (home / "server" / "server.log").read_text()
        assert "Traceback" not in log_text
        for operation in ("run.get", "run.start", "server.stop"):
            assert f"{operation} failed: stateCorrupt: " in log_text, "one line per failure"
        # server.stop could not store its receipt (a blob) and stopped all the same.
    finally:
        servers.cleanup()
