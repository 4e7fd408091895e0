"""A failed node explains itself where a user looks, through a real server.

A real ``piwf server run`` executes each run in a real runner child; the installed ``piwf``
script (``run start --wait``, ``run show``, ``--json``) and the Python ``Client`` read the
failure back. The record must name the node, the error's type and message, and carry a
bounded traceback whose frames come from the workflow file; a shell node's error must keep the
end of its stderr; and none of it may reach the server log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwf.client import Client
from piwf.protocol.payloads import NodeFailureInfo
from piwf.workflow.failure import MAX_STDERR_LINES, MAX_TRACEBACK_BYTES, MAX_TRACEBACK_FRAMES
from tests.server.harness import ServerFactory, ServerProcess
from tests.server.test_content_refs import cli_json, piwf_cli, write
from tests.server.test_execution import FAST

KEY_ERROR = """
from piwf.workflow import compute, define_workflow


def fetch(ctx):
    table = {"present": 1}
    return {"value": table["missing"]}


workflow = define_workflow(
    name="lookup",
    start_at="prepare",
    nodes={
        "prepare": compute(run=lambda ctx: {"ready": True}),
        "fetch": compute(run=fetch),
    },
    edges=[{"from": "prepare", "to": "fetch"}],
)
"""

#: ``dive(200)`` is 201 frames of ``dive`` under the node's own function: 202 frames of
#: workflow code, the newest of which raises.
DEEP = """
from piwf.workflow import compute, define_workflow


def dive(depth):
    if depth == 0:
        raise ValueError("the bottom of the dive")
    return dive(depth - 1)


def deep(ctx):
    return dive(200)


workflow = define_workflow(
    name="deep", start_at="deep", nodes={"deep": compute(run=deep)}, edges=[]
)
"""
DEEP_FRAMES = 202

NOISY_SHELL = """
from piwf.workflow import define_workflow, idempotent_effect, shell

SCRIPT = 'i=1; while [ "$i" -le 100 ]; do echo "line $i" >&2; i=$((i + 1)); done; exit 3'

