"""Subscriptions to the live run view (``view.run.watch``, ``view.runs.watch``, ``view.unwatch``)
on real servers: pushed ``event`` frames, in revision order, coalesced for a slow reader, ended
by unwatch and by the connection's end, refused for bad input. Gate files pace runs; every
wait polls against a deadline.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from piwf import Client
from piwf.protocol import Event, Response
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client, wait_for
from tests.server.test_execution import FAST, hold_until_gate, start, write_workflow

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT = str(REPO / "fixtures" / "workflows" / "checkpoint_review.py")


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def paced_workflow(directory: Path, gates: Path) -> str:
    """Three nodes, each held until the test opens its gate file."""
    return write_workflow(
        directory,
        "paced",
        f"""
        import pathlib
        from piwf.workflow import compute, define_workflow

        {hold_until_gate()}

        def held(name):
            def node(ctx):
                base = pathlib.Path({str(gates)!r})
                wait_for_gate(str(base / (name + ".entered")), str(base / name))
                return {{"node": name}}
            return node

        workflow = define_workflow(
            name="paced",
            start_at="a",
            nodes={{"a": compute(held("a")), "b": compute(held("b")), "c": compute(held("c"))}},
            edges=[{{"from": "a", "to": "b"}}, {{"from": "b", "to": "c"}}],
        )
        """,
    )


def next_event(client: RawClient, subscription_id: str) -> Event:
    """The next event of ``subscription_id`` on ``client`` (other messages are kept out)."""
    while True:
        message = client.receive()
        if isinstance(message, Event) and message.subscription_id == subscription_id:
            return message
        assert isinstance(message, Event), f"an unexpected message: {message}"


def test_a_subscriber_sees_each_revision_of_a_running_run_in_order(
    server: ServerProcess, tmp_path: Path
) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    workflow = paced_workflow(tmp_path, gates)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "paced")
    seen: list[tuple[int, str, str | None]] = []
    with Client(server.home, autostart=False) as client:
        for view in client.watch_run(run_id, idle_timeout_s=30):
            node = view.display.current_node
            seen.append((view.revision, view.display.status, None if node is None else node.path))
            if node is not None:
                (gates / node.path).touch()  # the next change comes only after this view
        final = client.get_run(run_id)
    revisions = [revision for revision, _status, _node in seen]
    assert revisions == sorted(set(revisions)), "strictly increasing, none twice"
    assert [node for _r, _s, node in seen if node] == ["a", "b", "c"]
    assert seen[-1][:2] == (final.run.revision, "completed")


def test_a_slow_subscriber_gets_coalesced_snapshots_and_then_the_newest_state(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A subscriber that does not read while 150 steps run: the server never queues more than
    one snapshot for it, so when it reads it gets far fewer snapshots than revisions, in
    order, ending with the final state; other clients are served meanwhile."""
    workflow = write_workflow(
        tmp_path,
        "quick",
        """
        from piwf.workflow import compute, define_workflow

        CASES = {"again": "step", "done": "end"}

        def step(ctx):
            n = ctx.outputs.get("step", {}).get("n", 0) + 1
            return {"n": n, "pad": "x" * 2000, "route": "again" if n < 150 else "done"}

        workflow = define_workflow(
            name="quick",
            start_at="step",
            max_steps=400,
            nodes={"step": compute(step), "end": compute(lambda ctx: {})},
            edges=[{"from": "step", "switch": {"on": "$output.route", "cases": CASES}}],
        )
        """,
    )
    slow = RawClient(server.socket_path, "slow")
    try:
        slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with raw_client(server) as client:
            run_id = start(client, workflow, {}, "quick")
            watched = slow.request(
                "view.run.watch", {"subscriptionId": "s1", "stepLimit": 1}, run_id=run_id
            )
            assert watched.outcome == "accepted", watched
            final = client.request("run.wait", {"timeoutMs": 60_000}, run_id=run_id)
            assert final.receipt is not None and final.receipt["run"]["status"] == "completed"
            final_revision = final.receipt["run"]["revision"]
        revisions = []
        while not revisions or revisions[-1] < final_revision:
            event = next_event(slow, "s1")
            assert event.revision is not None
            revisions.append(event.revision)
    finally:
        slow.close()
    assert revisions == sorted(set(revisions))
    assert revisions[-1] == final_revision
    assert len(revisions) < final_revision // 4, (len(revisions), final_revision)


def test_unwatch_ends_a_subscription_and_the_other_goes_on(
    server: ServerProcess, tmp_path: Path
) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    workflow = paced_workflow(tmp_path, gates)
    with raw_client(server) as client:
        run_id = start(client, workflow, {}, "paced")
        wait_for((gates / "a.entered").exists, timeout_s=30, what="node a")
        for sub in ("gone", "kept"):
            answer = client.request("view.run.watch", {"subscriptionId": sub}, run_id=run_id)
            assert answer.outcome == "accepted", answer
            assert next_event(client, sub).event == "runView"
        ended = client.request("view.unwatch", {"subscriptionId": "gone"})
        assert ended.outcome == "accepted" and ended.receipt == {
            "subscriptionId": "gone",
            "active": False,
        }
        (gates / "a").touch()
        event = client.receive()  # the first event after the unwatch: the kept one's
        assert isinstance(event, Event) and event.subscription_id == "kept", event
        again = client.request("view.unwatch", {"subscriptionId": "gone"})
        assert again.outcome == "notFound"
        assert again.error is not None and again.error.code == "subscriptionNotFound"
        for name in ("b", "c"):
            wait_for((gates / f"{name}.entered").exists, timeout_s=30, what=f"node {name}")
            (gates / name).touch()


