"""Model turns of an origin session (``workflowTurn.report``) against a real server: the
server decides ownership, an aborted turn pauses the run, unproductive ends remind twice and
then fail the step, a stale turn cannot clear newer activity, an idle branch ends an open turn
``lost``, and an open turn counts the step's active time (docs/SESSIONS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwf.client import Client
from piwf.client.sessions import SessionCoordinator
from piwf.errors import ConflictError, RejectedError
from piwf.protocol.session_payloads import WorkflowMessageInfo
from tests.server.harness import ServerFactory, ServerProcess, wait_for
from tests.server.test_execution import FAST, write_workflow
from tests.server.test_sessions import CHAT, client_of, next_of


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def shown_step(client: Client, session_id: str) -> tuple[SessionCoordinator, WorkflowMessageInfo]:
    client.start_run(CHAT, input={"task": "x"}, session=session_id)
    host = client.session(session_id)
    message = next_of(host)
    host.delivered(message.message_id, f"entry-{message.order}")
    return host, message


# conformance: I5
def test_an_aborted_turn_pauses_the_run_and_a_resume_presents_the_step_once(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "t-abort")
        started = host.start_turn(message)
        assert started.ownership == "active" and started.turn is not None
        ended = host.end_turn(started.turn, "aborted")
        assert (ended.ownership, ended.paused) == ("settled", True)
        run_id = message.run_id
        view = client.run_view(run_id)
        assert view.display.status == "paused"
        assert host.view().next_message_id is None
        assert host.end_turn(started.turn, "aborted").ownership == "settled"  # a repeat adopts
        client.resume_run(run_id)
        resumed = next_of(host)
        assert (resumed.kind, resumed.reason) == ("step", "resumed")
        steps = [m for m in host.view().messages if m.kind == "step"]
        assert [m.reason for m in steps] == ["initial", "resumed"]
        # An abort is not an unproductive end: nothing was counted, no reminder was made.
        assert all(m.reason != "reminder" for m in steps)


def test_unproductive_turns_remind_twice_then_the_step_fails_missing_submission(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "t-remind")
        run_id = message.run_id
        current = message
        for expected in ("reminder", "reminder"):
            turn = host.start_turn(current)
            assert turn.turn is not None
            ended = host.end_turn(turn.turn, "completed", response_entry_id="reply")
            assert ended.reminder_message_id is not None and not ended.gave_up
            current = next_of(host)
            assert (current.message_id, current.reason) == (ended.reminder_message_id, expected)
            host.delivered(current.message_id, f"entry-{current.order}")
        last = host.start_turn(current)
        assert last.turn is not None
        assert host.end_turn(last.turn, "error").gave_up is True
        done = client.wait_run(run_id, timeout_s=30)
        assert done.run.status == "failed"
        assert done.error is not None and "missingSubmission" in done.error
        terminal = next_of(host)
        assert (terminal.kind, terminal.content["status"]) == ("terminal", "failed")


def test_a_stale_turn_cannot_clear_newer_activity(server: ServerProcess) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "t-stale")
        older = host.start_turn(message, turn_id="turn-older")
        newer = host.start_turn(message, turn_id="turn-newer")
        assert older.turn is not None and newer.ownership == "active"
        with pytest.raises(ConflictError, match="already ended lost"):
            host.end_turn(older.turn, "completed")
        again = host.start_turn(message, turn_id="turn-newer")
        assert again.ownership == "active" and again.turn is not None
        assert again.turn.state == "started"  # still the newer turn's activity


def test_a_turn_on_a_closed_message_is_not_workflow_work(server: ServerProcess) -> None:
    with client_of(server) as client:
        host, step = shown_step(client, "t-closed")
        host.submit(step.content["requestId"], {"steps": ["a", "b", "c"]})
        notification = next_of(host)
        host.delivered(notification.message_id, "entry-n")
        assert host.start_turn(notification).ownership == "absent"  # never opens a turn
        assert host.start_turn(step).ownership == "absent"  # answered


def test_an_idle_branch_report_ends_an_open_turn_lost_and_counts_it(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        host, message = shown_step(client, "t-idle")
        turn = host.start_turn(message)
        assert turn.turn is not None
        host.report_branch(idle=False)  # a busy session proves nothing about its turn
        assert host.start_turn(message, turn_id=turn.turn.turn_id).ownership == "active"
        host.report_branch(idle=True)
        settled = host.start_turn(message, turn_id=turn.turn.turn_id)
        assert settled.turn is not None
        assert (settled.ownership, settled.turn.stop_reason) == ("settled", "lost")
        reminder = next_of(host)
        assert reminder.reason == "reminder"


def test_an_open_turn_counts_the_steps_active_time(server: ServerProcess, tmp_path: Path) -> None:
    workflow = write_workflow(
        tmp_path,
        "timed",
        """
        from piwf.workflow import agent, define_workflow

        workflow = define_workflow(
            name="timed", start_at="ask",
            nodes={"ask": agent(prompt="Answer.", expected_output="{}", timeout_ms=600000)},
            edges=[],
        )
        """,
    )
    with client_of(server) as client:
        client.start_run(workflow, input={}, session="t-time")
        host = client.session("t-time")
        message = next_of(host)
        host.delivered(message.message_id, "entry-1")

        def counting() -> bool:
            [request] = [
                r for r in client.list_requests() if r.request_id == message.content["requestId"]
            ]
            assert request.active_time is not None
            return request.active_time.counting

        assert counting() is False  # shown but no turn: the deadline waits
        turn = host.start_turn(message)
        assert turn.turn is not None
        assert counting() is True
        host.end_turn(turn.turn, "completed")
        wait_for(lambda: not counting(), timeout_s=10, what="the interval to close")


ASSISTANT = """
from piwf.workflow import agent, assistant_message, compute, define_workflow

