"""``piwf run list``'s quick path: one page of runs read without the protocol's models.

A person types ``piwf run list`` at a prompt, and scripts call it in loops, so its cost is
mostly start-up. The full client validates every frame with pydantic, and loading pydantic
and the protocol's models costs more than the rest of the command. :func:`list_runs` reads the
page with :func:`~piwf.client.quick_read.read_quickly` instead and checks the type of every
field the table shows. It returns None whenever the read or a check fails: the command then
asks through the full :class:`~piwf.client.Client`, which starts a server when none runs,
validates, and reports any error exactly as before. ``--json`` output always comes from the
full client, so the document is the validated receipt.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from piwf.client.quick_read import read_quickly
from piwf.config import state_home

#: How long the quick read waits for the server, in seconds, before the full client asks.
QUICK_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class ListedRun:
    """What the run list shows of one run (:class:`~piwf.cli.render.RunRow`)."""

    run_id: str
    workflow_name: str
    title: str | None
    display_status: str
    paused: bool
    needs_action: bool
    waiting_for_person: bool
    error_code: str | None
    created_at: int


@dataclass(frozen=True)
class ListedPage:
    """One page of the run list (:class:`~piwf.cli.render.RunRows`)."""

    runs: tuple[ListedRun, ...]
    next_cursor: object | None


def list_runs(limit: int, status: str | None) -> ListedPage | None:
    """One page of ``$PIWF_HOME``'s runs, newest first (``run.list`` with ``limit`` and
    ``status``), or None when the full client must ask instead (see the module docstring)."""
    payload: dict[str, Any] = {"limit": limit}
    if status is not None:
        payload["status"] = status
    receipt = read_quickly(
        state_home(),
        "run.list",
        payload,
        client_id=f"cli-{uuid.uuid4().hex}",
        timeout_s=QUICK_TIMEOUT_S,
    )
    return None if receipt is None else listed_page(receipt)


def listed_page(receipt: dict[str, Any]) -> ListedPage | None:
    """The page in a ``run.list`` receipt as the server sent it (wire names), or None when a
    field the table shows is missing or of another type."""
    runs = receipt.get("runs")
    if not isinstance(runs, list):
        return None
    listed: list[ListedRun] = []
    for run in runs:
        shown = _listed_run(run)
        if shown is None:
            return None
        listed.append(shown)
    return ListedPage(runs=tuple(listed), next_cursor=receipt.get("nextCursor"))


def _listed_run(run: object) -> ListedRun | None:
    if not isinstance(run, dict):
        return None
    strings = [run.get(name) for name in ("runId", "workflowName", "displayStatus")]
    optional = [run.get(name) for name in ("title", "errorCode")]
    flags = [run.get("paused"), run.get("needsAction", False), run.get("waitingForPerson", False)]
    created_at = run.get("createdAt")
    if not (
        all(isinstance(value, str) for value in strings)
        and all(value is None or isinstance(value, str) for value in optional)
        and all(isinstance(flag, bool) for flag in flags)
        and isinstance(created_at, int)
        and not isinstance(created_at, bool)
    ):
        return None
    return ListedRun(
        run_id=run["runId"],
        workflow_name=run["workflowName"],
        title=run.get("title"),
        display_status=run["displayStatus"],
        paused=run["paused"],
        needs_action=run.get("needsAction", False),
        waiting_for_person=run.get("waitingForPerson", False),
        error_code=run.get("errorCode"),
        created_at=created_at,
    )
