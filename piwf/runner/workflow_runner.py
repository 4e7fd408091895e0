"""The workflow runner child: one run generation, one explicit command, then exit.

Started by the server like every child (:mod:`piwf.runner.bootstrap`: its own process group,
its lifeline, then :func:`run_child`), with one end of a duplex pipe as its channel. Its life::

    (a spare, no launch waiting yet: warm up, :mod:`piwf.runner.warm_up`; titled
     ``piwf runner (warming up)``, then ``piwf runner (idle)``, or ``(idle, cold)`` when
     the warm-up did not run to its end)
    receive launch -> verify every source hash (before importing anything of the workflow)
      -> load and compile -> compare the loaded sources and digest with the launch
      -> ready -> receive one command -> execute through a PipePort -> exiting

A source mismatch is reported as ``sourceChanged`` and the changed code never runs. Every
durable change is a ``call`` the server answers; a ``claimLost`` answer means another generation
owns the run: the child stops at once and writes nothing more. The child never opens SQLite.

Before a node's result is reported, every process the node left behind is ended (the lifeline's
``end_descendants``): a node's processes end with the node, daemons included, and the result
commits only after they are gone.

Its stdout is line-buffered and both streams are flushed before every node start and end it
reports, so the server, which drains the capture pipes first, files what a node printed under
that node's attempt (docs/EXECUTION.md, "Attempt logs").

A node's end waits for the runner's next state-changing call and travels with it in one
``batch`` (the run's start likewise with its first node's): the engine only checks that these
were applied, and between them it runs only routing, so a node costs one commit. Any other call
sends what waits first, and a refusal found then stops the command as it would have at once.

The command carries the run as its revision left it (when that fits in one frame), so the
engine's first ``read_run`` of its own run is answered without a round trip. A saved run comes
with its first steps and the count of all of them (``RunHead``); :meth:`PipePort.read_run`
reads the other steps in pages (``steps.read``) and hands the engine the whole run.

A headless agent step runs its agent command through :class:`~piwf.runner.agent_command.
CommandDriver` (the engine's agent driver); while the command runs the server may send an
unsolicited ``interaction.settled`` notice, which :class:`PipePort` remembers wherever it
arrives.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import itertools
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from piwf import canonical, faults
from piwf.canonical import JsonValue
from piwf.config import CONTENT_PART_BYTES, MAX_FRAME_BYTES
from piwf.errors import ClaimLostError, RunCommandError
from piwf.lifecycle import Adopted, Applied, Conflict
from piwf.protocol import content
from piwf.protocol.runner_v1 import (
    BATCH_OPERATION,
    MAX_BATCH_CALLS,
    OPERATION_OF_MESSAGE,
    PORT_OPERATION,
    SCHEMA,
    STEPS_OPERATION,
    BatchResult,
    CallResponse,
    Command,
    InteractionSettled,
    Launch,
    RunHead,
    StepsPage,
    StepsRead,
)
from piwf.runner.entry import EXIT_CLAIM_LOST, EXIT_OK, enter_directory, name_process
from piwf.runner.lifeline import Lifeline
from piwf.runner.verified_sources import SourcesChanged, load_verified_workflow
from piwf.runner.warm_up import warm_up
from piwf.workflow import port
from piwf.workflow.port_codec import from_json, prepare_hints, result_from_json, to_json

# This module is preloaded by the fork server (piwf.processes.FORKSERVER_PRELOAD): the port's
# field types resolved here are inherited by every runner it forks.
prepare_hints()


#: Port calls whose answer the engine only checks for success and that may wait for the
#: runner's next state-changing call, to travel in one batch with it.
DEFERRED_OPERATIONS = frozenset({"begin_run", "node_finished", "node_failed"})


class CallTooLargeError(RunCommandError):
    """A call's frame is over what one content reference carries; nothing was sent."""


