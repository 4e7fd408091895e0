"""Answering the requests of an in-memory port from outside: what a person, an agent's
submission, a decision's timeout policy or its deadline does to a waiting run, as the server's
answer paths do it (:mod:`piwf.workflow.memory`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from piwf.canonical import JsonValue
from piwf.lifecycle import AnsweredBy, InteractionKind
from piwf.workflow.compiler import CompiledWorkflow
from piwf.workflow.invoke import to_json
from piwf.workflow.memory_records import MemoryRun, MemorySubmission
from piwf.workflow.port import InteractionRequested, SavedRun
from piwf.workflow.validation import Accepted, Verdict, validate_candidate


class MemoryAnswers:
    """The answer helpers of :class:`~piwf.workflow.memory.MemoryPort` (a mixin over its
    records and lock)."""

    _lock: threading.RLock
    requests: dict[str, InteractionRequested]
    submissions: list[MemorySubmission]

    if TYPE_CHECKING:  # provided by MemoryPort

        def read_run(self, run_id: str) -> SavedRun | None: ...

        def _run_with_request(self, request_id: str) -> MemoryRun: ...

    def answer(
        self, request_id: str, answer: JsonValue, *, answered_by: AnsweredBy = AnsweredBy.HUMAN
    ) -> str:
        """Answer the open request ``request_id``; return its run id.

        Raises ``ValueError`` when no run waits on that request or it is already answered.
        """
        with self._lock:
            run = self._run_with_request(request_id)
            assert run.pending is not None
            if run.pending.answered:
                raise ValueError(f"request {request_id} is already answered")
            run.pending = replace(
                run.pending, answered=True, answer=to_json(answer), answered_by=answered_by
            )
            return run.run_id

    def submit(self, workflow: CompiledWorkflow, request_id: str, output: JsonValue) -> Verdict:
        """Validate ``output`` for agent request ``request_id`` in-process and return the verdict
        (:func:`~piwf.workflow.validation.validate_candidate`); accepted answers the request by
        ``client``, rejected leaves it pending; :attr:`submissions` keeps every candidate.
        ``ValueError`` when no run waits on it, it is no agent request or already answered."""
        with self._lock:
            run = self._run_with_request(request_id)
            assert run.pending is not None
            if run.pending.kind is not InteractionKind.AGENT:
                raise ValueError(f"request {request_id} is not an agent request")
            if run.pending.answered:
                raise ValueError(f"request {request_id} is already answered")
            saved = self.read_run(run.run_id)
        assert saved is not None
        verdict = validate_candidate(workflow, saved, request_id, to_json(output))
        with self._lock:
            self.submissions.append(MemorySubmission(request_id, to_json(output), verdict))
            if isinstance(verdict, Accepted):
                self.answer(request_id, verdict.value, answered_by=AnsweredBy.CLIENT)
        return verdict

    def answer_by_timeout_policy(self, request_id: str) -> str:
        """Record a decision's ``on_timeout`` default as its answer; return the run id."""
        with self._lock:
            request = self.requests.get(request_id)
            policy = request.on_timeout if request is not None else None
            if not isinstance(policy, Mapping) or "response" not in policy:
                raise ValueError(f"request {request_id} has no timeout policy")
            return self.answer(
                request_id, policy["response"], answered_by=AnsweredBy.TIMEOUT_POLICY
            )

    def expire_request(self, request_id: str) -> str:
        """The decision's deadline passes unanswered; return the run id.

        Its ``on_timeout`` default becomes the answer (``timeout_policy``); without a default the
        request is closed ``expired`` and the visit ends ``timed_out``, as the server's deadline
        pass does. Raises ``ValueError`` for a request without a deadline.
        """
        with self._lock:
            request = self.requests.get(request_id)
            policy = request.on_timeout if request is not None else None
            if not isinstance(policy, Mapping) or "afterMs" not in policy:
                raise ValueError(f"request {request_id} has no deadline")
            if "response" in policy:
                return self.answer_by_timeout_policy(request_id)
            return self.answer(request_id, None, answered_by=AnsweredBy.EXPIRED)