def no_shouting(output, ctx):
    if output.isupper():
        raise ValueError("do not shout: write the reply in normal case")
    return output.strip()

workflow = define_workflow(
    name="reply",
    start_at="reply",
    nodes={
        "reply": agent(
            prompt="Greet the user in one sentence.",
            expected_output=assistant_message(max_chars=40),
            validate=no_shouting,
        ),
        "finish": compute(lambda ctx: {"reply": ctx.outputs["reply"]}),
    },
    edges=[{"from": "reply", "to": "finish"}],
)
"""


def rejection(client: Client, run_id: str) -> str | None:
    waiting = client.get_run(run_id).waiting_on
    return None if waiting is None else waiting.latest_rejection


def test_an_assistant_message_step_takes_the_sessions_visible_reply(
    server: ServerProcess, tmp_path: Path
) -> None:
    workflow = write_workflow(tmp_path, "reply", ASSISTANT)
    with client_of(server) as client:
        with pytest.raises(RejectedError, match="--session") as headless:
            client.start_run(workflow, input={})
        assert headless.value.error_code == "sessionError"
        run = client.start_run(workflow, input={}, session="t-assistant")
        host = client.session("t-assistant")
        message = next_of(host)
        assert message.content["request"]["assistantMessage"] == {"maxChars": 40}
        assert "at most 40 characters" in message.content["request"]["prompt"]
        host.delivered(message.message_id, "entry-1")
        long = host.start_turn(message)
        assert long.turn is not None
        refused = host.end_turn(long.turn, "completed", response_text="x" * 41)
        assert refused.refusal is not None and "41 characters" in refused.refusal
        assert refused.reminder_message_id is not None  # too long: an unproductive turn
        reminder = next_of(host)
        host.delivered(reminder.message_id, "entry-2")
        shout = host.start_turn(reminder)
        assert shout.turn is not None
        submitted = host.end_turn(shout.turn, "completed", response_text="HELLO THERE")
        assert submitted.submission_id is not None
        wait_for(
            lambda: (
                client.get_run(run.run_id).waiting_on is not None
                and client.get_run(run.run_id).waiting_on.latest_rejection is not None
            ),  # type: ignore[union-attr]
            timeout_s=30,
            what="the validation to reject the shouted reply",
        )
        # Rejected: the request stays pending and its sent reminder stays open for a new turn
        # (a turn that ended with a validating reply was not counted: no new reminder).
        assert host.view().next_message_id is None
        good = host.start_turn(reminder)
        assert good.turn is not None
        host.end_turn(good.turn, "completed", response_text="  Hello, and welcome!  ")
        done = client.wait_run(run.run_id, timeout_s=30)
        assert done.run.status == "completed"
        assert done.output == {"reply": "Hello, and welcome!"}
