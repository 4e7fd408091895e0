"""``state backup`` and ``state prune --backup`` to destinations that cannot take a backup.

Each bad destination must be answered at once with a typed error that gives the reason (never
the client's timeout and ``serverUnavailable``), change nothing (no accepted receipt, no file
left beside the destination, no run deleted), and leave the server log without a traceback and
without the destination path (a request's payload). A good destination afterwards proves the
server still serves and that prune had a tree to delete all along.

The read-only destination is a read-only tmpfs (root can write anywhere else); without root
that one case is skipped, the others still run.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.errors import BackupFailedError, InvalidArgumentError
from piwf.state import StateDatabase
from tests.cli_process import run_piwf
from tests.server.harness import ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.mounts import tmpfs

REPO = Path(__file__).resolve().parents[2]
HELLO = str(REPO / "fixtures" / "workflows" / "hello.py")
FAST = {"PIWF_IDLE_EXIT_S": "0", "PIWF_CLAIM_POLL_S": "0.05"}


@dataclass(frozen=True)
class Destination:
    """A bad destination and the words its error must contain."""

    kind: str
    path: str
    reason: str


def bad_destinations(tmp_path: Path, read_only: Path | None) -> list[Destination]:
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    # 4096 bytes in all (one more than PATH_MAX allows), made of names the file system allows.
    too_deep = str(tmp_path)
    while len(too_deep) + 201 < 4096 - 50:
        too_deep += "/" + "d" * 200
    too_deep += "/" + "x" * (4096 - len(too_deep) - 1)
    found = [
        Destination("directory", str(tmp_path), "already exists (a directory)"),
        Destination("/dev/null", "/dev/null", "already exists (a character device)"),
        Destination("FIFO", str(fifo), "already exists (a FIFO)"),
        Destination("over PATH_MAX", too_deep, "PATH_MAX"),
        Destination("over NAME_MAX", str(tmp_path / ("n" * 300)), "NAME_MAX"),
        Destination("missing directory", str(tmp_path / "none" / "b.sqlite"), "does not exist"),
        Destination("under a device", "/dev/null/b.sqlite", "ENOTDIR: Not a directory"),
    ]
    if read_only is not None:
        found.append(
            Destination("read-only", str(read_only / "b.sqlite"), "EROFS: Read-only file system")
        )
    return found


@pytest.fixture
def read_only_dir() -> Iterator[Path | None]:
    """A read-only tmpfs, or None where no tmpfs can be mounted (that case is then left out)."""
    try:
        with tmpfs("1m", read_only=True) as directory:
            yield directory
    except pytest.skip.Exception:
        yield None


def completed_run(server: ServerProcess) -> tuple[str, int]:
    """A finished hello run and a prune cutoff that makes its tree eligible."""
    with raw_client(server) as client:
        started = client.request(
            "run.start", {"workflow": HELLO, "input": {"who": "x"}}, key="hello"
        )
        assert started.receipt is not None, started
        run_id = started.receipt["run"]["runId"]
        finished = client.request("run.wait", {"timeoutMs": 30_000}, run_id=run_id)
        assert finished.receipt is not None and finished.receipt["run"]["status"] == "completed"
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        cutoff = int(tx.scalar("SELECT max(finished_at) FROM runs")) + 1
    # The run is terminal before its runner row closes (the child exits after it finished):
    # until then retention protects the tree. Wait until a prune would really take it.
    with Client(server.home, autostart=False) as client:
        wait_for(
            lambda: client.prune_preview(cutoff).tree_count == 1,
            what="the finished run's tree to be prunable",
        )
    return run_id, cutoff


def receipts(home: Path) -> list[tuple[str, str]]:
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        rows = tx.all(
            "SELECT operation, outcome FROM server_commands WHERE operation LIKE 'state.%'"
        )
    return sorted((str(row[0]), str(row[1])) for row in rows)


def run_count(home: Path) -> int:
    with StateDatabase(home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        return int(tx.scalar("SELECT count(*) FROM runs"))


def assert_log_is_clean(home: Path, destinations: list[Destination]) -> str:
    log_text = (home / "server" / "server.log").read_text()
    assert "Traceback" not in log_text
    for destination in destinations:
        assert destination.path not in log_text, f"the log names the {destination.kind} path"
    assert "n" * 300 not in log_text and "d" * 200 not in log_text
    return log_text


def entries(*directories: Path | None) -> dict[Path, list[str]]:
    return {d: sorted(entry.name for entry in d.iterdir()) for d in directories if d is not None}


def test_the_client_gets_a_typed_error_at_once_and_nothing_changes(
    servers: ServerFactory, tmp_path: Path, read_only_dir: Path | None
) -> None:
    server = servers.start(env=FAST)
    assert server.ready.get("ok") is True, server.ready
    _, cutoff = completed_run(server)
    destinations = bad_destinations(tmp_path, read_only_dir)
    relative = Destination("relative", "b.sqlite", "must be an absolute path")
    nul = Destination("nul", f"{tmp_path}/b\x00.sqlite", "contains a NUL character")
    before = entries(tmp_path, read_only_dir)
    # A short request timeout: an unanswered request fails the test as serverUnavailable.
    with Client(server.home, autostart=False, request_timeout_s=15) as client:
        for destination, operation in [(d, op) for d in destinations for op in ("backup", "prune")]:
            with pytest.raises(BackupFailedError) as refused:
                if operation == "backup":
                    client.backup(Path(destination.path))
                else:
                    client.prune(cutoff, Path(destination.path))
            where = (destination.kind, operation)
            assert refused.value.error_code == "backupFailed", where
            assert destination.reason in str(refused.value), (where, str(refused.value))
            assert destination.path not in str(refused.value), "no payload path in errors"
        # The Client makes a backup path absolute (the CLI's documented behaviour), and refuses
        # a prune's relative backup path before sending it; the server refuses both anyway.
        with pytest.raises(InvalidArgumentError, match="backup: the absolute path"):
            client.prune(cutoff, Path(relative.path))
        # No file name holds a NUL: the Client refuses it, the server (sent raw) too.
        with pytest.raises(InvalidArgumentError, match="destination: .* without NUL"):
            client.backup(nul.path)
        with pytest.raises(InvalidArgumentError, match="backup: the absolute path"):
            client.prune(cutoff, nul.path)
    with raw_client(server, "raw-client") as raw:
        answers = [
            (
                refused,
                raw.request("state.backup", {"destination": refused.path}, key=refused.kind),
                raw.request(
                    "state.prune",
                    {"before": cutoff, "backup": refused.path},
                    key=f"p-{refused.kind}",
                ),
            )
            for refused in (relative, nul)
        ]
    for refused, *pair in answers:
        for answer in pair:
            assert answer.outcome == "rejected" and answer.error is not None, answer
            assert answer.error.code == "backupFailed" and refused.reason in answer.error.message

    assert entries(tmp_path, read_only_dir) == before, "no file was left beside a destination"
    assert run_count(server.home) == 1, "a failed backup deletes nothing"
    refused_each = len(destinations) + 2
    assert (
        receipts(server.home)
        == [("state.backup", "rejected")] * refused_each
        + [("state.prune", "rejected")] * refused_each
    ), "every refusal is a stored rejection, none a success"
    assert_log_is_clean(server.home, destinations)

    with Client(server.home, autostart=False, request_timeout_s=15) as client:
        report = client.prune(cutoff, tmp_path / "good.sqlite")
    assert (report.applied, report.tree_count) == (True, 1), "prune had a tree to delete"
    assert run_count(server.home) == 0


def piwf_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_piwf(args, env=dict(os.environ, PIWF_HOME=str(home)), cwd=REPO, timeout=120)


def test_the_cli_exits_1_with_the_reason(
    servers: ServerFactory, tmp_path: Path, read_only_dir: Path | None
) -> None:
    server = servers.start(env=FAST)
    assert server.ready.get("ok") is True, server.ready
    _, cutoff = completed_run(server)
    destinations = bad_destinations(tmp_path, read_only_dir)
    before = entries(tmp_path, read_only_dir)
    # The CLI itself refuses, as usage errors (exit 2) before asking, what it can see: a backup
    # or a prune to a path that exists. The server answers everything else.
    checked_locally = {
        (operation, kind)
        for operation in ("backup", "prune")
        for kind in ("directory", "/dev/null", "FIFO")
    }
    for destination in destinations:
        for operation in ("backup", "prune"):
            if operation == "backup":
                args = ["state", "backup", destination.path]
            else:
                args = ["state", "prune", "--before", str(cutoff), "--backup", destination.path]
                args.append("--apply")
            where = (operation, destination.kind)
            human = piwf_cli(server.home, *args)
            if where in checked_locally:
                assert human.returncode == 2, (where, human.stderr)
                continue
            assert human.returncode == 1, (where, human.stdout, human.stderr)
            # The CLI names the destination it was given (the server's message leaves it out).
            named = f"Error: backup to {destination.path} failed: "
            assert human.stderr.startswith(named), (where, human.stderr)
            assert human.stderr.count("\n") == 1, (where, human.stderr)
            assert destination.reason in human.stderr, (where, human.stderr)
            assert "Traceback" not in human.stderr
            machine = piwf_cli(server.home, *args, "--json")
            assert machine.returncode == 1, (where, machine.stdout)
            error = json.loads(machine.stdout)["error"]
            assert error["code"] == "backupFailed", (where, error)
            assert destination.reason in error["message"], (where, error)
            assert error["message"].startswith(named[len("Error: ") :]), (where, error)
    # A destination with a line break and a terminal escape: named escaped, on one line.
    odd = tmp_path / "no\nsuch\x1b[2J" / "b.sqlite"
    for args in (
        ["state", "backup", str(odd)],
        ["state", "prune", "--before", str(cutoff), "--backup", str(odd), "--apply"],
    ):
        human = piwf_cli(server.home, *args)
        assert human.returncode == 1, human.stderr
        assert human.stderr == (
            f"Error: backup to {tmp_path}/no\\nsuch\\x1b[2J/b.sqlite failed: the backup"
            " directory does not exist; create it or choose another\n"
        ), human.stderr
        machine = piwf_cli(server.home, *args, "--json")
        assert json.loads(machine.stdout)["error"]["code"] == "backupFailed", machine.stdout
    assert entries(tmp_path, read_only_dir) == before, "no file was left beside a destination"
    assert run_count(server.home) == 1, "a failed backup deletes nothing"
    assert ("state.backup", "accepted") not in receipts(server.home)
    assert ("state.prune", "accepted") not in receipts(server.home)
    assert_log_is_clean(server.home, destinations)
    with contextlib.suppress(FileNotFoundError):
        (tmp_path / "a-fifo").unlink()
