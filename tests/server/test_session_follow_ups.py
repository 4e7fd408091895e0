"""Follow-ups of an interactive run (``followUp.queue``/``remove``) against a real server: a
follow-up waits for the run's final outcome, its terminal message and turn, earlier follow-ups
and the release of the session; failure and cancel cancel it (docs/SESSIONS.md)."""

from __future__ import annotations

import pytest

from piwf.client.sessions import SessionCoordinator
from piwf.errors import NotFoundError, RejectedError
from piwf.protocol.session_payloads import WorkflowMessageInfo
from tests.server.harness import ServerFactory, ServerProcess
from tests.server.test_execution import FAST
from tests.server.test_sessions import CHAT, CHECKPOINT, client_of, next_of


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def complete_chat(host: SessionCoordinator, message: WorkflowMessageInfo) -> WorkflowMessageInfo:
    """Answer the chat workflow's steps (and show its notification) up to its terminal."""
    while message.kind != "terminal":
        host.delivered(message.message_id, f"entry-{message.order}")
        if message.kind == "step":
            planning = "Plan" in message.content["request"]["prompt"]
            answer = {"steps": ["a", "b", "c"]} if planning else {"verdict": "ok"}
            host.submit(message.content["requestId"], answer)
        message = next_of(host)
    return message


# conformance: I6
def test_follow_ups_wait_for_the_outcome_its_terminal_turn_and_each_other(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        run = client.start_run(CHAT, input={"task": "x"}, session="f-wait")
        host = client.session("f-wait")
        step = next_of(host)
        first = host.queue_follow_up(run.run_id, "Now write the release notes.")
        second = host.queue_follow_up(run.run_id, "And a short announcement.")
        assert (first.state, second.state) == ("pending", "pending")
        assert host.view().next_message_id == step.message_id  # the run's work comes first
        terminal = complete_chat(host, step)
        assert terminal.content["status"] == "completed"
        host.delivered(terminal.message_id, "entry-terminal")
        turn = host.start_turn(terminal)
        assert turn.ownership == "active" and turn.turn is not None
        assert host.view().next_message_id is None  # the terminal turn is still open
        host.end_turn(turn.turn, "completed")
        follow = next_of(host)
        assert (follow.message_id, follow.kind) == (first.message_id, "followUp")
        assert follow.content["prompt"] == "Now write the release notes."
        host.delivered(follow.message_id, "entry-f1")
        follow_turn = host.start_turn(follow)
        assert follow_turn.ownership == "active" and follow_turn.turn is not None
        assert host.view().next_message_id is None  # the earlier follow-up's turn is open
        host.end_turn(follow_turn.turn, "completed")
        assert host.start_turn(follow).ownership == "absent"  # open only until its first turn
        later = next_of(host)
        assert later.message_id == second.message_id


def test_a_follow_up_waits_while_another_run_holds_the_session(server: ServerProcess) -> None:
    with client_of(server) as client:
        run = client.start_run(CHAT, input={"task": "x"}, session="f-hold")
        host = client.session("f-hold")
        terminal = complete_chat(host, next_of(host))
        follow = host.queue_follow_up(run.run_id, "Summarise.")
        holder = client.start_run(CHECKPOINT, input={"steps": []}, session="f-hold")
        host.delivered(terminal.message_id, "entry-t")
        step = next_of(host)
        assert step.run_id == holder.run_id  # the new run's checkpoint, not the follow-up
        client.cancel_run(holder.run_id)
        # The session is free again: the follow-up, queued first, comes before the holder's
        # terminal message.
        assert next_of(host).message_id == follow.message_id
        host.delivered(follow.message_id, "entry-f")
        cancelled_terminal = next_of(host)
        assert cancelled_terminal.content["status"] == "cancelled"


def test_cancel_and_failure_cancel_pending_follow_ups_and_remove_withdraws_one(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        run = client.start_run(CHAT, input={"task": "x"}, session="f-cancel")
        host = client.session("f-cancel")
        next_of(host)
        kept = host.queue_follow_up(run.run_id, "one")
        removed = host.remove_follow_up(host.queue_follow_up(run.run_id, "two").message_id)
        assert removed.state == "cancelled"
        with pytest.raises(RejectedError, match="only a pending follow-up"):
            host.remove_follow_up(removed.message_id)
        with pytest.raises(NotFoundError):
            client.session("elsewhere").remove_follow_up(kept.message_id)
        client.cancel_run(run.run_id)
        terminal = next_of(host)
        host.delivered(terminal.message_id, "entry-t")
        assert host.next_message(timeout_s=0.5) is None  # the cancel cancelled "one"
        with pytest.raises(RejectedError, match="ended cancelled"):
            host.queue_follow_up(run.run_id, "three")
        headless = client.start_run(CHECKPOINT, input={"steps": []})
        with pytest.raises(RejectedError, match="headless"):
            host.queue_follow_up(headless.run_id, "four")
        with pytest.raises(NotFoundError, match="no run run-missing") as unknown:
            host.queue_follow_up("run-missing", "five")
        assert unknown.value.error_code == "runNotFound"
