"""Spare runners: workflow-runner children started before their run is known.

A workflow runner does nothing of any run until its launch envelope comes: its first act
(:mod:`piwf.runner.bootstrap`) needs no run, and then it waits for the envelope. So while slots
are free the pool keeps a few such children started and idle, and a launch hands one its
envelope: a pipe message instead of a fork and a first act, about half of launch to ready on a
two-core machine (docs/PERFORMANCE.md).

A spare:

- holds no claim and has no row: nothing in the state names it until a launch takes it, and
  its name (its log file's name too) is the runner epoch it will run under;
- has loaded no workflow code of any run (while it waits it warms up with piwf's own built-in
  ``noop``, :mod:`piwf.runner.warm_up`), and runs exactly one run generation once taken, then
  exits;
- ends with the server: by its lifeline when the server dies, by ``stop_all`` at shutdown.

Spares are started only while no launched runner is still starting (it gets the CPU first),
and never more than the free slots. A spare that ends before it is taken is replaced after a
delay that doubles (:data:`FIRST_REFILL_DELAY_S` to :data:`MAX_REFILL_DELAY_S`) while spares
keep ending unused, so a broken environment cannot make the server fork in a loop.
"""

from __future__ import annotations

import logging
import secrets

from piwf.processes import ChildKind
from piwf.server.children.supervisor import ChildHandle, ChildSpec, Supervisor
from piwf.server.loop import EventLoop, Timer

log = logging.getLogger("piwf.server")

FIRST_REFILL_DELAY_S = 1.0
MAX_REFILL_DELAY_S = 60.0


def new_runner_epoch() -> str:
    """A fresh runner epoch (also the runner child's name among the live children)."""
    return f"runner-{secrets.token_hex(8)}"


class SpareRunners:
    """Up to ``count`` idle workflow-runner children, started ahead of their runs."""

    def __init__(self, supervisor: Supervisor, loop: EventLoop, count: int) -> None:
        self.supervisor = supervisor
        self.loop = loop
        self.count = count
        #: The live spares, oldest first (the oldest is the likeliest to have started).
        self.idle: list[ChildHandle] = []
        self._refill_delay_s = FIRST_REFILL_DELAY_S
        self._refill_timer: Timer | None = None

    def peek(self) -> ChildHandle | None:
        """The spare :meth:`take` would hand over now, left idle (dead ones are dropped)."""
        while self.idle:
            handle = self.idle[0]
            if handle.exited or handle.stop_pending is not None or handle.kill_pending:
                self.idle.pop(0)
                continue
            return handle
        return None

    def take(self) -> ChildHandle | None:
        """Hand over the oldest live spare, its own callbacks removed (the caller adds its
        ``on_exit``, and its ``on_started`` unless ``handle.started``); None when none is."""
        handle = self.peek()
        if handle is None:
            return None
        self.idle.pop(0)
        handle.on_exit.clear()
        handle.on_started.clear()
        self._refill_delay_s = FIRST_REFILL_DELAY_S  # spares work here
        return handle

    def give_back(self, handle: ChildHandle | None) -> None:
        """Keep ``handle``, taken but not used (its admission claimed nothing), as the next
        spare again; a spare that ended meanwhile is dropped."""
        if handle is None or handle.exited or handle.stop_pending is not None:
            return
        handle.on_exit.append(self._ended)
        self.idle.insert(0, handle)

    def fill(self, free_slots: int) -> None:
        """Start spares until ``min(count, free_slots)`` are idle (none while a refill waits
        out its delay after spares ended unused)."""
        if self._refill_timer is not None or self.loop.stop_requested:
            return
        while len(self.idle) < min(self.count, free_slots):
            name = new_runner_epoch()
            try:
                handle = self.supervisor.start(
                    ChildSpec(name, ChildKind.WORKFLOW_RUNNER, on_exit=self._ended)
                )
            except OSError as error:
                log.warning("a spare runner could not be started: %s", error.strerror or error)
                self._wait_before_refill()
                return
            self.idle.append(handle)

    def _ended(self, handle: ChildHandle) -> None:
        """A spare ended before it was taken: forget it, refill after a growing delay."""
        if handle in self.idle:
            self.idle.remove(handle)
        if not self.loop.stop_requested:
            log.warning(
                "spare runner %s ended unused (exit %s); another in %.0f s",
                handle.name,
                handle.returncode,
                self._refill_delay_s,
            )
            self._wait_before_refill()

    def _wait_before_refill(self) -> None:
        if self._refill_timer is not None:
            return
        delay_s = self._refill_delay_s
        self._refill_delay_s = min(delay_s * 2, MAX_REFILL_DELAY_S)

        def refill_allowed() -> None:
            self._refill_timer = None

        self._refill_timer = self.loop.call_later(delay_s, refill_allowed)
