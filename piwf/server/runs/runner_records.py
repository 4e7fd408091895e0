"""A runner child's process and its exit, recorded in the loop turn's group commit.

Both records are ``DeferredWrite``\\ s (piwf/state/group_commit.py): each is applied in its own
savepoint of the turn's one transaction, with the runner calls and other records of that turn,
and what follows it runs only after the ``COMMIT``::

    child's pid known ─▶ ProcessRecord: renew the claim, record pid + start identity
                          after COMMIT: the session keeps the renewed claim
                          refused (claim lost): stop the child (``claimLost``)
    child exited      ─▶ ExitRecord: end the agent groups it left, store its attempt's output
                          counts, close its runner row with its one outcome and decide the run
                          after COMMIT: fault point ``runner.after_exit_commit``, free the slot
                          refused: logged, the slot is freed all the same

While the file cannot serve (``StateUnavailableError``) neither is dropped: the session retries
it after a growing delay, keeping its slot and claim. A runner whose own call still waits in
the group when its exit arrives has that call decided first (the group is flushed), so its exit
outcome (``exited`` after a finished command, else ``crashed``) reads what the call changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from piwf import faults
from piwf.errors import PiwfError, StateUnavailableError
from piwf.server.children.supervisor import ChildHandle
from piwf.server.runs.agents import reap_runner_groups
from piwf.state import Transaction
from piwf.state import execution as ex
from piwf.state.enums import ActorType
from piwf.state.leases import Claim, renew_claim
from piwf.state.records import Actor

if TYPE_CHECKING:
    from piwf.server.runs.session import RunnerSession

log = logging.getLogger("piwf.server")


@dataclass(frozen=True)
class ProcessRecord:
    """The pid and start identity of a session's child, once known (a ``DeferredWrite``)."""

    session: RunnerSession
    handle: ChildHandle
    #: Called when the record was refused (the pool stops the child then).
    on_refused: Callable[[PiwfError], None]

    def apply(self, tx: Transaction) -> Callable[[], None]:
        session = self.session
        renewed = renew_claim(tx, session.claim, session.host.lease_ms)
        handle = self.handle
        if handle.pid is not None and handle.identity is not None:
            ex.record_runner_process(
                tx,
                renewed,
                session.runner_epoch,
                handle.pid,
                handle.identity,
                lease_ms=session.host.lease_ms,
            )
        return lambda: self._committed(renewed)

    def _committed(self, renewed: Claim) -> None:
        self.session.claim = renewed

    def refused(self, error: PiwfError) -> Callable[[], None]:
        return lambda: self.on_refused(error)

    def unavailable(self, error: StateUnavailableError) -> None:
        session = self.session
        again = lambda: session.host.db.group.defer(self)  # noqa: E731
        session.host.retry_later(session, "recording its runner", error, again)


@dataclass(frozen=True)
class ExitRecord:
    """A session's child exited: its one outcome, recorded and acted on (a ``DeferredWrite``)."""

    session: RunnerSession
    handle: ChildHandle

    def apply(self, tx: Transaction) -> Callable[[], None]:
        session = self.session
        handle = self.handle
        status = session.exit_outcome(handle)
        code = handle.returncode
        # An agent group the runner left registered is ended first (identity-checked).
        reap_runner_groups(tx, session.runner_epoch)
        if session.attempt_output is not None:  # what the attempt wrote until the end
            session.attempt_output.record(tx)
        # Claim loss is a handoff: when a newer generation owns the run, the recovery is a
        # no-op (it checks the generation). When this server's own claim merely expired (the
        # server was stopped or starved past the run lease), no one else holds the run:
        # recovery takes a new claim (generation + 1) and decides the run from its effects, as
        # startup recovery would.
        ex.close_runner_and_recover(
            tx,
            session.run_id,
            session.runner_epoch,
            status,
            exit_code=code if code is not None and code >= 0 else None,
            signal=None if code is None or code >= 0 else f"signal {-code}",
            diagnostic=session.protocol_rejection,
            actor=Actor(ActorType.SERVER, session.host.owner_id),
            owner_id=session.host.owner_id,
            lease_ms=session.host.lease_ms,
            claim=None if session.server_lost_claim else session.claim,
            protocol_rejection=session.protocol_rejection,
        )
        return self._recorded

    def refused(self, error: PiwfError) -> Callable[[], None]:
        def after() -> None:
            log.warning("run %s: recording its runner exit failed: %s", self.session.run_id, error)
            self._recorded()

        return after

    def unavailable(self, error: StateUnavailableError) -> None:
        session = self.session
        again = lambda: session.exited(self.handle)  # noqa: E731
        session.host.retry_later(session, "recording its runner exit", error, again)

    def _recorded(self) -> None:
        faults.point("runner.after_exit_commit")
        self.session.host.ended(self.session)
