"""Interactive runs and their origin session, against a real server with real runners: the
binding and its reservation, workflow messages, one coordinator per session, branch evidence,
pause and resume, the terminal message (docs/SESSIONS.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from piwf.client import Client
from piwf.client.sessions import SessionCoordinator
from piwf.errors import ConflictError, RejectedError, SessionAuthorityCommandError, SessionError
from piwf.protocol.session_payloads import WorkflowMessageInfo
from tests.server.harness import ServerFactory, ServerProcess, wait_for
from tests.server.test_agent_deadlines import piwf
from tests.server.test_execution import FAST

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "workflows"
CHAT = str(FIXTURES / "session_chat.py")
CHECKPOINT = str(FIXTURES / "checkpoint_review.py")
HELLO = str(FIXTURES / "hello.py")


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def client_of(server: ServerProcess) -> Client:
    return Client(server.home, autostart=False)


def next_of(session: SessionCoordinator, timeout_s: float = 30) -> WorkflowMessageInfo:
    message = session.next_message(timeout_s=timeout_s)
    assert message is not None, f"no message for session {session.session_id} in {timeout_s} s"
    return message


def finished(client: Client, run_id: str) -> Any:
    return client.wait_run(run_id, timeout_s=30).run


def test_a_run_bound_to_a_session_reserves_it_until_it_ends(server: ServerProcess) -> None:
    with client_of(server) as client:
        first = client.start_run(CHECKPOINT, input={"steps": []}, session="s-reserve")
        assert client.get_run(first.run_id).session == "s-reserve"
        with pytest.raises(ConflictError, match="reserved by run") as refused:
            client.start_run(HELLO, input={"who": "x"}, session="s-reserve")
        assert refused.value.error_code == "sessionBusy"
        assert first.run_id in str(refused.value)
        headless = client.start_run(HELLO, input={"who": "x"})  # reserves nothing
        assert client.get_run(headless.run_id).session is None
        client.cancel_run(first.run_id)  # an explicit cancel releases the session
        second = client.start_run(HELLO, input={"who": "y"}, session="s-reserve")
        assert finished(client, second.run_id).status == "completed"
        [listed] = [s for s in client.list_sessions() if s.session_id == "s-reserve"]
        assert (listed.runs, listed.active_run_id) == (2, None)


# conformance: I1
def test_an_agent_step_appears_once_and_survives_the_sessions_restart(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        run = client.start_run(CHAT, input={"task": "a release"}, session="s-once")
        session = client.session("s-once")
        message = next_of(session)
        assert (message.kind, message.reason, message.state) == ("step", "initial", "pending")
        assert message.content["request"]["prompt"].startswith("Plan a release in three steps.")
        request_id = message.content["requestId"]
        prompt = message.content["request"]["prompt"]
        assert "through this session" in prompt and "piwf submit" not in prompt
        # The host "restarts" before it shows anything: a new client, a new epoch.
    with client_of(server) as client:
        again = client.session("s-once")
        same = next_of(again)
        assert same.message_id == message.message_id  # the same message, not a second one
        steps = [m for m in again.view().messages if m.kind == "step"]
        assert [m.message_id for m in steps] == [message.message_id]
        again.delivered(same.message_id, "entry-1")
        receipt = again.submit(request_id, {"steps": ["tag", "build", "ship"]})
        assert receipt.outcome == "accepted"
        notification = next_of(again)
        assert notification.kind == "notification"
        assert notification.content["message"] == "The plan is in; reviewing it next."
        again.delivered(notification.message_id, "entry-2")
        review = next_of(again)
        assert review.kind == "step"
        assert review.content["request"]["prompt"].startswith(
            "Review this plan: ['tag', 'build', 'ship']"
        )
        again.delivered(review.message_id, "entry-3")
        again.submit(review.content["requestId"], {"verdict": "fine"})
        terminal = next_of(again)
        assert terminal.kind == "terminal"
        assert terminal.content["status"] == "completed"
        assert terminal.content["output"] == {"steps": ["tag", "build", "ship"], "verdict": "fine"}
        again.delivered(terminal.message_id, "entry-4")
        assert again.next_message(timeout_s=0.5) is None
        assert finished(client, run.run_id).status == "completed"
        states = {m.message_id: (m.state, m.entry_id) for m in again.view().messages}
        assert all(state == "sent" for state, _ in states.values()) or states == {}


# conformance: I2
def test_two_coordinators_for_one_session_only_the_newest_sends(server: ServerProcess) -> None:
    with client_of(server) as first_client, client_of(server) as second_client:
        first_client.start_run(CHAT, input={"task": "x"}, session="s-two")
        first = first_client.session("s-two")
        message = next_of(first)
        second = second_client.session("s-two")
        assert second.attach().replaced is True
        assert second.view().next_message_id == message.message_id
        assert first.view().next_message_id is None  # fenced: told nothing to send
        with pytest.raises(SessionAuthorityCommandError, match="another coordinator took over"):
            first.next_message(timeout_s=5)  # told it was fenced, instead of waiting in vain
        with pytest.raises(RejectedError) as fenced:
            first.delivered(message.message_id, "entry-old")
        assert fenced.value.error_code == "sessionAuthority"
        # A coordinator is told to attach again, not how to act as the session.
        assert "attach again" in str(fenced.value)
        assert "piwf session attach" not in str(fenced.value)
        with pytest.raises(RejectedError) as refused:
            first.submit(message.content["requestId"], {"steps": ["a", "b", "c"]})
        assert refused.value.error_code == "sessionAuthority"
        # Nothing was stored for the fenced report: the same report from the new epoch applies.
        assert second.delivered(message.message_id, "entry-new").sent == [message.message_id]
        [shown] = [m for m in second.view().messages if m.message_id == message.message_id]
        assert (shown.state, shown.entry_id) == ("sent", "entry-new")


def test_a_plain_submit_to_an_interactive_run_is_refused_and_changes_nothing(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        run = client.start_run(CHAT, input={"task": "x"}, session="s-plain")
        message = next_of(client.session("s-plain"))
        with pytest.raises(RejectedError) as refused:
            client.submit(message.content["requestId"], {"steps": ["a", "b", "c"]})
        assert refused.value.error_code == "sessionAuthority"
        assert "piwf session attach s-plain" in str(refused.value)
        detail = client.get_run(run.run_id)
        assert detail.waiting_on is not None
        assert detail.waiting_on.request_id == message.content["requestId"]


def test_a_crash_after_the_send_leaves_the_message_pending_until_evidence_adopts_it(
    server: ServerProcess,
) -> None:
    conversation: dict[str, str] = {}  # message id -> entry id: what the "chat" holds
    with client_of(server) as client:
        client.start_run(CHAT, input={"task": "x"}, session="s-crash")
        host = client.session("s-crash")
        message = next_of(host)
        conversation[message.message_id] = "entry-7"  # shown ... and the host dies here
    with client_of(server) as client:

        def inspect(messages: list[WorkflowMessageInfo]) -> Any:
            found = {
                m.message_id: conversation[m.message_id]
                for m in messages
                if m.message_id in conversation
            }
            return found, [], True

        probe = client.session("s-crash")
        [pending] = [m for m in probe.view().messages if m.message_id == message.message_id]
        assert pending.state == "pending"  # the server never guesses a send
        restarted = client.session("s-crash", inspect_branch=inspect)
        restarted.attach()  # reports the branch before anything is handed out
        [adopted] = [m for m in restarted.view().messages if m.message_id == message.message_id]
        assert (adopted.state, adopted.entry_id) == ("sent", "entry-7")
        assert restarted.view().next_message_id is None  # nothing is shown twice


def test_a_branch_that_lost_a_sent_step_presents_it_again_once(server: ServerProcess) -> None:
    with client_of(server) as client:
        client.start_run(CHAT, input={"task": "x"}, session="s-lost")
        host = client.session("s-lost")
        message = next_of(host)
        host.delivered(message.message_id, "entry-1")
        busy = host.report_branch(missing=[message.message_id], idle=False)
        assert busy.presented_again == []  # absence proves nothing while the session is busy
        lost = host.report_branch(missing=[message.message_id], idle=True)
        [again_id] = lost.presented_again
        again = next_of(host)
        assert (again.message_id, again.kind, again.reason) == (again_id, "step", "resumed")
        assert again.content["requestId"] == message.content["requestId"]
        repeat = host.report_branch(missing=[message.message_id], idle=True)
        assert repeat.presented_again == [again_id]  # the pending one is kept, none is added
        steps = [m for m in host.view().messages if m.kind == "step"]
        assert len(steps) == 2
        pending_missing = host.report_branch(missing=[again_id], idle=True)
        assert pending_missing.presented_again == []  # a pending message proves nothing


# conformance: I5
def test_pause_withdraws_the_step_and_resume_presents_it_once(server: ServerProcess) -> None:
    with client_of(server) as client:
        run = client.start_run(CHAT, input={"task": "x"}, session="s-pause")
        host = client.session("s-pause")
        message = next_of(host)
        client.pause_run(run.run_id)
        [withdrawn] = [m for m in host.view().messages if m.message_id == message.message_id]
        assert withdrawn.state == "cancelled"
        assert host.view().next_message_id is None
        client.resume_run(run.run_id)
        resumed = next_of(host)
        assert (resumed.kind, resumed.reason) == ("step", "resumed")
        client.resume_run(run.run_id)  # a repeated resume adds nothing
        steps = [m for m in host.view().messages if m.kind == "step"]
        assert [m.reason for m in steps] == ["initial", "resumed"]
        host.delivered(resumed.message_id, "entry-1")
        assert host.submit(resumed.content["requestId"], {"steps": ["a", "b", "c"]}).outcome == (
            "accepted"
        )


# conformance: I6
def test_a_cancelled_run_gets_one_terminal_message_and_its_steps_are_withdrawn(
    server: ServerProcess,
) -> None:
    with client_of(server) as client:
        run = client.start_run(CHAT, input={"task": "x"}, session="s-cancel")
        host = client.session("s-cancel")
        step = next_of(host)
        client.cancel_run(run.run_id)
        terminal = next_of(host)
        assert (terminal.kind, terminal.content["status"]) == ("terminal", "cancelled")
        # The window keeps a finished run's pending messages only: the step is withdrawn.
        window = {m.message_id: m.state for m in host.view().messages}
        assert window == {terminal.message_id: "pending"}
        assert step.message_id not in window
        host.delivered(terminal.message_id, "entry-1")
        assert host.next_message(timeout_s=0.3) is None
        assert host.view().active_run_id is None


def test_bad_session_requests_are_refused_and_change_nothing(server: ServerProcess) -> None:
    with client_of(server) as client:
        with pytest.raises(RejectedError, match="sessionId"):
            client.request("session.view", {"sessionId": "no spaces allowed"})
        with pytest.raises(SessionError, match="a session id is"):
            client.start_run(HELLO, input={"who": "x"}, session="bad id!")
        with pytest.raises(RejectedError, match="session"):  # a raw request: the server checks
            client.request("run.start", {"workflow": HELLO, "session": "bad id!"})
        client.start_run(CHAT, input={"task": "x"}, session="s-bad")
        host = client.session("s-bad")
        message = next_of(host)
        client.start_run(CHAT, input={"task": "y"}, session="s-other")
        other = next_of(client.session("s-other"))
        with pytest.raises(RejectedError, match="not a message of session s-bad"):
            host.delivered(other.message_id, "entry-x")
        with pytest.raises(RejectedError, match="extra: Extra inputs are not permitted"):
            client.request(
                "workflowMessage.reportBranch",
                {"sessionId": "s-bad", "coordinatorEpoch": host.epoch, "extra": 1},
            )
        [still] = [m for m in host.view().messages if m.message_id == message.message_id]
        assert still.state == "pending"
        wait_for(lambda: host.view().next_message_id == message.message_id, timeout_s=5)


def test_the_cli_binds_a_run_lists_its_session_and_shows_its_messages(
    server: ServerProcess,
) -> None:
    started = piwf(server, "run", "start", CHAT, "--input", '{"task": "x"}', "--session", "cli-1")
    assert started.returncode == 0, started.stderr
    busy = piwf(server, "run", "start", HELLO, "--session", "cli-1", "--json")
    assert busy.returncode == 1
    assert json.loads(busy.stdout)["error"]["code"] == "sessionBusy"
    with client_of(server) as client:
        message = next_of(client.session("cli-1"))
    listed = json.loads(piwf(server, "session", "list", "--json").stdout)
    [session] = listed["sessions"]
    assert (session["sessionId"], session["runs"], session["pendingMessages"]) == ("cli-1", 1, 1)
    shown = json.loads(piwf(server, "session", "show", "cli-1", "--json").stdout)
    assert [m["messageId"] for m in shown["messages"]] == [message.message_id]
    assert "nextMessageId" not in shown  # a reader holds no epoch: it is told nothing to send
    run_id = json.loads(piwf(server, "run", "list", "--json").stdout)["runs"][0]["runId"]
    shown_run = piwf(server, "run", "show", run_id).stdout
    assert re.search(r"session +cli-1 \(interactive\)", shown_run), shown_run
    assert "next      piwf session attach cli-1" in shown_run  # not piwf submit: refused here
    assert "piwf submit" not in shown_run
    assert "through its session: piwf session attach cli-1" in shown_run
    listed_requests = json.loads(piwf(server, "requests", "--run", run_id, "--json").stdout)
    assert [r["session"] for r in listed_requests["requests"]] == ["cli-1"]
    assert "through its session: piwf session attach cli-1" in piwf(server, "requests").stdout
    text = piwf(server, "session", "show", "cli-1").stdout
    assert message.message_id in text and "step (initial)" in text and "pending" in text
    assert piwf(server, "session", "show", "bad id!").returncode != 0


def test_a_protected_decision_is_a_decision_message_a_person_answers(
    server: ServerProcess,
) -> None:
    decision = str(FIXTURES / "decision_timeout.py")
    with client_of(server) as client:
        run = client.start_run(decision, input={"release": "1.2"}, session="s-decide")
        host = client.session("s-decide")
        message = next_of(host)
        assert (message.kind, message.reason) == ("decision", None)
        host.delivered(message.message_id, "entry-1")
        assert host.start_turn(message).ownership == "absent"  # a decision opens no turn
        client.pause_run(run.run_id)  # a pause leaves a decision presentable
        [kept] = [m for m in host.view().messages if m.message_id == message.message_id]
        assert kept.state == "sent"
        client.resume_run(run.run_id)
        assert [m.kind for m in host.view().messages].count("decision") == 1  # none added
        # A person answers a protected decision: no coordinator epoch is needed.
        client.answer(message.content["requestId"], {"choice": "ship"})
        assert client.wait_run(run.run_id, timeout_s=30).output == {"shipped": "1.2"}
        terminal = next_of(host)
        assert (terminal.kind, terminal.content["status"]) == ("terminal", "completed")
