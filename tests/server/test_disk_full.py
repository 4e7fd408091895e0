"""A transient full disk under the state home: the server recovers in place, or says why.

The state home is a small tmpfs (root only: skipped with the reason elsewhere; CI runs as
root). Runs execute while a filler file takes every free byte; their nodes finish with outputs
far larger than any free space the WAL kept, so their commits cannot succeed. While the disk is
full, commands answer at once (reads normally, writes ``stateFull``), never after the client's
timeout. Then the filler goes, and every accepted run must complete under the same server
process and epoch, ``state verify`` must be clean, and ``server stop`` must end the process.

This test does not need the live recovery of expired claims: the disk stays full for far less
than a run lease (30 s), so no claim expires meanwhile.
"""

from __future__ import annotations

import errno
import textwrap
import time
from pathlib import Path

from piwf.client import Client
from piwf.errors import StateFullCommandError
from tests.server.harness import ServerFactory, wait_for
from tests.server.mounts import tmpfs

RUNS = 6
WORKERS = 2
OUTPUT_BYTES = 2_000_000
#: A run input larger than any WAL slack of the runs' small commits so far.
LARGE_INPUT_BYTES = 700_000
#: Commands sent while the disk is full (each a resolver child and a failed commit).
FULL_ROUNDS = 30
#: How long every accepted run has to complete once space is back.
SETTLE_S = 60.0


