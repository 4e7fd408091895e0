"""The reconciler records a resource runner's pid only while its claim is still held.

A quick child can send its result before the fork server reports its pid: the result's commit
releases the claim, so the late record would be refused as a lost claim and stop (and mark
``claimLost``) a child that succeeded. A unit test of :meth:`Reconciler._record_process` with
stand-ins for the database and the child (the race itself depends on the fork server's timing).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from piwf.server.resources.reconciler import ActiveReconcile, Reconciler
from piwf.state.enums import ResourceRunnerStatus


class NoWrites:
    """A database no write may reach."""

    def write(self) -> Any:
        raise AssertionError("the pid record was written after the claim was given up")


def reconciler_with(stopped: list[ResourceRunnerStatus]) -> Reconciler:
    reconciler = Reconciler.__new__(Reconciler)
    reconciler.db = NoWrites()  # type: ignore[assignment]
    reconciler._stop = lambda active, status: stopped.append(status)  # type: ignore[method-assign]
    return reconciler


@pytest.mark.parametrize("ended", ["result_committed", "server_lost_claim"])
def test_a_pid_that_comes_after_the_claim_was_given_up_is_not_recorded(ended: str) -> None:
    stopped: list[ResourceRunnerStatus] = []
    active = ActiveReconcile(
        launch=SimpleNamespace(uid="uid-1"),  # type: ignore[arg-type]
        claim=SimpleNamespace(),  # type: ignore[arg-type]
        reconcile_id="reconcile-1",
        handle=SimpleNamespace(pid=4242, identity="4242:1.0:boot"),  # type: ignore[arg-type]
    )
    setattr(active, ended, True)
    reconciler_with(stopped)._record_process(active)
    assert stopped == [], "a child whose result is in must not be stopped as claimLost"
