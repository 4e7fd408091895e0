"""The command carries the run's saved state, so the runner's first ``read_run`` needs no call.

Unit tests of the two halves on a real ``multiprocessing`` pipe: the server's command frame
(``piwf.server.runs.session``) and the runner's port (``piwf.runner.workflow_runner``).
"""

from __future__ import annotations

from multiprocessing import Pipe

from piwf import canonical
from piwf.protocol import content
from piwf.protocol.runner_v1 import Command, Launch
from piwf.runner.workflow_runner import PipePort
from piwf.server.runs.session import _command_frame
from piwf.workflow import port
from piwf.workflow.commands import StartCommand, command_to_json
from piwf.workflow.port_codec import from_json, to_json

RUN = "run-0123456789abcdef0123"


def _saved(value: object) -> port.SavedRun:
    return port.SavedRun(run_id=RUN, status=port.RunStatus.QUEUED, input=value)


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
    saved = _saved({"who": "ada"})
    frame = _command_frame(command_to_json(StartCommand(RUN)), 3, saved)
    command = Command.model_validate(canonical.decode(frame))
    assert command.revision == 3
    assert command.run is not None
    assert from_json(port.SavedRun, command.run) == saved


def test_a_saved_run_too_large_for_one_frame_is_left_to_read_run() -> None:
    saved = _saved({"blob": "x" * (content.INLINE_LIMIT + 1)})
    frame = _command_frame(command_to_json(StartCommand(RUN)), 3, saved)
    assert len(frame) <= content.INLINE_LIMIT
    command = Command.model_validate(canonical.decode(frame))
    assert (command.revision, command.run) == (3, None)


def test_the_kept_run_answers_the_first_read_only_and_later_reads_call_the_server() -> None:
    server_end, runner_end = Pipe(duplex=True)
    try:
        pipe_port = PipePort(runner_end, _launch(), 3)
        saved = _saved({"who": "ada"})
        pipe_port.keep_saved_run(saved)

        assert pipe_port.read_run(RUN) == saved
        assert not server_end.poll(0), "the kept run was read without a call"

        # The next read is a call: answer it as the server would, with a newer state.
        newer = _saved({"who": "grace"})
        server_end.send_bytes(
            canonical.encode(
                {
                    "schema": "piwf.runner.v1",
                    "kind": "response",
                    "messageId": "m1",
                    "outcome": "accepted",
                    "result": to_json(newer),
                }
            )
        )
        assert pipe_port.read_run(RUN) == newer
        sent = canonical.decode(server_end.recv_bytes())
        assert isinstance(sent, dict)
        assert (sent["operation"], sent["payload"]) == ("read_run", {"run_id": RUN})
    finally:
        server_end.close()
        runner_end.close()