def gated_workflow(directory: Path, gate: Path, marks: Path) -> Path:
    """A workflow whose first node waits for ``gate``, marks that it returned, then returns
    ``OUTPUT_BYTES`` of output (the commit that needs new space)."""
    path = directory / "gated.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import pathlib, time
            from piwf.workflow import compute, define_workflow

            def work(ctx):
                pathlib.Path({str(marks)!r}, f"entered-{{ctx.input['n']}}").touch()
                deadline = time.monotonic() + 60
                while not pathlib.Path({str(gate)!r}).exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                pathlib.Path({str(marks)!r}, f"returned-{{ctx.input['n']}}").touch()
                return {{"pad": "x" * {OUTPUT_BYTES}}}

            workflow = define_workflow(
                name="gated",
                start_at="work",
                nodes={{"work": compute(work), "after": compute(lambda ctx: {{"ok": True}})}},
                edges=[{{"from": "work", "to": "after"}}],
            )
            """
        )
    )
    return path


def fill(directory: Path) -> Path:
    """Write a filler file until the file system is full; return it."""
    filler = directory / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as out:
        for _ in range(1 << 16):  # bounded far above any tmpfs size used here
            try:
                out.write(chunk)
                out.flush()
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
        else:
            raise AssertionError("the file system never filled")
    return filler


def marks_of(marks: Path, kind: str) -> int:
    return sum(1 for entry in marks.iterdir() if entry.name.startswith(kind))


def test_runs_complete_in_place_after_the_disk_was_full(tmp_path: Path) -> None:
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    marks.mkdir()
    workflow = gated_workflow(tmp_path, gate, marks)
    with tmpfs("24m") as mount:
        servers = ServerFactory(mount / "h")
        try:
            server = servers.start(
                env={
                    "PIWF_IDLE_EXIT_S": "0",
                    "PIWF_CLAIM_POLL_S": "0.1",
                    "PIWF_RUN_RENEW_S": "0.5",
                    "PIWF_MAX_WORKERS": str(WORKERS),
                }
            )
            assert server.ready.get("ok") is True, server.ready
            epoch = server.ready["epoch"]
            with Client(server.home, autostart=False, request_timeout_s=20) as client:
                accepted = [
                    client.start_run(workflow, input={"n": n}, project=tmp_path).run_id
                    for n in range(RUNS)
                ]
                wait_for(lambda: marks_of(marks, "entered") == WORKERS, 60, "runs executing")

                filler = fill(mount)
                gate.touch()  # the running nodes return their large outputs now
                wait_for(lambda: marks_of(marks, "returned") == WORKERS, 60, "nodes returned")

                # Full: reads answer, a write that needs new space answers stateFull at once.
                refusals: list[StateFullCommandError] = []
                for n in range(FULL_ROUNDS):  # the disk stays full for these rounds
                    big = {"n": 100 + n, "pad": "y" * LARGE_INPUT_BYTES}
                    try:
                        accepted.append(client.start_run(workflow, input=big).run_id)
                    except StateFullCommandError as error:
                        refusals.append(error)
                    assert client.server_status().epoch == epoch
                    assert len(client.list_runs().runs) == len(accepted)
                assert refusals, "the server never reported the full disk"
                assert {error.error_code for error in refusals} == {"stateFull"}
                assert all("the disk is full" in str(error) for error in refusals)
                views = [client.get_run(run_id).run for run_id in accepted[:WORKERS]]
                assert [view.status for view in views] == ["running"] * WORKERS, (
                    "a 2 MB output cannot have been committed on a full disk"
                )

                filler.unlink()  # space is back: nothing is restarted by hand

                deadline = time.monotonic() + SETTLE_S  # below pytest's own timeout
                for run_id in accepted:
                    final = client.wait_run(run_id, timeout_s=max(1.0, deadline - time.monotonic()))
                    assert (final.timed_out, final.run.status) == (False, "completed"), run_id
                assert server.alive(), "the same server process did all of it"
                assert client.server_status().epoch == epoch
                verified = client.state_verify()
                assert (verified.valid, verified.violations) == (True, [])
                client.stop_server()
            assert server.process.wait(timeout=30) == 0, "server stop ended the process"
            log_text = (server.home / "server" / "server.log").read_text()
            assert "Traceback" not in log_text
        finally:
            servers.cleanup()


def test_a_full_disk_that_outlasts_the_server_lease_stops_the_server(tmp_path: Path) -> None:
    """The epoch cannot be renewed while full; once its lease ran out the server must stop by
    itself (its epoch is gone, as the docs promise) rather than stay up wedged, and a new
    server then recovers every accepted run."""
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    marks.mkdir()
    workflow = gated_workflow(tmp_path, gate, marks)
    with tmpfs("24m") as mount:
        servers = ServerFactory(mount / "h")
        try:
            server = servers.start(
                env={
                    "PIWF_IDLE_EXIT_S": "0",
                    "PIWF_CLAIM_POLL_S": "0.1",
                    "PIWF_MAX_WORKERS": str(WORKERS),
                    "PIWF_SERVER_LEASE_MS": "1500",
                    "PIWF_SERVER_RENEW_S": "0.3",
                }
            )
            assert server.ready.get("ok") is True, server.ready
            with Client(server.home, autostart=False, request_timeout_s=20) as client:
                accepted = [
                    client.start_run(workflow, input={"n": n}, project=tmp_path).run_id
                    for n in range(RUNS)
                ]
                wait_for(lambda: marks_of(marks, "entered") == WORKERS, 60, "runs executing")
            filler = fill(mount)
            gate.touch()
            # Renewing needs a write; past the 1.5 s lease the epoch is lost and the server
            # stops at its next renewal, disk still full.
            assert server.process.wait(timeout=60) == 1, "an expired epoch is a failed exit"
            filler.unlink()
            restarted = servers.start(env={"PIWF_IDLE_EXIT_S": "0", "PIWF_CLAIM_POLL_S": "0.1"})
            assert restarted.ready.get("ok") is True, restarted.ready
            assert restarted.ready["epoch"] == server.ready["epoch"] + 1
            with Client(restarted.home, autostart=False, request_timeout_s=20) as client:
                deadline = time.monotonic() + SETTLE_S
                for run_id in accepted:
                    left = max(1.0, deadline - time.monotonic())
                    final = client.wait_run(run_id, timeout_s=left)
                    assert (final.timed_out, final.run.status) == (False, "completed"), run_id
                client.stop_server()
            assert restarted.process.wait(timeout=30) == 0
            log_text = (server.home / "server" / "server.log").read_text()
            assert "Traceback" not in log_text
        finally:
            servers.cleanup()
