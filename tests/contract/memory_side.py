"""The memory side of the contract suite: ``MemoryPort`` with no server around it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.clock import FakeClock
from piwf.workflow import port as p
from piwf.workflow.commands import RestartCommand, ResumeCommand, RunCommand, StartCommand
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.context import CancellationSignal
from piwf.workflow.engine import ExecutionResult, execute
from piwf.workflow.failure import AttemptFailure
from piwf.workflow.memory import MemoryPort

from .ports import (
    RUN,
    DieAfter,
    EffectView,
    NotificationView,
    PortUnderTest,
    RecordingPort,
    RequestView,
)


class MemoryUnderTest(PortUnderTest):
    """``piwf.workflow.memory.MemoryPort``: no server, no claims, nothing durable."""

    name = "memory"

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.port = MemoryPort()

    def _create(self, workflow: CompiledWorkflow, input: JsonValue, run_id: str) -> None:
        self.port.create_run(run_id, input, definition_digest=workflow.digest)

    def run(
        self,
        run_id: str = RUN,
        *,
        die_after: DieAfter | None = None,
        cancel: CancellationSignal | None = None,
    ) -> ExecutionResult | None:
        saved = self.saved(run_id)
        command: RunCommand
        if not saved.fresh:
            command = ResumeCommand(run_id)
        elif saved.lineage is p.Lineage.RESTART:
            assert saved.parent_run_id is not None
            command = RestartCommand(run_id, saved.parent_run_id)
        else:
            command = StartCommand(run_id)
        port = RecordingPort(self.port, self.calls, die_after)
        return execute(command, self.workflows[run_id], port, clock=self.clock, cancel=cancel)

    def _runner_died(self, run_id: str) -> None:
        """Nothing happens: the port keeps what the dead runner left."""

    @contextmanager
    def _direct(self, run_id: str) -> Iterator[Any]:
        yield self.port

    def _reader(self) -> Any:
        return self.port

    def check(self) -> None:
        # What the port accepted could cross a transport as it is: canonical JSON only.
        for message in self.port.messages:
            canonical.encode(p.message_to_json(message))

    def answer(self, request_id: str, answer: JsonValue) -> None:
        self.port.answer(request_id, answer)

    def expire(self, request_id: str) -> None:
        self.port.expire_request(request_id)

    def resolve_applied(self, run_id: str, effect_key: str) -> None:
        self.port.resolve_effect(effect_key, p.EffectOutcome.APPLIED)

    def restart(self, parent_run_id: str, run_id: str) -> None:
        self.workflows[run_id] = self.workflows[parent_run_id]
        self.port.create_restart(parent_run_id, run_id)

    def effects(self, run_id: str = RUN) -> list[EffectView]:
        return sorted(
            (
                EffectView(
                    key=record.key,
                    effect_type=record.effect_type,
                    recovery=record.recovery.value,
                    status=record.status.value,
                    attempts=record.attempts,
                    result=record.result,
                    error=record.error,
                )
                for record in self.port.effects_of(run_id)
            ),
            key=lambda view: view.key,
        )

    def notifications(self, run_id: str = RUN) -> list[NotificationView]:
        return sorted(
            (
                NotificationView(n.notification_id, n.path, n.visit, n.kind.value, n.message)
                for n in self.port.notifications.values()
                if n.run_id == run_id
            ),
            key=lambda view: (view.path, view.visit),
        )

    def requests(self, run_id: str = RUN) -> list[RequestView]:
        return sorted(
            (
                RequestView(r.request_id, r.path, r.visit, r.kind.value, r.content, r.on_timeout)
                for r in self.port.requests.values()
                if r.run_id == run_id
            ),
            key=lambda view: (view.path, view.visit),
        )

    def failures(self, run_id: str = RUN) -> list[AttemptFailure]:
        return self.port.failures_of(run_id)

    def updates(self, run_id: str = RUN) -> dict[tuple[str, str], JsonValue]:
        return {
            (update_type, key): message.data
            for (owner, update_type, key), message in self.port.updates.items()
            if owner == run_id
        }
