"""The resource runner child: one reconcile of one managed resource, then exit.

Started by the server like every child (:mod:`piwf.runner.bootstrap`: its own session and
process group, its lifeline, then :func:`run_child`), speaking ``piwf.resource.v1`` over its
channel::

    receive launch -> discover and load the manager (by name, from the launch's project and
      state home) -> ready {sourceDigest} -> receive start -> reconcile(ctx, resource) with a
      watchdog that sets ctx.signal at the deadline -> reconcile.finish | reconcile.fail
      -> exiting

Every effect, child workflow and result is a ``call`` the server answers; a ``claimLost``
answer means another owner holds the resource: the child stops at once and writes nothing more
(even when manager code caught the error). A manager that fails to load is reported as a failed
reconcile, so it backs off like any other error. The child never opens SQLite.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import ClaimLostError, PiwfError
from piwf.protocol.resource_v1 import SCHEMA, ReconcileLaunch, ResponseFrame, StartFrame
from piwf.resource import errors as resource_errors
from piwf.resource.context import (
    EffectOutcome,
    EffectRecord,
    ManagedResource,
    ReconcileContext,
    WorkflowRef,
    WorkflowState,
)
from piwf.resource.definition import ReconcileResult
from piwf.runner.entry import EXIT_CLAIM_LOST, EXIT_OK, name_process, print_user_traceback
from piwf.runner.lifeline import Lifeline
from piwf.workflow.context import CancellationSignal

#: Error codes the server may answer with, mapped back to their classes.
_ERRORS: dict[str, type[resource_errors.ResourceError]] = {
    cls.code: cls
    for cls in (
        resource_errors.WorkflowRequestConflictError,
        resource_errors.ResourceStatusError,
        resource_errors.ResourceManagerLoadError,
    )
}


class PipeReconcilePort:
    """A :class:`~piwf.resource.context.ReconcilePort` whose every method is a server call."""

    def __init__(self, connection: Connection, launch: ReconcileLaunch) -> None:
        self.connection = connection
        self.launch = launch
        self.claim_lost = False
        self._ids = itertools.count(1)

    def call(self, operation: str, payload: dict[str, JsonValue]) -> ResponseFrame:
        """Send one call and block for its answer; raise on refusal or loss of authority."""
        if self.claim_lost:
            raise self._claim_lost()
        message_id = f"m{next(self._ids)}"
        frame = canonical.encode(
            {
                "schema": SCHEMA,
                "kind": "call",
                "reconcileId": self.launch.reconcile_id,
                "generation": self.launch.generation,
                "messageId": message_id,
                "operation": operation,
                "payload": payload,
            }
        )
        if len(frame) > MAX_FRAME_BYTES:
            raise resource_errors.ResourceError(
                f"{operation}: the call is {len(frame):,} bytes of JSON, over the"
                f" {MAX_FRAME_BYTES:,} bytes (1 MiB) one call carries; nothing was sent. Keep"
                " large data outside the request and the input (in a file they name, for example)"
            )
        self.connection.send_bytes(frame)
        response = ResponseFrame.model_validate(
            canonical.decode(self.connection.recv_bytes(maxlength=MAX_FRAME_BYTES))
        )
        if response.message_id != message_id:
            raise resource_errors.ResourceError(
                f"response to {response.message_id}, not {message_id}"
            )
        if response.outcome == "claimLost":
            self.claim_lost = True
            raise self._claim_lost()
        if response.outcome == "rejected":
            error_class = _ERRORS.get(response.error_code or "", resource_errors.ResourceError)
            raise error_class(response.error or f"the server refused {operation}")
        return response

    def _claim_lost(self) -> ClaimLostError:
        uid = str(self.launch.resource.get("uid"))
        return ClaimLostError(
            "generationChanged", f"managed_resource:{uid}", self.launch.generation
        )

    def reserve_effect(self, key: str, kind: str, request: JsonValue) -> EffectRecord:
        return _record(self.call("effect.reserve", {"key": key, "kind": kind, "request": request}))

    def begin_effect(self, effect_id: str) -> int:
        result = self.call("effect.begin", {"effectId": effect_id}).result
        return int(result["attempt"])

    def settle_effect(
        self, effect_id: str, attempt: int, outcome: EffectOutcome, *, observed: bool
    ) -> EffectRecord:
        payload: dict[str, JsonValue] = {
            "effectId": effect_id,
            "attempt": attempt,
            "outcome": outcome.status,
            "observed": observed,
        }
        if outcome.result is not None:
            payload["result"] = outcome.result
        if outcome.error is not None:
            payload["error"] = outcome.error[:4000]
        return _record(self.call("effect.settle", payload))

    def ensure_workflow(self, request_key: str, workflow: str, input: JsonValue) -> WorkflowRef:
        payload: dict[str, JsonValue] = {
            "requestKey": request_key,
            "workflow": workflow,
            "input": input,
        }
        result = self.call("workflow.ensure", payload).result
        if result.get("found") is False:
            payload["resolved"] = _resolve_workflow(workflow, self.launch)
            result = self.call("workflow.ensure", payload).result
        return WorkflowRef(
            request_key=request_key,
            run_id=str(result["runId"]),
            state=WorkflowState(result["state"]),
            output=result.get("output"),
            error=result.get("error"),
        )


def _record(response: ResponseFrame) -> EffectRecord:
    result = response.result
    return EffectRecord(
        key=str(result["key"]),
        kind=str(result["kind"]),
        effect_id=str(result["effectId"]),
        status=str(result["status"]),
        result=result.get("result"),
        error=result.get("error"),
    )


def _resolve_workflow(workflow: str, launch: ReconcileLaunch) -> dict[str, JsonValue]:
    """Load and compile a child workflow here, as the source resolver would."""
    from piwf.runner.resolver import resolve

    resolved = resolve(
        {"workflow": workflow, "projectPath": launch.project_path, "stateHome": launch.state_home}
    )
    resolved.pop("ok", None)
    resolved.pop("input", None)  # what workflow.show describes; a child run does not need it
    return resolved


def run_child(connection: Connection, _lifeline: Lifeline) -> int:
    """Run one reconcile over ``connection``; return the process exit code (the processes
    the reconcile started are ended when it returns, by
    :func:`~piwf.runner.entry.serve_channel`)."""
    launch = ReconcileLaunch.model_validate(
        canonical.decode(connection.recv_bytes(MAX_FRAME_BYTES))
    )
    resource = ManagedResource.from_json(launch.resource)
    name_process(f"piwf reconcile {launch.manager} {resource.uid} g{launch.generation}")

    def send(kind: str, **fields: JsonValue) -> None:
        connection.send_bytes(
            canonical.encode(
                {
                    "schema": SCHEMA,
                    "kind": kind,
                    "reconcileId": launch.reconcile_id,
                    "generation": launch.generation,
                    **fields,
                }
            )
        )

    from piwf.resource.discovery import LoadedManager, find_and_load

    project = None if launch.project_path is None else Path(launch.project_path)
    loaded: LoadedManager | None = None
    load_error: PiwfError | None = None
    try:
        loaded = find_and_load(launch.manager, project, Path(launch.state_home))
    except PiwfError as error:
        load_error = error
        print_user_traceback(error)  # this reconcile's log, as for a reconcile that raised
    if loaded is not None:
        send("ready", sourceDigest=loaded.sha256)
    else:
        send("ready")
    StartFrame.model_validate(canonical.decode(connection.recv_bytes(MAX_FRAME_BYTES)))
    port = PipeReconcilePort(connection, launch)
    try:
        if loaded is None:
            assert load_error is not None
            port.call("reconcile.fail", {"error": f"{load_error.code}: {load_error}"[:4000]})
        else:
            _reconcile(port, loaded.definition.reconcile, resource, launch)
    except ClaimLostError:
        return EXIT_CLAIM_LOST
    if port.claim_lost:
        return EXIT_CLAIM_LOST
    send("exiting")
    return EXIT_OK


def _reconcile(
    port: PipeReconcilePort, reconcile: Any, resource: ManagedResource, launch: ReconcileLaunch
) -> None:
    signal = CancellationSignal()
    delay_s = max(0.0, launch.deadline_ms / 1000 - time.time())
    watchdog = threading.Timer(delay_s, lambda: signal.cancel("timed_out"))
    watchdog.daemon = True
    watchdog.start()
    context = ReconcileContext(resource, port, signal, launch.reconcile_id)
    try:
        result = reconcile(context, resource)
        if not isinstance(result, ReconcileResult):
            raise TypeError(
                "reconcile must return settled(), requeue() or requeue_after(),"
                f" not {type(result).__name__}"
            )
    except ClaimLostError:
        raise
    except Exception as error:
        if port.claim_lost:
            raise port._claim_lost() from error
        # The traceback goes to this runner's log ($PIWF_HOME/server/runners/<reconcile>.log),
        # where a manager's author finds the line that raised; the queue row keeps the summary.
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        port.call("reconcile.fail", {"error": f"{type(error).__name__}: {error}"[:4000]})
        return
    finally:
        watchdog.cancel()
    if port.claim_lost:
        raise port._claim_lost()
    try:
        port.call("reconcile.finish", result.to_json())
    except resource_errors.ResourceError as error:
        # The server refused the result and recorded the reconcile as failed (it backs off).
        print(f"piwf resource runner: result refused: {error}", file=sys.stderr)
