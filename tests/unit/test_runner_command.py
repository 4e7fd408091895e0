"""The command carries the run's saved state, so the runner's first ``read_run`` needs no call;
a run with more steps than the command carried reads the rest in pages (``steps.read``).

Unit tests of the two halves on a real ``multiprocessing`` pipe: the server's command frame
(``piwf.server.runs.session``) and the runner's port (``piwf.runner.workflow_runner``).
"""

from __future__ import annotations

from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

from piwf import canonical
from piwf.protocol import content
from piwf.protocol.runner_v1 import Command, Launch, RunHead
from piwf.runner.workflow_runner import PipePort
from piwf.server.runs.saved_reads import command_frame
from piwf.state.execution import SavedRunHead
from piwf.workflow import port
from piwf.workflow.commands import StartCommand, command_to_json
from piwf.workflow.context import Outcome
from piwf.workflow.port_codec import from_json, to_json

RUN = "run-0123456789abcdef0123"


def _saved(value: object, steps: tuple[port.StepRecord, ...] = ()) -> port.SavedRun:
    return port.SavedRun(run_id=RUN, status=port.RunStatus.QUEUED, input=value, steps=steps)


def _step(visit: int) -> port.StepRecord:
    return port.StepRecord("loop", visit, 1, Outcome.OK, {"i": visit}, None, visit, visit + 1)


def _head(saved: port.SavedRun, step_count: int | None = None) -> RunHead:
    run = to_json(saved)
    assert isinstance(run, dict)
    count = len(saved.steps) if step_count is None else step_count
    return RunHead(run=run, stepCount=count)


def _answer(server_end: Connection, message_id: str, result: Any) -> None:
    server_end.send_bytes(
        canonical.encode(
            {
                "schema": "piwf.runner.v1",
                "kind": "response",
                "messageId": message_id,
                "outcome": "accepted",
                "result": result,
            }
        )
    )


def _launch() -> Launch:
    return Launch(
        runId=RUN,
        generation=1,
        runnerEpoch="runner-1",
        serverEpoch=1,
        workflowSource={},
        definitionDigest="0" * 64,
    )


def test_the_command_frame_carries_the_saved_run_when_it_fits() -> None:
    saved = _saved({"who": "ada"}, (_step(1),))
    frame = command_frame(command_to_json(StartCommand(RUN)), 3, SavedRunHead(saved, 5))
    command = Command.model_validate(canonical.decode(frame))
    assert (command.revision, command.step_count) == (3, 5)
    assert command.run is not None
    assert from_json(port.SavedRun, command.run) == saved


def test_a_saved_run_too_large_for_one_frame_is_left_to_read_run() -> None:
    saved = _saved({"blob": "x" * (content.INLINE_LIMIT + 1)})
    frame = command_frame(command_to_json(StartCommand(RUN)), 3, SavedRunHead(saved, 0))
    assert len(frame) <= content.INLINE_LIMIT
    command = Command.model_validate(canonical.decode(frame))
    assert (command.revision, command.run, command.step_count) == (3, None, None)


def test_the_kept_run_answers_the_first_read_only_and_later_reads_call_the_server() -> None:
    server_end, runner_end = Pipe(duplex=True)
    try:
        pipe_port = PipePort(runner_end, _launch(), 3)
        saved = _saved({"who": "ada"})
        pipe_port.keep_saved_run(RUN, _head(saved))

        assert pipe_port.read_run(RUN) == saved
        assert not server_end.poll(0), "the kept run was read without a call"

        # The next read is a call: answer it as the server would, with a newer state.
        newer = _saved({"who": "grace"})
        _answer(server_end, "m1", _head(newer).to_json())
        assert pipe_port.read_run(RUN) == newer
        sent = canonical.decode(server_end.recv_bytes())
        assert isinstance(sent, dict)
        assert (sent["operation"], sent["payload"]) == ("read_run", {"run_id": RUN})
    finally:
        server_end.close()
        runner_end.close()


def test_the_steps_the_head_did_not_carry_are_read_in_pages() -> None:
    server_end, runner_end = Pipe(duplex=True)
    steps = tuple(_step(visit) for visit in range(1, 6))
    try:
        pipe_port = PipePort(runner_end, _launch(), 3)
        pipe_port.keep_saved_run(RUN, _head(_saved({"who": "ada"}, steps[:1]), 5))
        # The server's pages, sent ahead: two steps, then the last two.
        for message_id, page in (("m1", steps[1:3]), ("m2", steps[3:])):
            _answer(server_end, message_id, {"steps": [to_json(step) for step in page]})

        assert pipe_port.read_run(RUN) == _saved({"who": "ada"}, steps)
        asked = [canonical.decode(server_end.recv_bytes()) for _ in range(2)]
        calls = [(call["operation"], call["payload"]) for call in asked if isinstance(call, dict)]
        assert calls == [
            ("steps.read", {"runId": RUN, "start": 1, "stop": 5}),
            ("steps.read", {"runId": RUN, "start": 3, "stop": 5}),
        ]
    finally:
        server_end.close()
        runner_end.close()
