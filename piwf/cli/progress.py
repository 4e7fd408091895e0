"""Live progress of a run that ``run start --wait`` or ``run wait`` waits for, on a terminal.

The wait is a loop of short ``run.wait`` requests (the server answers at once when the run is
terminal, else after the slice), so nothing polls faster than :data:`SLICE_S`. Whenever the
run's revision moved, the run view is read and what changed is printed to standard error, one
line each: a step that finished (node, outcome, duration), the node that runs now and the
updates it publishes, the request a waiting run waits on with the command that answers it.
Each line shows the control characters of what a workflow wrote (a failure message, an
update's data, a stored reason) as their escapes, as ``run show`` does: a node cannot drive the
terminal or reorder the line. Standard output keeps only the result, so
``piwf run start --wait > out`` still works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from piwf.canonical import encode_text
from piwf.cli.render import duration
from piwf.cli.safe_text import one_line

if TYPE_CHECKING:
    from piwf.client import Client
    from piwf.protocol.payloads import RunWaitReceipt
    from piwf.protocol.view_payloads import RunView, Step

#: The longest one ``run.wait`` request of the loop waits before the view is looked at again.
SLICE_S = 0.5
#: An update's data is shown up to this many characters.
UPDATE_CHARS = 120


class RunProgress:
    """Prints what changed in one run since the last look (see the module docstring)."""

    def __init__(self, client: Client, run_id: str, echo: Callable[[str], None]) -> None:
        self.client = client
        self.run_id = run_id
        self.echo = echo
        self.revision = -1
        self.steps_seen = 0
        self.last_step_index = -1
        self.shown: set[str] = set()

    def wait(self, timeout_s: float | None, *, content_limit: int | None) -> RunWaitReceipt:
        """Wait until the run is terminal or ``timeout_s`` passed (None: no limit), printing
        its progress."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = SLICE_S if deadline is None else deadline - time.monotonic()
            receipt = self.client.wait_run(
                self.run_id, timeout_s=min(SLICE_S, max(left, 0.0)), content_limit=content_limit
            )
            if receipt.run.revision != self.revision:
                self.revision = receipt.run.revision
                self.look()
            if not receipt.timed_out or left <= 0:
                return receipt

    def seen_steps_of(self, view: RunView) -> None:
        """Count the steps ``view`` carried (its first page) as printed: the ones after them,
        those a long run had beyond that page among them, are printed at the next look."""
        if view.steps.steps:
            self.steps_seen = len(view.steps.steps)
            self.last_step_index = view.steps.steps[-1].index

    def look(self) -> None:
        """Read the view and print what is new."""
        view = self.client.run_view(self.run_id, step_limit=1, content_limit=0)
        if view.steps.total > self.steps_seen:
            for step in self.client.run_steps(
                self.run_id, after=self.last_step_index, content_limit=0
            ):
                self._step(step)
        self._now(view)

    def _step(self, step: Step) -> None:
        self.steps_seen += 1
        self.last_step_index = step.index
        took = f" in {duration(step.duration_ms)}" if step.duration_ms is not None else ""
        failure = step.failure
        why = f": {failure.error_type or failure.kind}: {failure.message}" if failure else ""
        self.echo(one_line(f"  {step.outcome} {_node(step.path, step.visit)}{took}{why}"))

    def _now(self, view: RunView) -> None:
        display = view.display
        node = display.current_node
        # A parked run keeps its unfinished attempt and a sleeping one its timer node as
        # ``currentNode``: only an executing run has a node that runs.
        if node is not None and display.activity == "executing":
            self._once(
                f"node:{node.path}:{node.visit}:{node.attempt}",
                f"  running {_node(node.path, node.visit, node.attempt)}",
            )
            for update in display.current_updates:
                data = encode_text(update.data) if update.data_ref is None else "<large value>"
                if len(data) > UPDATE_CHARS:
                    data = data[: UPDATE_CHARS - 1] + "…"
                self._once(
                    f"update:{node.path}:{node.visit}:{update.type}:{update.key}:{update.seq}",
                    f"    {update.type} {update.key}: {data}",
                )
        if node is not None and display.activity == "sleeping":
            # Imported here: it brings the payload models (pydantic), which run --help and
            # run list's quick path never load; a view has loaded them already.
            from piwf.cli.render_view import activity_text

            self._once(
                f"sleeping:{node.path}:{node.visit}:{node.failed_tries}:{display.available_at}",
                f"  {activity_text(display)}",
            )
        waiting = display.waiting_on
        if waiting is not None:
            self._once(
                f"request:{waiting.request_id}",
                f"  waiting at {_node(waiting.path, waiting.visit)} for request "
                f"{waiting.request_id} ({waiting.kind}): {waiting.command}",
            )
        if display.activity == "blocked":
            self._once(
                f"blocked:{display.reason_code}:{display.reason}",
                f"  blocked: {display.reason or display.reason_code} "
                f"(piwf run explain {self.run_id})",
            )

    def _once(self, key: str, line: str) -> None:
        if key not in self.shown:
            self.shown.add(key)
            self.echo(one_line(line))


def _node(path: str, visit: int, attempt: int = 1) -> str:
    """``"path"``, then its visit and attempt when either is not the first: a node shown
    running again after a crash or a server restart says it is the next attempt."""
    counts = ([f"visit {visit}"] if visit > 1 else []) + (
        [f"attempt {attempt}"] if attempt > 1 else []
    )
    return f'"{path}"' + (f" ({', '.join(counts)})" if counts else "")
