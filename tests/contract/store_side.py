"""The store side of the contract suite: the runner path into the real execution store.

Each command is what the server's runner pool does: claim the run and record its runner up to
ready (``launch_if_runnable``), execute through :class:`StorePort` (``decode_runner_call`` +
``apply_runner_call``), then record the runner's exit and let the store decide the run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from piwf.canonical import JsonValue
from piwf.clock import FakeClock
from piwf.lifecycle import Applied as StateApplied
from piwf.state import StateDatabase, blobs
from piwf.state import effects as fx
from piwf.state import execution as ex
from piwf.state.enums import RunnerStatus, SubmissionOutcome, SubmissionSource
from piwf.state.execution import attempts
from piwf.workflow import port as p
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.context import CancellationSignal
from piwf.workflow.engine import ExecutionResult, execute
from piwf.workflow.failure import AttemptFailure
from tests.state.test_execution_support import (
    LEASE_MS,
    OPERATOR,
    SERVER,
    SERVER_ID,
    StorePort,
    command_for,
    create,
    exit_and_recover,
    launch_if_runnable,
    violations,
)

from .ports import (
    RUN,
    DieAfter,
    EffectView,
    NotificationView,
    PortUnderTest,
    RecordingPort,
    RequestView,
)

_NOTIFICATIONS = """
SELECT n.notification_id, n.node_path, n.visit, n.kind, b.content FROM run_notifications n
JOIN blobs b ON b.blob_hash = n.message_hash WHERE n.run_id = ? ORDER BY n.node_path, n.visit
"""
_REQUESTS = """
SELECT r.request_id, a.node_path, a.visit, r.kind, r.content_hash, r.on_timeout_hash
FROM interactive_requests r JOIN node_attempts a ON a.attempt_id = r.attempt_id
WHERE r.run_id = ? ORDER BY a.node_path, a.visit
"""
_UPDATES = """
SELECT u.update_type, u.update_key, u.data_hash FROM workflow_updates u
JOIN node_attempts a ON a.attempt_id = u.attempt_id WHERE a.run_id = ?
ORDER BY a.rowid, u.update_seq
"""


class StoreUnderTest(PortUnderTest):
    """The server's path: the execution store on a real SQLite file, behind runner receipts."""

    name = "store"

    def __init__(self, clock: FakeClock, db: StateDatabase) -> None:
        super().__init__(clock)
        self.db = db
        self._launched: dict[str, ex.RunLaunch] = {}
        self._submissions = itertools.count(1)

    def _create(self, workflow: CompiledWorkflow, input: JsonValue, run_id: str) -> None:
        create(self.db, workflow, run_id, input)

    def run(
        self,
        run_id: str = RUN,
        *,
        die_after: DieAfter | None = None,
        cancel: CancellationSignal | None = None,
    ) -> ExecutionResult | None:
        others = tuple(other for other in self.workflows if other != run_id)
        launched = launch_if_runnable(self.db, exclude=others)
        if launched is None:
            return None
        assert launched.run_id == run_id
        self._launched[run_id] = launched
        port = RecordingPort(StorePort(self.db, launched), self.calls, die_after)
        result = execute(
            command_for(launched), self.workflows[run_id], port, clock=self.clock, cancel=cancel
        )
        # The runner exits after its command; the server records that and decides nothing new.
        decided = exit_and_recover(self.db, launched, RunnerStatus.EXITED)
        assert decided.decision is ex.RecoveryDecision.UNCHANGED, decided
        return result

    def _runner_died(self, run_id: str) -> None:
        exit_and_recover(self.db, self._launched[run_id], RunnerStatus.CRASHED)

    @contextmanager
    def _direct(self, run_id: str) -> Iterator[Any]:
        others = tuple(other for other in self.workflows if other != run_id)
        launched = launch_if_runnable(self.db, exclude=others)
        assert launched is not None and launched.run_id == run_id, "the run is not runnable"
        try:
            yield StorePort(self.db, launched)
        finally:
            exit_and_recover(self.db, launched, RunnerStatus.EXITED)

    def _reader(self) -> Any:
        return _StoreReader(self.db)

    def answer(self, request_id: str, answer: JsonValue) -> None:
        with self.db.write() as tx:
            answered = ex.answer_request(
                tx,
                request_id,
                answer,
                source=SubmissionSource.HUMAN,
                actor=OPERATOR,
                submission_id=f"human:{next(self._submissions)}",
            )
        assert isinstance(answered, StateApplied), answered
        assert answered.value.outcome is SubmissionOutcome.WON, answered.value

    def expire(self, request_id: str) -> None:
        (request,) = [
            r
            for run_id in self.workflows
            for r in self.requests(run_id)
            if r.request_id == request_id
        ]
        assert isinstance(request.on_timeout, dict)
        after_ms = request.on_timeout["afterMs"]
        assert isinstance(after_ms, int)
        self.clock.advance(after_ms)
        with self.db.write() as tx:
            settled = ex.expire_due_decisions(
                tx, actor=SERVER, control_owner_id=SERVER_ID, lease_ms=LEASE_MS
            )
        assert [outcome.request_id for outcome in settled] == [request_id]

    def resolve_applied(self, run_id: str, effect_key: str) -> None:
        with self.db.write() as tx:
            (effect,) = [
                e for e in fx.list_effects(tx, f"run:{run_id}") if e.idempotency_key == effect_key
            ]
            resolved = fx.resolve_ambiguous(
                tx, effect.effect_id, resolution="applied", actor=OPERATOR
            )
        assert isinstance(resolved, StateApplied), resolved
        with self.db.write() as tx:
            resumed = ex.resume_run(tx, run_id, actor=OPERATOR)
        assert isinstance(resumed, StateApplied), resumed

    def restart(self, parent_run_id: str, run_id: str) -> None:
        self.workflows[run_id] = self.workflows[parent_run_id]
        with self.db.write() as tx:
            restarted = ex.restart_run(tx, parent_run_id, new_run_id=run_id, actor=OPERATOR)
        assert isinstance(restarted, StateApplied), restarted

    def effects(self, run_id: str = RUN) -> list[EffectView]:
        with self.db.read() as tx:
            return sorted(
                (
                    EffectView(
                        key=effect.idempotency_key,
                        effect_type=effect.effect_type,
                        recovery=effect.recovery.value,
                        status=effect.status.value,
                        attempts=effect.attempt_count,
                        result=None
                        if effect.result_hash is None
                        else blobs.read_json(tx, effect.result_hash),
                        error=None
                        if effect.error_hash is None
                        else blobs.read_text(tx, effect.error_hash),
                    )
                    for effect in fx.list_effects(tx, f"run:{run_id}")
                ),
                key=lambda view: view.key,
            )

    def notifications(self, run_id: str = RUN) -> list[NotificationView]:
        with self.db.read() as tx:
            rows = tx.all(_NOTIFICATIONS, (run_id,))
        return [
            NotificationView(row[0], row[1], row[2], row[3], bytes(row[4]).decode()) for row in rows
        ]

    def requests(self, run_id: str = RUN) -> list[RequestView]:
        with self.db.read() as tx:
            return [
                RequestView(
                    request_id=row[0],
                    path=row[1],
                    visit=row[2],
                    kind=row[3],
                    content=blobs.read_json(tx, bytes(row[4])),
                    on_timeout=None if row[5] is None else blobs.read_json(tx, bytes(row[5])),
                )
                for row in tx.all(_REQUESTS, (run_id,))
            ]

    def updates(self, run_id: str = RUN) -> dict[tuple[str, str], JsonValue]:
        with self.db.read() as tx:
            return {
                (row[0], row[1]): blobs.read_json(tx, bytes(row[2]))
                for row in tx.all(_UPDATES, (run_id,))
            }

    def failures(self, run_id: str = RUN) -> list[AttemptFailure]:
        with self.db.read() as tx:
            return attempts.list_failures(tx, run_id)

    def check(self) -> None:
        assert violations(self.db) == []


class _StoreReader:
    """Reads saved runs the way :class:`StorePort` does, without a runner behind it."""

    def __init__(self, db: StateDatabase) -> None:
        self.db = db

    def read_run(self, run_id: str) -> p.SavedRun | None:
        with self.db.read() as tx:
            return ex.read_saved_run(tx, run_id)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the engine tried to {name} through a read-only port")