class PipePort:
    """A :class:`~piwf.workflow.port.WorkflowPort` whose every method is a call to the server."""

    def __init__(
        self,
        connection: Connection,
        launch: Launch,
        revision: int,
        *,
        node_ended: Callable[[], None] = lambda: None,
    ) -> None:
        self.connection = connection
        self.launch = launch
        #: Called before a node's result is reported (ends the processes the node left).
        self.node_ended = node_ended
        #: The run revision this child last saw committed; sent with every change it proposes.
        self.revision = revision
        #: Agent requests the server said are no longer pending (``interaction.settled``).
        self.settled: set[str] = set()
        self._ids = itertools.count(1)
        #: Changes waiting for the next call (:data:`DEFERRED_OPERATIONS`), oldest first.
        self._deferred: list[object] = []
        #: The run as the command's revision left it, when the command carried it: the first
        #: ``read_run`` of the child's own run starts from it without a round trip.
        self._saved_with_command: dict[str, RunHead] = {}

    def keep_saved_run(self, run_id: str, head: RunHead) -> None:
        """Start the next ``read_run`` of ``run_id`` from ``head`` (read once)."""
        self._saved_with_command[run_id] = head

    def call(self, operation: str, payload: dict[str, JsonValue]) -> CallResponse:
        """Send one call and block for its response; raise on loss of authority.

        A payload too large for one frame is uploaded first and sent by reference; a result
        sent by reference is read back in parts and verified. A ``rejected`` response that
        carries a result (a conflict, a recovery requirement) is returned for the engine to act
        on; one without a result raises.
        """
        if self._deferred:
            self.flush()
        message_id = f"m{next(self._ids)}"
        frame = self._frame(message_id, operation, payload)
        if len(frame) > content.MAX_CONTENT_BYTES:
            raise CallTooLargeError(
                f"the runner's {operation} call is {len(frame):,} bytes, over the "
                f"{content.MAX_CONTENT_BYTES:,} bytes one call may carry"
            )
        if len(frame) > content.INLINE_LIMIT:
            reference = self._upload(canonical.encode(payload))
            frame = self._frame(message_id, operation, reference)
        self.connection.send_bytes(frame)
        return self._receive(message_id, operation)

    def _receive(self, message_id: str, operation: str) -> CallResponse:
        body = self.receive_frame()
        while self.note_settled(body):  # a notice may arrive before the response
            body = self.receive_frame()
        response = CallResponse.model_validate(body)
        if response.message_id != message_id:
            raise RunCommandError(f"response to {response.message_id}, expected {message_id}")
        if response.outcome == "claimLost":
            raise ClaimLostError(
                "generationChanged", f"run:{self.launch.run_id}", self.launch.generation
            )
        if response.outcome == "rejected" and response.result is None:
            raise RunCommandError(response.error or f"the server refused {operation}")
        found = content.parse_reference(response.result)
        if found is not None:
            value = self._download(*found)
            return response.model_copy(update={"result": value})
        return response

    def receive_frame(self) -> JsonValue:
        """Block for the next frame from the server and decode it."""
        return canonical.decode(self.connection.recv_bytes(maxlength=MAX_FRAME_BYTES))

    def note_settled(self, body: JsonValue) -> bool:
        """Remember an ``interaction.settled`` notice; False when ``body`` is something else."""
        if not isinstance(body, dict) or body.get("kind") != "interaction.settled":
            return False
        self.settled.add(InteractionSettled.model_validate(body).request_id)
        return True

    def _frame(self, message_id: str, operation: str, payload: JsonValue) -> bytes:
        message: dict[str, JsonValue] = {
            "schema": SCHEMA,
            "kind": "call",
            "runId": self.launch.run_id,
            "generation": self.launch.generation,
            "runnerEpoch": self.launch.runner_epoch,
            "messageId": message_id,
            "operation": operation,
            "payload": payload,
        }
        declared = PORT_OPERATION.get(operation)
        if operation == BATCH_OPERATION or (declared is not None and declared.changes_state):
            message["expectedRevision"] = self.revision
        return canonical.encode(message)

    def _upload(self, data: bytes) -> dict[str, JsonValue]:
        """Send ``data`` to the server in parts; return its reference."""
        ref = content.reference(data)
        digest = hashlib.sha256(data).hexdigest()
        for offset in range(0, max(len(data), 1), CONTENT_PART_BYTES):
            chunk = data[offset : offset + CONTENT_PART_BYTES]
            self.call(
                "content.part",
                {
                    "sha256": digest,
                    "bytes": len(data),
                    "offset": offset,
                    "data": base64.b64encode(chunk).decode("ascii"),
                },
            )
        return ref

    def _download(self, digest: str, length: int) -> JsonValue:
        """Read a referenced value in parts and verify it."""
        data = bytearray()
        while True:
            part = self.call("content.read", {"sha256": digest, "offset": len(data)}).result
            if not isinstance(part, dict):
                raise content.ContentError("a content part must be an object")
            data += content.decode_part(part.get("data"))
            if part.get("complete") is True or len(data) >= length:
                break
        return content.verified_value(bytes(data), digest, length)

    def _call_port(self, message: object) -> CallResponse:
        """Call the port operation that carries ``message`` (its declared name)."""
        payload = to_json(message)
        assert isinstance(payload, dict)
        return self.call(OPERATION_OF_MESSAGE[type(message)].name, payload)

    def _send(self, message: object) -> port.PortResult:
        """Send ``message`` with the changes waiting before it, or keep it waiting (a
        :data:`DEFERRED_OPERATIONS` change: provisionally applied, judged when it is sent)."""
        # A settings route's finish is judged now: the engine must learn whether it lost.
        judged_now = getattr(message, "settings_change_number", None) is not None
        if OPERATION_OF_MESSAGE[type(message)].name in DEFERRED_OPERATIONS and not judged_now:
            self._deferred.append(message)
            if len(self._deferred) < MAX_BATCH_CALLS:
                return Applied(port.Committed())
            return self._send_now(self._take_deferred())
        return self._send_now([*self._take_deferred(), message])

    def flush(self) -> None:
        """Send the changes waiting for a next call now; raise if one was not applied."""
        waiting = self._take_deferred()
        if not waiting:
            return
        result = self._send_now(waiting)
        if isinstance(result, Conflict):
            raise RunCommandError(f"the server refused a change: {result.evidence}")
        if not isinstance(result, (Applied, Adopted)):
            raise RunCommandError(f"the server refused a change: {result.reason}")

    def _take_deferred(self) -> list[object]:
        waiting, self._deferred = self._deferred, []
        return waiting

    def _send_now(self, messages: list[object]) -> port.PortResult:
        """Send one change, or several as one batch; return the result of the last one
        judged (the first not applied ends a batch)."""
        if len(messages) == 1:
            result = result_from_json(self._call_port(messages[0]).result)
            self._note_revision(result)
        else:
            try:
                result = self._send_batch(messages)
            except CallTooLargeError:  # big outputs (a last node's is also the run's): one by one
                result = self._send_each(messages)
        faults.point("child.after_commit")  # the server committed; the child has not acted
        return result

    def _send_each(self, messages: list[object]) -> port.PortResult:
        """Send ``messages`` as one call each, in order, as a batch would apply them: the first
        not applied ends the sequence and is returned."""
        result: port.PortResult = Applied(port.Committed())
        for message in messages:
            result = self._send_now([message])
            if not isinstance(result, (Applied, Adopted)):
                return result
        return result

    def _send_batch(self, messages: list[object]) -> port.PortResult:
        calls: list[JsonValue] = []
        for message in messages:
            calls.append(
                {
                    "messageId": f"m{next(self._ids)}",
                    "operation": OPERATION_OF_MESSAGE[type(message)].name,
                    "payload": to_json(message),
                }
            )
        response = self.call(BATCH_OPERATION, {"calls": calls})
        answers = BatchResult.model_validate(response.result).responses
        sent_ids = [call["messageId"] for call in calls if isinstance(call, dict)]
        if [answer.message_id for answer in answers] != sent_ids[: len(answers)]:
            raise RunCommandError("the server answered a batch with other message ids")
        result: port.PortResult | None = None
        for answer in answers:
            if answer.outcome == "claimLost":
                raise ClaimLostError(
                    "generationChanged", f"run:{self.launch.run_id}", self.launch.generation
                )
            if answer.outcome == "rejected" and answer.result is None:
                raise RunCommandError(answer.error or "the server refused a batched change")
            result = result_from_json(answer.result)
            if not isinstance(result, (Applied, Adopted)):
                return result
            self._note_revision(result)
        if result is None or len(answers) != len(messages):
            raise RunCommandError("the server judged only part of a batch it applied")
        return result

    def _note_revision(self, result: port.PortResult) -> None:
        if isinstance(result, (Applied, Adopted)) and result.value.revision is not None:
            self.revision = result.value.revision

    def read_run(self, run_id: str) -> port.SavedRun | None:
        head = self._saved_with_command.pop(run_id, None)
        if head is None:
            result = self._call_port(port.RunRead(run_id)).result
            if result is None:
                return None
            head = RunHead.model_validate(result)
        return self._whole_run(run_id, head)

    def _whole_run(self, run_id: str, head: RunHead) -> port.SavedRun:
        """The saved run of ``head`` with every step it counts, the rest read in pages."""
        saved = from_json(port.SavedRun, head.run)
        if saved.run_id != run_id:
            raise RunCommandError(f"asked for run {run_id}, the server sent another")
        steps = list(saved.steps)
        while len(steps) < head.step_count:
            asked = StepsRead(runId=run_id, start=len(steps), stop=head.step_count)
            result = self.call(STEPS_OPERATION, asked.to_json()).result
            page = StepsPage.model_validate(result)
            if len(page.steps) > asked.stop - asked.start:
                raise RunCommandError("the server sent more saved steps than were asked for")
            steps.extend(from_json(port.StepRecord, step) for step in page.steps)
        if len(steps) != head.step_count:
            raise RunCommandError(
                f"run {run_id} came with {len(steps)} saved steps, not the {head.step_count} "
                "it counts"
            )
        return dataclasses.replace(saved, steps=tuple(steps))

    def begin_run(self, message: port.RunBegun) -> port.PortResult:
        return self._send(message)

    def node_started(self, message: port.NodeStarted) -> port.PortResult:
        flush_output()
        return self._send(message)

    def node_finished(self, message: port.NodeFinished) -> port.PortResult:
        self.node_ended()
        flush_output()
        return self._send(message)

    def node_failed(self, message: port.NodeFailed) -> port.PortResult:
        self.node_ended()
        flush_output()
        return self._send(message)

    def reserve_effect(self, message: port.EffectReservation) -> port.PortResult:
        return self._send(message)

    def settle_effect(self, message: port.EffectSettlement) -> port.PortResult:
        faults.point("effect.before_settle")  # the action ran; its outcome is not recorded yet
        return self._send(message)

    def publish_update(self, message: port.UpdatePublished) -> port.PortResult:
        return self._send(message)

    def notify(self, message: port.NotificationRequested) -> port.PortResult:
        return self._send(message)

    def request_interaction(self, message: port.InteractionRequested) -> port.PortResult:
        return self._send(message)

    def park(self, message: port.RunParked) -> port.PortResult:
        return self._send(message)

    def finish(self, message: port.RunFinished) -> port.PortResult:
        return self._send(message)


