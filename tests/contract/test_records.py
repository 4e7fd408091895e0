"""Notifications and progress updates on both ports: once per stable id, latest per key."""

from __future__ import annotations

from typing import Any

import pytest

from piwf.workflow import compute, identity, notify
from piwf.workflow import port as p

from .ports import NotificationView, PortUnderTest
from .workflows import chain


def test_a_notification_is_not_duplicated_by_a_crash_retry(subject: PortUnderTest) -> None:
    workflow = chain(
        ("tell", notify(message=lambda ctx: f"hello {ctx.input}", kind="final")),
        ("end", compute(lambda ctx: ctx.outputs["tell"])),
    )
    subject.create(workflow, "ada")
    subject.crash(after=p.NotificationRequested)
    note_id = identity.notification_id("run-1", "tell", 1)
    expected = [NotificationView(note_id, "tell", 1, "final", "hello ada")]
    # The notification committed before the runner died; the retry of the visit adopts it.
    assert subject.notifications() == expected
    result = subject.run()
    assert result is not None
    assert result.output == {"kind": "final", "message": "hello ada"}
    assert subject.notifications() == expected
    assert [type(r) for r in subject.results(p.NotificationRequested)] == [p.Applied, p.Adopted]
    finished = subject.sent(p.NodeFinished, "tell")
    assert [(m.visit, m.attempt) for m in finished] == [(1, 2)]


def test_each_loop_visit_of_a_notify_node_gets_its_own_notification(
    subject: PortUnderTest,
) -> None:
    workflow = chain(
        ("tell", notify(message=lambda ctx: f"round {ctx.visit}")),
        ("loop", compute(lambda ctx: {"again": ctx.visit < 3})),
        ("end", compute(lambda ctx: None)),
        edges=[
            {"from": "tell", "to": "loop"},
            {
                "from": "loop",
                "switch": {"on": "$output.again", "cases": {"true": "tell", "false": "end"}},
            },
        ],
    )
    result = subject.start(workflow)
    assert result.status is p.RunStatus.COMPLETED
    assert subject.notifications() == [
        NotificationView(identity.notification_id("run-1", "tell", n), "tell", n, "progress", m)
        for n, m in ((1, "round 1"), (2, "round 2"), (3, "round 3"))
    ]


def test_updates_keep_the_latest_data_per_type_and_key(subject: PortUnderTest) -> None:
    errors: list[str] = []
    leaked: list[Any] = []

    def work(ctx: Any) -> Any:
        ctx.publish_update("progress", "files", {"done": 1, "total": 2})
        ctx.publish_update("progress", "files", {"done": 2, "total": 2})
        ctx.publish_update("progress", "files", {"done": 2, "total": 2})
        ctx.publish_update("log", "last", "started")
        for bad in ((1, "k", {}), ("t", "", {}), ("t", "k", {1, 2})):
            try:
                ctx.publish_update(*bad)
            except ValueError as error:
                errors.append(str(error))
        leaked.append(ctx)
        return "ok"

    result = subject.start(chain(("work", compute(work))))
    assert result.status is p.RunStatus.COMPLETED
    assert subject.updates() == {
        ("progress", "files"): {"done": 2, "total": 2},
        ("log", "last"): "started",
    }
    # The same data again changes nothing: the port adopts it.
    assert [type(r) for r in subject.results(p.UpdatePublished)] == [
        p.Applied,
        p.Applied,
        p.Adopted,
        p.Applied,
    ]
    assert len(errors) == 3
    with pytest.raises(RuntimeError, match="has ended"):
        leaked[0].publish_update("progress", "files", {})
    assert len(subject.sent(p.UpdatePublished)) == 4


def test_an_update_of_a_crash_retry_replaces_the_earlier_attempts(
    subject: PortUnderTest,
) -> None:
    def work(ctx: Any) -> Any:
        ctx.publish_update("progress", "files", {"attempt": ctx.attempt})
        return ctx.attempt

    subject.create(chain(("work", compute(work))))
    subject.crash(after=p.UpdatePublished)
    assert subject.updates() == {("progress", "files"): {"attempt": 1}}
    result = subject.run()
    assert result is not None and result.output == 2
    assert subject.updates() == {("progress", "files"): {"attempt": 2}}
