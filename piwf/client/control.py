"""The run-control methods of :class:`piwf.client.Client`: start a run, and cancel, pause,
resume, restart or fork one; resolve an ambiguous effect. Each is a durable command with an
idempotency key (docs/PROTOCOL.md §6); ``Client`` inherits them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from piwf.client.arguments import build_payload
from piwf.client.calls import ClientCalls, parse_receipt
from piwf.client.runs import input_too_large, start_payload
from piwf.errors import InvalidArgumentError, RequestTooLargeError
from piwf.protocol import Operation
from piwf.protocol.payloads import (
    EffectInfo,
    EffectReceipt,
    EffectResolvePayload,
    EmptyPayload,
    RunForkPayload,
    RunInfo,
    RunReceipt,
)

#: What :meth:`RunControlMethods.run_control_receipt` can do to a run.
ControlAction = Literal["cancel", "pause", "resume", "restart"]


class RunControlMethods(ClientCalls):
    """``Client`` methods that change runs."""

    def start_run(
        self,
        workflow: str | os.PathLike[str],
        *,
        input: Any = None,
        project: str | os.PathLike[str] | None = None,
        title: str | None = None,
        idempotency_key: str | None = None,
        agent_command: Sequence[str] | None = None,
        session: str | None = None,
    ) -> RunInfo:
        """Commit a new run as queued and return it (``run.start``).

        ``workflow`` is a path when it is an ``os.PathLike``, names an existing file,
        contains ``/`` or ends with ``.py``; a path is sent absolute, resolved against the
        current directory. Anything else is a workflow name the server discovers. ``project``
        (default: the current directory) is sent absolute too. ``input`` must be JSON (``None``
        sends no input). Pass ``idempotency_key`` to make a repeated call adopt the first run.
        ``agent_command`` (argv, e.g. ``["claude", "-p"]``) is the run's headless agent command,
        used before the node's and the server's (docs/AGENTS.md). Before anything is sent,
        raises :class:`~piwf.errors.CanonicalJsonError` when ``input`` breaks the canonical
        JSON rules (an integer beyond ±(2**53 - 1), NaN, a lone surrogate),
        :class:`~piwf.errors.RequestTooLargeError` for an ``input`` too large to send (a request
        carries at most 1 MiB of JSON: pass a path to a file the workflow reads instead),
        :class:`~piwf.errors.AgentCommandError` for a command that is no list of strings and
        :class:`~piwf.errors.InvalidArgumentError` for another argument it cannot take.
        ``session`` binds the run ``interactive`` to that origin session (docs/SESSIONS.md):
        its steps go to the session's coordinator (:meth:`session`), and the run reserves the
        session until it ends (another unfinished run there: :class:`~piwf.errors.ConflictError`
        with code ``sessionBusy``). ``session`` and ``agent_command`` are exclusive: both is a
        :class:`~piwf.errors.SessionError` before anything is sent.
        """
        wire = start_payload(
            workflow,
            input=input,
            project=project,
            title=title,
            agent_command=agent_command,
            session=session,
        )
        try:
            response = self.request("run.start", wire, idempotency_key=idempotency_key)
        except RequestTooLargeError:
            raise RequestTooLargeError(input_too_large(input)) from None
        return parse_receipt(RunReceipt, response).run

    def cancel_run(self, run_id: str, *, idempotency_key: str | None = None) -> RunInfo:
        """Cancel a run and return it (``run.cancel``); RejectedError if it is not cancellable."""
        return self.run_control_receipt("cancel", run_id, idempotency_key=idempotency_key).run

    def pause_run(self, run_id: str, *, idempotency_key: str | None = None) -> RunInfo:
        """Pause a run (``run.pause``): flag it, park it and stop its child."""
        return self.run_control_receipt("pause", run_id, idempotency_key=idempotency_key).run

    def resume_run(self, run_id: str, *, idempotency_key: str | None = None) -> RunInfo:
        """Resume a paused or parked run (``run.resume``) from its last committed boundary."""
        return self.run_control_receipt("resume", run_id, idempotency_key=idempotency_key).run

    def restart_run(self, run_id: str, *, idempotency_key: str | None = None) -> RunInfo:
        """Start a fresh run of a terminal run's workflow (``run.restart``); returns the new run."""
        return self.run_control_receipt("restart", run_id, idempotency_key=idempotency_key).run

    def fork_run(
        self, run_id: str, *, from_node: str, idempotency_key: str | None = None
    ) -> RunInfo:
        """Start a new run of ``run_id``'s recorded sources at node ``from_node`` (its full
        path) with the outputs recorded before it (``run.fork``); returns the new run. A refusal
        (the run executes, has unsettled effects, never ran that node) is a RejectedError."""
        payload = build_payload(RunForkPayload, from_node=from_node)
        receipt = self._call(
            "run.fork", payload, RunReceipt, run_id=run_id, idempotency_key=idempotency_key
        )
        return receipt.run

    def resolve_effect(
        self,
        effect_id: str,
        resolution: str,
        *,
        note: str | None = None,
        idempotency_key: str | None = None,
    ) -> EffectInfo:
        """Record that an ambiguous effect was ``applied`` or should be retried (``retry``);
        returns the effect as it is now (:meth:`resolve_effect_receipt` also says whether this
        call changed it)."""
        return self.resolve_effect_receipt(
            effect_id, resolution, note=note, idempotency_key=idempotency_key
        ).effect

    def resolve_effect_receipt(
        self,
        effect_id: str,
        resolution: str,
        *,
        note: str | None = None,
        idempotency_key: str | None = None,
    ) -> EffectReceipt:
        """As :meth:`resolve_effect`, returning the whole receipt: the effect and ``outcome``,
        ``resolved`` when this call settled or retried it, ``unchanged`` when there was nothing
        to resolve (the same resolution again, or a retry of an effect that is already pending or
        applying). An effect in another state is a :class:`~piwf.errors.RejectedError`, an
        unknown one a :class:`~piwf.errors.NotFoundError`."""
        return self._call(
            "effect.resolve",
            build_payload(
                EffectResolvePayload, effect_id=effect_id, resolution=resolution, note=note
            ),
            EffectReceipt,
            idempotency_key=idempotency_key,
        )

    def run_control_receipt(
        self,
        action: ControlAction,
        run_id: str,
        *,
        idempotency_key: str | None = None,
    ) -> RunReceipt:
        """As :meth:`cancel_run`, :meth:`pause_run`, :meth:`resume_run` or :meth:`restart_run`
        (``action``), returning the whole receipt: the run (for a restart, the new run) and
        ``outcome``, ``changed`` when this call changed it, ``unchanged`` when there was
        nothing to do (already cancelled, already paused, neither paused nor parked by an
        error, already restarted). A refusal is a :class:`~piwf.errors.RejectedError`."""
        if not isinstance(action, str) or action not in _CONTROL_OPERATIONS:
            raise InvalidArgumentError(
                f"invalid argument: action: one of {', '.join(_CONTROL_OPERATIONS)}"
            )
        return self._call(
            _CONTROL_OPERATIONS[action],
            EmptyPayload(),
            RunReceipt,
            run_id=run_id,
            idempotency_key=idempotency_key,
        )


#: The run-control actions, each with the operation it sends.
_CONTROL_OPERATIONS: dict[ControlAction, Operation] = {
    "cancel": "run.cancel",
    "pause": "run.pause",
    "resume": "run.resume",
    "restart": "run.restart",
}
