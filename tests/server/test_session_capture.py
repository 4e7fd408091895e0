"""Session capture against a real server (docs/SESSIONS.md, "Session capture"): what a session
reports of an accepted turn is stored per attempt, in order, bounded, fenced to the active
epoch, kept across a server restart, finished by the turn's end (failed only by a proved
interruption), never copied into the run's results, and read back whole through the client
and ``piwf session capture``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from piwf.client import CapturedEntry, CapturedEvent, Client
from piwf.client.sessions import SessionCoordinator
from piwf.errors import ConflictError, NotFoundError, RejectedError
from piwf.protocol.session_payloads import WorkflowMessageInfo
from piwf.state.execution.session_capture import MAX_SEGMENT_ENTRIES
from tests.server.harness import ServerFactory, ServerProcess
from tests.server.test_execution import FAST, write_workflow
from tests.server.test_sessions import CHAT, client_of, next_of

HELLO = Path(__file__).resolve().parents[2] / "fixtures" / "workflows" / "hello.py"

ONE_STEP = """
from piwf.workflow import agent, define_workflow

workflow = define_workflow(
    name="one_step", start_at="ask",
    nodes={"ask": agent(prompt="Answer.", expected_output='{"answer": "text"}')},
    edges=[],
)
"""


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def shown_step(
    client: Client, session_id: str, workflow: str = CHAT
) -> tuple[SessionCoordinator, WorkflowMessageInfo]:
    client.start_run(workflow, input={"task": "x"}, session=session_id)
    host = client.session(session_id)
    message = next_of(host)
    host.delivered(message.message_id, f"entry-{message.order}")
    return host, message


def entry(entry_id: str, kind: str, content: object, role: str | None = None) -> CapturedEntry:
    return CapturedEntry(entry_id=entry_id, kind=kind, content=content, role=role)


# conformance: I6
def test_a_turns_capture_is_kept_in_order_and_read_back_whole(server: ServerProcess) -> None:
    marker = "tool-output-" + "x" * 40_000  # more than a frame carries inline
    with client_of(server) as client:
        host, message = shown_step(client, "c-whole")
        run_id, request_id = message.run_id, message.content["requestId"]
        started = host.start_turn(message)
        assert started.ownership == "active" and started.turn is not None
        receipt = host.record(
            started.turn,
            entries=[
                entry("entry-1", "workflowMessage", message.content),  # the step message
                entry("call-1", "toolCall", {"name": "grep", "args": ["-r", "x"]}),
                entry("result-1", "toolResult", marker),
            ],
            events=[CapturedEvent(event_type="toolCall", payload={"n": 1}, tool_call_id="c1")],
        )
        assert (receipt.stored_entries, receipt.stored_events, receipt.status) == (
            3,
            1,
            "recording",
        )
        host.submit(request_id, {"steps": ["a", "b", "c"]})
        more = host.record(
            started.turn,
            entries=[{"entryId": "reply-1", "kind": "assistant", "content": "Planned."}],
        )
        assert more.entry_count == 4
        ended = host.end_turn(started.turn, "completed", response_entry_id="reply-1")
        assert ended.ownership == "settled"

        [turn] = client.read_capture(run_id)
        segment = turn.segment
        assert (segment.node_path, segment.status, segment.failure) == ("plan", "complete", None)
        assert segment.turn_id == started.turn.turn_id and segment.session_id == "c-whole"
        assert [e.entry_id for e in turn.entries] == ["entry-1", "call-1", "result-1", "reply-1"]
        assert [e.entry_seq for e in turn.entries] == [1, 2, 3, 4]
        assert turn.entries[2].content == marker  # read back by reference, verified, whole
        assert turn.entries[2].content_ref is None
        assert turn.entries[0].content == message.content
        assert segment.roles == {
            "prompt": "entry-1",  # the entry that holds the step message
            "response": "reply-1",  # the turn's reported reply
            "first": "entry-1",
            "last": "reply-1",
        }
        assert [e.event_type for e in turn.events] == ["turnStart", "toolCall", "turnEnd"]
        assert turn.events[1].tool_call_id == "c1" and turn.events[1].payload == {"n": 1}
        assert turn.events[2].payload == {"stopReason": "completed"}
        by_attempt = client.read_capture(run_id, attempt_id=segment.attempt_id)
        assert [t.segment.segment_id for t in by_attempt] == [segment.segment_id]

        # The history stays in the capture: nothing of it went into the run's results.
        detail = client.get_run(run_id)
        view = client.run_view(run_id)
        assert "tool-output-" not in detail.model_dump_json()
        assert "tool-output-" not in view.model_dump_json()


def test_a_repeat_adopts_and_bad_records_are_refused_and_change_nothing(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "c-bad")
        started = host.start_turn(message)
        assert started.turn is not None
        turn = started.turn
        first = host.record(turn, entries=[entry("e1", "user", "hello")])
        assert (first.stored_entries, first.adopted_entries) == (1, 0)
        again = host.record(turn, entries=[entry("e1", "user", "hello")])
        assert (again.stored_entries, again.adopted_entries, again.entry_count) == (0, 1, 1)
        with pytest.raises(ConflictError, match="recorded before with other content"):
            host.record(turn, entries=[entry("e2", "user", "new"), entry("e1", "user", "bye")])
        oversized = "y" * (256 * 1024)
        with pytest.raises(RejectedError, match=r"entries\[0\]\.content: .* at most 262144"):
            host.record(turn, entries=[entry("e3", "user", oversized)])
        with pytest.raises(RejectedError, match="recorded by the server itself"):
            host.record(turn, events=[CapturedEvent(event_type="turnEnd", payload={})])
        with pytest.raises(RejectedError, match="bogus"):
            client.request(
                "sessionCapture.record",
                {
                    "sessionId": "c-bad",
                    "coordinatorEpoch": host.epoch,
                    "turnId": turn.turn_id,
                    "entries": [{"entryId": "e4", "kind": "user", "content": 1, "bogus": 2}],
                },
            )
        with pytest.raises(NotFoundError, match="is not an accepted turn"):
            host.record("turn-never-started", entries=[entry("e5", "user", "x")])
        [captured] = client.read_capture(message.run_id)
        assert [e.entry_id for e in captured.entries] == ["e1"]  # e2 went with its batch
        assert captured.segment.entry_count == 1


def test_only_the_active_epoch_records(server: ServerProcess) -> None:
    with client_of(server) as client, client_of(server) as other:
        host, message = shown_step(client, "c-fence")
        started = host.start_turn(message)
        assert started.turn is not None
        replacement = other.session("c-fence")
        replacement.attach()  # fences the first coordinator
        with pytest.raises(RejectedError) as fenced:
            host.record(started.turn, entries=[entry("e1", "user", "stale")])
        assert fenced.value.error_code == "sessionAuthority"
        stored = replacement.record(started.turn, entries=[entry("e1", "user", "current")])
        assert stored.stored_entries == 1
        [captured] = other.read_capture(message.run_id)
        assert [e.content for e in captured.entries] == ["current"]


def test_a_proved_interruption_fails_the_capture_and_a_finished_one_takes_nothing_new(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "c-abort")
        started = host.start_turn(message)
        assert started.turn is not None
        host.record(started.turn, entries=[entry("e1", "user", "go")])
        host.end_turn(started.turn, "aborted")
        [captured] = client.read_capture(message.run_id)
        assert (captured.segment.status, captured.segment.failure) == (
            "failed",
            "the turn ended aborted",
        )
        with pytest.raises(ConflictError, match="before you report its end"):
            host.record(started.turn, entries=[entry("e2", "assistant", "late")])
        repeat = host.record(started.turn, entries=[entry("e1", "user", "go")])
        assert repeat.adopted_entries == 1  # a retry of what was stored still adopts


def test_the_run_ending_first_leaves_the_capture_open_until_the_turns_end(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write_workflow(tmp_path, "one_step", ONE_STEP)
    with client_of(server) as client:
        host, message = shown_step(client, "c-late", workflow)
        started = host.start_turn(message)
        assert started.turn is not None
        host.submit(message.content["requestId"], {"answer": "42"})  # within the turn
        assert client.wait_run(message.run_id, timeout_s=30).run.status == "completed"
        # The run's end closed the turn, not its capture: the session goes on recording.
        [open_turn] = client.read_capture(message.run_id)
        assert open_turn.segment.status == "recording"
        host.record(started.turn, entries=[entry("reply", "assistant", "It is 42.")])
        late = host.end_turn(started.turn, "completed", response_entry_id="reply")
        assert late.ownership == "settled" and late.turn is not None
        assert late.turn.stop_reason == "lost"  # the run's terminal change ended it
        [finished] = client.read_capture(message.run_id)
        assert finished.segment.status == "complete"
        assert finished.segment.roles["response"] == "reply"


def test_an_idle_session_fails_a_capture_whose_end_never_came(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write_workflow(tmp_path, "one_step", ONE_STEP)
    with client_of(server) as client:
        host, message = shown_step(client, "c-idle", workflow)
        started = host.start_turn(message)
        assert started.turn is not None
        host.submit(message.content["requestId"], {"answer": "42"})
        assert client.wait_run(message.run_id, timeout_s=30).run.status == "completed"
        host.report_branch(idle=True)
        [captured] = client.read_capture(message.run_id)
        assert captured.segment.status == "failed"
        assert captured.segment.failure == "the session went idle without reporting the turn's end"


def test_a_segment_is_bounded_and_counts_what_it_dropped(server: ServerProcess) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "c-bound")
        started = host.start_turn(message)
        assert started.turn is not None
        batch = 200
        last = None
        for start in range(0, MAX_SEGMENT_ENTRIES + 50, batch):
            entries = [entry(f"e{n}", "user", n) for n in range(start, start + batch)]
            last = host.record(started.turn, entries=entries)
        assert last is not None
        total = (MAX_SEGMENT_ENTRIES + 50 + batch - 1) // batch * batch
        assert last.entry_count == MAX_SEGMENT_ENTRIES
        [captured] = client.read_capture(message.run_id)
        assert captured.segment.dropped_entries == total - MAX_SEGMENT_ENTRIES
        assert len(captured.entries) == MAX_SEGMENT_ENTRIES  # read back over several pages
        assert [e.content for e in captured.entries[-2:]] == [
            MAX_SEGMENT_ENTRIES - 2,
            MAX_SEGMENT_ENTRIES - 1,
        ]


def test_the_capture_survives_a_server_restart_and_goes_on(
    servers: ServerFactory, server: ServerProcess
) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "c-restart")
        started = host.start_turn(message)
        assert started.turn is not None
        host.record(started.turn, entries=[entry("e1", "user", "before")])
    server.terminate()
    again = servers.start(env=FAST)
    assert again.ready["ok"] is True, again.ready
    with client_of(again) as client:
        host = client.session("c-restart")
        resumed = host.start_turn(message, turn_id=started.turn.turn_id)
        assert resumed.ownership == "active"  # a restart closes no turn
        host.record(started.turn, entries=[entry("e2", "assistant", "after")])
        [captured] = client.read_capture(message.run_id)
        assert captured.segment.status == "recording"
        assert [e.entry_id for e in captured.entries] == ["e1", "e2"]


def test_piwf_session_capture_prints_the_turns(server: ServerProcess) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "c-cli")
        started = host.start_turn(message)
        assert started.turn is not None
        host.record(started.turn, entries=[entry("e1", "assistant", "A plan in three steps.")])
        host.end_turn(started.turn, "error")
    command = [sys.executable, "-m", "piwf", "session", "capture", message.run_id]
    env = {"PIWF_HOME": str(server.home), "PATH": "/usr/bin:/bin"}
    shown = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"turn {started.turn.turn_id} on plan (failed: the turn ended error)" in shown.stdout
    assert "A plan in three steps." in shown.stdout
    as_json = subprocess.run(
        [*command, "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    document = json.loads(as_json.stdout)
    [turn] = document["turns"]
    assert turn["entries"][0]["content"] == "A plan in three steps."
    assert turn["segment"]["status"] == "failed"
    other_attempt = subprocess.run(
        [*command, "--attempt", "attempt-nope"], env=env, capture_output=True, text=True, timeout=60
    )
    assert other_attempt.returncode == 0, other_attempt.stderr
    assert other_attempt.stdout == (
        f"run {message.run_id} has no captured turns of attempt attempt-nope:"
        f" piwf session capture {message.run_id} shows every captured turn of the run\n"
    )
    unknown = subprocess.run(
        [sys.executable, "-m", "piwf", "session", "capture", "run-nope"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode != 0 and "no run run-nope" in unknown.stderr
    with client_of(server) as client:
        headless = client.start_run(HELLO, input={"who": "ada"})
    of_headless = subprocess.run(
        [sys.executable, "-m", "piwf", "session", "capture", headless.run_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert of_headless.returncode == 0, of_headless.stderr
    assert of_headless.stdout == (
        f"run {headless.run_id} has no captured turns: it is headless (no session); only a"
        " run started with --session SESSION_ID is interactive (docs/SESSIONS.md)\n"
    )
