"""How ``piwf session attach`` ends, run as a real subprocess against a real server.

The end of input (stdin from /dev/null) aborts the open turn once and detaches, instead of
aborting every step presented again; a host fenced by another coordinator says so once and
exits 1, instead of refusing every line it reads; a line no request can take is refused
and typed again, never the end of the host.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf import canonical
from piwf.client import Client
from piwf.errors import SessionAuthorityCommandError
from tests.server.harness import ServerFactory, ServerProcess, wait_for
from tests.server.test_execution import FAST

PIWF = Path(sys.executable).parent / "piwf"
REVIEW = str(Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "session_review.py")
#: How long a host may take to end once it has a reason to.
EXIT_DEADLINE_S = 30.0


class Host:
    """One ``piwf session attach`` subprocess: its stdin, and its stderr read as it comes."""

    def __init__(self, server: ServerProcess, session: str, *args: str, stdin: int) -> None:
        self.process = subprocess.Popen(
            [str(PIWF), "session", "attach", session, *args],
            env={**os.environ, "PIWF_HOME": str(server.home)},
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.process.stderr is not None
        os.set_blocking(self.process.stderr.fileno(), False)
        self._stderr = b""

    def stderr(self) -> str:
        """Everything the host wrote to stderr so far."""
        assert self.process.stderr is not None
        descriptor = self.process.stderr.fileno()
        while select.select([descriptor], [], [], 0)[0]:
            chunk = os.read(descriptor, 65536)
            if not chunk:
                break
            self._stderr += chunk
        return self._stderr.decode()

    def wait_for_stderr(self, text: str) -> None:
        wait_for(lambda: text in self.stderr(), EXIT_DEADLINE_S, f"{text!r} in:\n{self.stderr()}")

    def type(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def exit_code(self) -> int:
        """The host's exit code, once it ended (bounded: a host that stays fails the test)."""
        try:
            return self.process.wait(timeout=EXIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the host did not exit; it wrote:\n{self.stderr()}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    started: list[Host] = []
    yield started
    for host in started:
        host.kill()


def start_host(
    hosts: list[Host], server: ServerProcess, session: str, *args: str, stdin: int
) -> Host:
    host = Host(server, session, *args, stdin=stdin)
    hosts.append(host)
    return host


@pytest.mark.parametrize(("options", "code"), [((), 0), (("--exit-when-done",), 1)])
def test_the_end_of_input_aborts_the_turn_once_and_detaches(
    server: ServerProcess, hosts: list[Host], options: tuple[str, ...], code: int
) -> None:
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "x"}, session="eof-1")
        host = start_host(hosts, server, "eof-1", *options, stdin=subprocess.DEVNULL)
        assert host.exit_code() == code  # detached (with --exit-when-done: not done)
        said = host.stderr()
        assert said.count(f"turn aborted: run {run.run_id} is paused") == 1, said
        assert said.endswith("end of input: detached\n"), said
        # Ctrl-D aborts a turn the way Ctrl-C does: the run pauses, nothing else changed.
        assert client.run_view(run.run_id).display.status == "paused"
        # No host pauses it again: the resumed step waits for the next coordinator.
        client.resume_run(run.run_id)
        session = client.session("eof-1")
        step = session.next_message(timeout_s=10)
        assert step is not None and (step.kind, step.reason) == ("step", "resumed")
        session.delivered(step.message_id, "entry-1")
        session.submit(step.content["requestId"], {"note": "after the end of input"})
        checkpoint = session.next_message(timeout_s=10)
        assert checkpoint is not None and checkpoint.kind == "step"
        session.delivered(checkpoint.message_id, "entry-2")
        session.answer(checkpoint.content["requestId"], {"approved": True})
        assert client.wait_run(run.run_id, timeout_s=20).run.status == "completed"