def test_a_watch_from_the_current_revision_sends_nothing_until_the_run_changes(
    server: ServerProcess,
) -> None:
    with raw_client(server) as client:
        run_id = start(client, CHECKPOINT, {"steps": []}, "review")
        with Client(server.home, autostart=False) as reader:
            wait_for(
                lambda: reader.run_view(run_id).display.status == "waiting",
                timeout_s=30,
                what="the checkpoint",
            )
            request_id = reader.run_view(run_id).display.waiting_on.request_id  # type: ignore[union-attr]
        now = client.request("run.get", run_id=run_id).revision
        watched = client.request(
            "view.run.watch", {"subscriptionId": "w", "fromRevision": now}, run_id=run_id
        )
        assert watched.outcome == "accepted" and watched.receipt is not None
        assert watched.receipt["revision"] == now
        answered = client.request(
            "checkpoint.answer", {"requestId": request_id, "response": {"ok": True}}, key="a1"
        )
        assert answered.outcome == "accepted", answered
        event = next_event(client, "w")
        assert event.revision is not None and event.revision > now, "nothing at or before now"


def test_the_run_list_subscription_pushes_the_list_when_a_run_changes(
    server: ServerProcess,
) -> None:
    with raw_client(server) as client:
        watched = client.request("view.runs.watch", {"subscriptionId": "list", "limit": 5})
        assert watched.outcome == "accepted", watched
        first = next_event(client, "list")
        assert first.event == "runList" and first.payload["runs"] == []
        run_id = start_without_waiting(client, CHECKPOINT)
        while True:
            event = next_event(client, "list")
            runs = event.payload["runs"]
            if runs and runs[0]["displayStatus"] == "waiting":
                break
        assert [run["runId"] for run in runs] == [run_id]


def test_client_watch_runs_yields_the_list_after_each_change_and_survives_a_reconnect(
    server: ServerProcess,
) -> None:
    """``Client.watch_runs``: the list now, then again as runs change (a status filter
    applied by the server), the same after its connection is dropped under it."""
    with Client(server.home, autostart=False) as client:
        pushes = client.watch_runs(limit=5, status="waiting", idle_timeout_s=30)
        try:
            assert next(pushes) == []
            with raw_client(server) as starter:
                first = start_without_waiting(starter, CHECKPOINT)
                runs = next(pushes)
                while not runs:
                    runs = next(pushes)
                assert [run.run_id for run in runs] == [first]
                assert runs[0].display_status == "waiting"
                assert client._connection is not None
                client._connection.close()  # the watch reconnects and subscribes again
                second = start_without_waiting(starter, CHECKPOINT, key="second")
                runs = next(pushes)
                while [run.run_id for run in runs] != [second, first]:
                    runs = next(pushes)
        finally:
            pushes.close()
        # Closing the iteration ended the subscription on the server: 32 more fit.
        for index in range(32):
            subscribed = client.request(
                "view.runs.watch", {"subscriptionId": f"more-{index}", "limit": 1}
            )
            assert subscribed.outcome == "accepted", subscribed


def start_without_waiting(client: RawClient, workflow: str, key: str = "s") -> str:
    """``run.start`` on a connection that also receives events: skip them to the answer."""
    request_id = client.send("run.start", {"workflow": workflow, "input": {"steps": []}}, key=key)
    while True:
        message = client.receive()
        if isinstance(message, Response) and message.request_id == request_id:
            assert message.receipt is not None, message
            return str(message.receipt["run"]["runId"])


INVALID = ("rejected", "invalidPayload")
WATCH = "view.run.watch"


@pytest.mark.parametrize(
    ("operation", "payload", "run_id", "expected"),
    [
        (WATCH, {"subscriptionId": "x"}, "run-doesnotexist00", ("notFound", "runNotFound")),
        (WATCH, {"subscriptionId": "bad id!"}, "RUN", INVALID),
        (WATCH, {"subscriptionId": "x", "fromRevision": -1}, "RUN", INVALID),
        (WATCH, {"subscriptionId": "x", "extra": 1}, "RUN", INVALID),
        ("view.runs.watch", {"subscriptionId": "x", "status": "stuck"}, None, INVALID),
        ("view.unwatch", {"subscriptionId": "never"}, None, ("notFound", "subscriptionNotFound")),
    ],
)
def test_bad_watch_requests_are_refused_and_subscribe_nothing(
    server: ServerProcess,
    operation: str,
    payload: dict[str, Any],
    run_id: str | None,
    expected: tuple[str, str],
) -> None:
    with raw_client(server) as client:
        real = start(client, CHECKPOINT, {"steps": []}, "real")
        answer = client.request(operation, payload, run_id=real if run_id == "RUN" else run_id)
        assert (answer.outcome, answer.error and answer.error.code) == expected, answer
        # Nothing was subscribed: a later request is answered with nothing before it.
        status = client.request("server.status")
        assert status.outcome == "accepted"


def test_a_connection_holds_at_most_32_subscriptions(server: ServerProcess) -> None:
    with raw_client(server) as client:
        run_id = start(client, CHECKPOINT, {"steps": []}, "many")
        for number in range(32):
            sent = client.send("view.run.watch", {"subscriptionId": f"s{number}"}, run_id=run_id)
            while True:
                message = client.receive()
                if isinstance(message, Response) and message.request_id == sent:
                    assert message.outcome == "accepted", message
                    break
        refused_id = client.send("view.run.watch", {"subscriptionId": "s32"}, run_id=run_id)
        while True:
            message = client.receive()
            if isinstance(message, Response) and message.request_id == refused_id:
                break
    assert message.outcome == "rejected"
    assert message.error is not None and message.error.code == "tooManySubscriptions"