def line_buffered_output() -> None:
    """Write stdout line by line, as stderr is: a node's lines reach its log (and ``run logs
    --follow``) as they are printed, in the order they were printed on both streams."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # not a text stream
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def flush_output() -> None:
    """Push what Python buffered for stdout/stderr into the capture pipes, so the server, which
    drains them before it applies a node's start or end, files it under the right attempt."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # replaced or closed
            stream.flush()


def _exit_detail(error: BaseException) -> str:
    """`` (code 3)`` for a ``SystemExit`` with a code, else nothing (never its message: it
    may hold a payload)."""
    if isinstance(error, SystemExit) and isinstance(error.code, int):
        return f" (code {error.code})"
    return ""


def run_child(connection: Connection, lifeline: Lifeline) -> int:
    """Run one generation over ``connection``; return the process exit code."""
    # A runner may wait here long before its run exists (a spare, see server/runs/spares.py):
    # nothing of any run is known to it until this launch.
    if not connection.poll(0):  # a spare: warm up while no launch waits (runner/warm_up.py)
        name_process("piwf runner (warming up)")
        warmed = warm_up(lambda: connection.poll(0))
        name_process("piwf runner (idle)" if warmed else "piwf runner (idle, cold)")
    launch = Launch.model_validate(canonical.decode(connection.recv_bytes(MAX_FRAME_BYTES)))
    name_process(f"piwf runner {launch.run_id} g{launch.generation}")
    line_buffered_output()
    enter_directory(launch.project_path or "/")
    identity_fields = {
        "runId": launch.run_id,
        "generation": launch.generation,
        "runnerEpoch": launch.runner_epoch,
    }

    def send(kind: str, **fields: Any) -> None:
        connection.send_bytes(
            canonical.encode({"schema": SCHEMA, "kind": kind, **identity_fields, **fields})
        )

    # Imported here so that a broken environment shows up as a crash of this child only.
    from piwf.runner.agent_command import CommandDriver
    from piwf.workflow.commands import command_from_json
    from piwf.workflow.engine import execute

    loaded = load_verified_workflow(launch.workflow_source, launch.definition_digest)
    if isinstance(loaded, SourcesChanged):
        send("sourceChanged", files=list(loaded.drift.changed), missing=list(loaded.drift.missing))
        return EXIT_OK
    send("ready")
    faults.point("child.after_ready")
    command_message = Command.model_validate(
        canonical.decode(connection.recv_bytes(MAX_FRAME_BYTES))
    )
    command = command_from_json(command_message.command)
    try:
        pipe_port = PipePort(
            connection, launch, command_message.revision, node_ended=lifeline.end_descendants
        )
        if command_message.run is not None:
            if command_message.step_count is None:
                raise RunCommandError("the command carried a run without its step count")
            head = RunHead(run=command_message.run, stepCount=command_message.step_count)
            pipe_port.keep_saved_run(launch.run_id, head)
        agents = CommandDriver(
            pipe_port,
            launch,
            end_descendants=lifeline.end_descendants,
            stopping=lambda: lifeline.stopping,
        )
        interactive = launch.execution_mode == "interactive"
        try:
            result = execute(
                command, loaded.compiled, pipe_port, agents=agents, interactive=interactive
            )
        except Exception:
            # A change that waited for a next call is still reported before the crash.
            with contextlib.suppress(Exception):
                pipe_port.flush()
            raise
        except BaseException as error:
            # SystemExit, asyncio.CancelledError ... from workflow code end this child, not
            # the node; say which, in the log of the attempt that raised it (run logs). A
            # KeyboardInterrupt is a SIGINT sent to this child, not something the code did.
            if isinstance(error, KeyboardInterrupt):
                raise
            print(
                f"piwf runner: workflow code raised {type(error).__name__}"
                f"{_exit_detail(error)}, which ends the runner, not the node; raise an"
                " Exception to fail the node",
                file=sys.stderr,
                flush=True,
            )
            raise
    except ClaimLostError:
        return EXIT_CLAIM_LOST
    send("exiting", status=result.status.value)
    return EXIT_OK