def test_a_host_fenced_during_a_turn_says_so_once_and_exits_1(
    server: ServerProcess, hosts: list[Host]
) -> None:
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "x"}, session="fence-1")
        host = start_host(hosts, server, "fence-1", stdin=subprocess.PIPE)
        host.wait_for_stderr("output JSON>")
        with Client(server.home, autostart=False) as other:
            assert other.session("fence-1").attach().replaced is True
        # The other coordinator has gone too: the host's epoch stays fenced.
        host.type('{"summary": "x"}')
        assert host.exit_code() == 1
        said = host.stderr()
        taken = "another coordinator took over session fence-1; run `piwf session attach"
        assert said.count(taken) == 1, said
        assert "refused" not in said and "may do this" not in said, said
        # The fenced host changed nothing: the step still waits for a coordinator.
        detail = client.get_run(run.run_id)
        assert detail.run.status == "waiting"
        assert detail.waiting_on is not None and detail.waiting_on.kind == "agent"
        assert detail.waiting_on.submissions == 0
        assert client.run_view(run.run_id).display.status != "paused"


def test_a_waiting_host_fenced_by_another_coordinator_exits_1(
    server: ServerProcess, hosts: list[Host]
) -> None:
    host = start_host(hosts, server, "fence-2", stdin=subprocess.PIPE)
    host.wait_for_stderr("waiting for messages")
    with Client(server.home, autostart=False) as other:
        taker = other.session("fence-2")
        taker.attach()
        assert host.exit_code() == 1
        said = host.stderr()
        assert said.count("another coordinator took over session fence-2") == 1, said
        # The coordinator that took over is the one told about the session from now on.
        assert taker.view().active_epoch is True
    with Client(server.home, autostart=False) as client:
        fenced = client.session("fence-2")
        fenced.attach()
        with Client(server.home, autostart=False) as newer:
            newer.session("fence-2").attach()
            with pytest.raises(SessionAuthorityCommandError, match="attach again"):
                fenced.next_message(timeout_s=5)


def test_a_piped_host_refuses_bad_lines_and_goes_on_with_escaped_text(
    server: ServerProcess,
) -> None:
    """Lines no request can take (bytes that are not UTF-8, a duplicate key, a line larger than
    one request carries) are said and typed again, as a line that is not JSON is; the host
    neither stops nor leaves the turn open. What a workflow or a person wrote shows with its
    control characters escaped, in the host and in ``piwf session capture``."""
    topic = "x\x1b]0;PWNED\x07\rFORGED"
    oversized = b'{"note": "' + b"a" * 1_100_000 + b'"}\n'
    typed = (
        b'\xff\xfe{"note": 1}\n'
        + b'{"note": 1, "note": 2}\n'
        + b"bad \x1b]0;TITLE\x07\n"
        + oversized
        + b'{"note": "ok"}\n'
        + oversized
        + b'{"approved": true}\n'
    )
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": topic}, session="lines-1")
        env = {**os.environ, "PIWF_HOME": str(server.home)}
        host = subprocess.run(
            [str(PIWF), "session", "attach", "lines-1", "--exit-when-done"],
            input=typed,
            capture_output=True,
            env=env,
            timeout=EXIT_DEADLINE_S,
        )
        said, shown = host.stderr.decode(), host.stdout.decode()
        assert host.returncode == 0, said
        assert "Traceback" not in said and "Usage:" not in said, said
        assert "not JSON for piwf (badEncoding" in said, said
        assert "not JSON for piwf (duplicateKey" in said, said
        assert said.count("refused: invalid argument: payload:") == 2, said
        assert "\x1b" not in said + shown and "\r" not in shown, shown
        assert "Draft a one-line note about x\\x1b]0;PWNED\\x07\\rFORGED." in shown, shown
        done = client.wait_run(run.run_id, timeout_s=20)
        assert done.output == {"note": "ok", "approval": {"approved": True}}
        draft = client.read_capture(run.run_id)[0]
        assert [entry.content for entry in draft.entries[1:4]] == [
            '\ufffd\ufffd{"note": 1}',
            '{"note": 1, "note": 2}',
            "bad \x1b]0;TITLE\x07",
        ]
    capture = subprocess.run(
        [str(PIWF), "session", "capture", run.run_id],
        capture_output=True,
        env=env,
        timeout=EXIT_DEADLINE_S,
    )
    assert capture.returncode == 0, capture.stderr
    assert b"\x1b" not in capture.stdout and b"bad \\x1b]0;TITLE\\x07" in capture.stdout