workflow = define_workflow(
    name="noisy",
    start_at="noisy",
    nodes={
        "noisy": shell(
            effect=idempotent_effect("noisy.run"),
            command=["sh", "-c", SCRIPT],
            allow_nonzero_exit=ALLOWED,
        ),
    },
    edges=[],
)
"""


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def start_and_wait(server: ServerProcess, workflow: str) -> tuple[str, str]:
    """``piwf run start WORKFLOW --wait`` for a run that fails: its id and the stderr."""
    result = piwf_cli(server, "run", "start", workflow, "--wait")
    assert result.returncode == 1, (result.stdout, result.stderr)
    run_id = result.stdout.split()[1]
    return run_id, result.stderr


def server_log(server: ServerProcess) -> str:
    path = server.home / "server" / "server.log"
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_raising_node_is_named_with_its_type_message_and_traceback(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write(tmp_path, "lookup", KEY_ERROR)
    run_id, stderr = start_and_wait(server, workflow)
    assert (
        f"""run {run_id} ended failed (nodeFailed): node "fetch" failed: KeyError: 'missing'"""
        in (stderr)
    )

    human = piwf_cli(server, "run", "show", run_id)
    assert human.returncode == 0, human.stderr
    failure_section = human.stdout[human.stdout.index("failure:") :]
    for expected in (
        "node     fetch",
        "ended    failed",
        "type     KeyError",
        "message  'missing'",
        "traceback (most recent call last):",
        f'File "{workflow}", line 7, in fetch',
        'return {"value": table["missing"]}',
        "KeyError: 'missing'",
        """node "fetch" failed: KeyError: 'missing'""",
    ):
        assert expected in failure_section, (expected, human.stdout)

    document = cli_json(server, "run", "show", run_id)
    assert document["error"] == """node "fetch" failed: KeyError: 'missing'"""
    record = document["failure"]
    assert record == {
        "path": "fetch",
        "visit": 1,
        "attempt": 1,
        "outcome": "failed",
        "kind": "exception",
        "errorType": "KeyError",
        "message": "'missing'",
        "messageCut": False,
        "traceback": (
            f'  File "{workflow}", line 7, in fetch\n    return {{"value": table["missing"]}}\n'
        ),
        "tracebackCut": False,
        "stderrCut": False,
    }

    with Client(server.home, autostart=False) as client:
        detail = client.get_run(run_id)
        waited = client.wait_run(run_id, timeout_s=10)
    assert isinstance(detail.failure, NodeFailureInfo)
    assert detail.failure.to_wire() == record
    assert detail.error == document["error"]
    assert waited.failure == detail.failure and waited.error == detail.error
    waited_cli = piwf_cli(server, "run", "wait", run_id, "--json")
    assert waited_cli.returncode == 1, waited_cli.stderr
    assert json.loads(waited_cli.stdout)["failure"] == record

    # The record is the user's own code and message: it stays out of the server's log.
    log = server_log(server)
    assert 'table["missing"]' not in log and "KeyError" not in log


def test_a_deep_traceback_keeps_its_newest_frames_within_the_bound(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write(tmp_path, "deep", DEEP)
    run_id, _ = start_and_wait(server, workflow)
    with Client(server.home, autostart=False) as client:
        failure = client.get_run(run_id).failure
    assert failure is not None and failure.traceback is not None
    assert (failure.kind, failure.error_type, failure.message) == (
        "exception",
        "ValueError",
        "the bottom of the dive",
    )
    traceback = failure.traceback
    assert failure.traceback_cut is True
    assert len(traceback.encode()) <= MAX_TRACEBACK_BYTES
    first, *rest = traceback.splitlines()
    kept = DEEP_FRAMES - MAX_TRACEBACK_FRAMES
    assert first == f"  ... {kept} older frames cut; the newest {MAX_TRACEBACK_FRAMES} follow"
    assert traceback.count('  File "') == MAX_TRACEBACK_FRAMES
    # Newest last: the frame that raised closes the traceback.
    assert rest[-2:] == [
        f'  File "{workflow}", line 7, in dive',
        '    raise ValueError("the bottom of the dive")',
    ]
    human = piwf_cli(server, "run", "show", run_id).stdout
    assert f"traceback (most recent call last, older frames cut):\n  {first}\n" in human, human


def test_a_failed_shell_node_keeps_the_end_of_its_stderr(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write(tmp_path, "noisy", NOISY_SHELL.replace("ALLOWED", "False"))
    run_id, stderr = start_and_wait(server, workflow)
    last_lines = [f"line {n}" for n in range(101 - MAX_STDERR_LINES, 101)]
    document = cli_json(server, "run", "show", run_id)
    error = document["error"]
    assert error == (
        """node "noisy" failed: 'sh' exited with code 3; last lines of stderr, earlier output """
        "cut:\n" + "\n".join(last_lines)
    )
    assert "line 1\n" not in error and f"line {100 - MAX_STDERR_LINES}\n" not in error
    assert error in stderr
    record = document["failure"]
    assert (record["kind"], record["exitCode"], record["stderrCut"]) == ("exit", 3, True)
    assert record["stderrTail"] == "\n".join(last_lines)
    assert record["message"] == "'sh' exited with code 3"
    human = piwf_cli(server, "run", "show", run_id).stdout
    assert "exit code  3" in human
    assert "stderr (its last lines, earlier output cut):\n    line 81\n" in human


def test_a_shell_node_allowed_a_nonzero_exit_still_completes(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write(tmp_path, "allowed", NOISY_SHELL.replace("ALLOWED", "True"))
    result = piwf_cli(server, "run", "start", workflow, "--wait", "--json")
    assert result.returncode == 0, (result.stdout, result.stderr)
    document = json.loads(result.stdout)
    assert document["run"]["status"] == "completed"
    assert document["output"]["exit_code"] == 3
    assert "failure" not in document and "error" not in document
