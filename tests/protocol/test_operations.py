"""The operation registry: one list, every name durable or read, never both."""

from __future__ import annotations

from typing import get_args

from piwf.protocol import (
    DURABLE_OPERATIONS,
    OPERATIONS,
    READ_OPERATIONS,
    Operation,
    is_durable,
    is_operation,
)
from piwf.protocol.operations import FINGERPRINT_EXCLUDED_PAYLOAD_KEYS

EXPECTED_DURABLE = {
    "channel.recover",
    "channel.reload",
    "server.stop",
    "run.start",
    "run.cancel",
    "run.pause",
    "run.resume",
    "run.restart",
    "run.fork",
    "run.changeSettings",
    "state.backup",
    "state.prune",
    "effect.resolve",
    "checkpoint.answer",
    "decision.answer",
    "interaction.submit",
    "interaction.update",
    "resource.apply",
    "resource.delete",
    "resource.reconcile",
    "workflowMessage.reportBranch",
    "workflowTurn.report",
    "sessionCapture.record",
    "followUp.queue",
    "followUp.remove",
}
EXPECTED_READ = {
    "channel.status",
    "server.status",
    "run.list",
    "run.get",
    "run.wait",
    "state.status",
    "state.verify",
    "state.prunePreview",
    "requests.list",
    "resource.get",
    "resource.list",
    "view.content",
    "view.page",
    "view.run.get",
    "view.run.watch",
    "view.runs.watch",
    "view.unwatch",
    "run.logs",
    "run.settings",
    "session.attach",
    "session.view",
    "sessionCapture.read",
    "workflow.list",
    "workflow.show",
    "session.list",
}


def test_operations_are_the_literal_sorted() -> None:
    assert get_args(Operation) == OPERATIONS
    assert list(OPERATIONS) == sorted(OPERATIONS)
    assert len(set(OPERATIONS)) == len(OPERATIONS)


def test_every_operation_is_durable_or_read() -> None:
    assert set(DURABLE_OPERATIONS) == EXPECTED_DURABLE
    assert set(READ_OPERATIONS) == EXPECTED_READ
    assert not DURABLE_OPERATIONS & READ_OPERATIONS
    assert set(OPERATIONS) == DURABLE_OPERATIONS | READ_OPERATIONS


def test_predicates() -> None:
    assert is_durable("run.cancel")
    assert not is_durable("run.get")
    assert not is_durable("run.explode")
    assert is_operation("run.get")
    assert not is_operation("run.explode")


def test_fingerprint_exclusions_apply_only_to_durable_operations() -> None:
    assert set(FINGERPRINT_EXCLUDED_PAYLOAD_KEYS) <= DURABLE_OPERATIONS