def test_a_run_output_too_large_for_a_message_is_named_with_where_to_read_it(
    server: ServerProcess,
) -> None:
    """A terminal message carries a run's output up to 16 KiB; past that the host says how
    large it is and which command prints it (and that command does), not a bare status."""
    note = "n" * 20_000
    typed = json.dumps({"note": note}).encode() + b'\n{"approved": true}\n'
    env = {**os.environ, "PIWF_HOME": str(server.home)}
    with Client(server.home, autostart=False) as client:
        run = client.start_run(REVIEW, input={"topic": "x"}, session="large-1")
        host = subprocess.run(
            [str(PIWF), "session", "attach", "large-1", "--exit-when-done"],
            input=typed,
            capture_output=True,
            env=env,
            timeout=EXIT_DEADLINE_S,
        )
        assert host.returncode == 0, host.stderr
        size = len(canonical.encode(client.get_run(run.run_id).output))
    said = host.stdout.decode()
    assert (
        f"run completed: its output ({size} bytes) is kept with the run; "
        f"piwf run show {run.run_id} --json prints it"
    ) in said, said
    shown = subprocess.run(
        [str(PIWF), "run", "show", run.run_id, "--json"],
        capture_output=True,
        env=env,
        timeout=EXIT_DEADLINE_S,
        check=True,
    )
    assert json.loads(shown.stdout)["output"]["note"] == note


NOTED = """
from piwf.workflow import agent, checkpoint, define_workflow

def need_note(output, ctx):
    if not isinstance(output, dict) or not isinstance(output.get("note"), str):
        raise ValueError('give {"note": "some text"}')

workflow = define_workflow(
    name="noted",
    start_at="draft",
    nodes={
        "draft": agent(prompt="Draft.", expected_output='{"note": "text"}', validate=need_note),
        "approve": checkpoint(summary="Approve", run=lambda ctx: ctx.outputs["draft"]),
    },
    edges=[{"from": "draft", "to": "approve"}],
)
"""


def test_with_json_each_typed_lines_fate_is_a_document_beside_the_messages(
    server: ServerProcess, tmp_path: Path
) -> None:
    """``--json`` prints what became of each line too, so a script driving the host reads
    from stdout alone whether its value went in (stderr has the same in words)."""
    (tmp_path / "noted.py").write_text(NOTED)
    typed = b'nope\n5\n{"note": "ok"}\n{"approved": true}\n'
    with Client(server.home, autostart=False) as client:
        run = client.start_run(tmp_path / "noted.py", session="json-1")
        host = subprocess.run(
            [str(PIWF), "session", "attach", "json-1", "--exit-when-done", "--json"],
            input=typed,
            capture_output=True,
            env={**os.environ, "PIWF_HOME": str(server.home)},
            timeout=EXIT_DEADLINE_S,
        )
        assert host.returncode == 0, host.stderr.decode()
        documents = [json.loads(line) for line in host.stdout.decode().splitlines()]
        steps = {d["messageId"]: d for d in documents if "result" not in d and d["kind"] == "step"}
        results = [d for d in documents if "result" in d]
        assert [d["result"] for d in results] == ["notJson", "rejected", "accepted", "accepted"]
        assert all(d["runId"] == run.run_id for d in results)
        assert all(d["messageId"] in steps for d in results), results
        draft, approval = (steps[d["messageId"]]["content"]["requestId"] for d in results[2:])
        assert [d["requestId"] for d in results] == [draft, draft, draft, approval]
        assert 'give {"note": "some text"}' in results[1]["reason"]
        assert "reason" not in results[2]
        assert client.wait_run(run.run_id, timeout_s=20).run.status == "completed"
