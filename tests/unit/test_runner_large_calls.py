"""Changes too large to travel together in one batch are sent one call each.

A last node's output is also the run's output, so its ``node_finished`` and ``finish_run``
carry the same value twice; together they may pass what one call carries although each fits.
Unit test of the runner's port on a real ``multiprocessing`` pipe, with a small call limit.
"""

from __future__ import annotations

import threading
from multiprocessing import Pipe
from multiprocessing.connection import Connection

import pytest

from piwf import canonical
from piwf.lifecycle import Applied
from piwf.protocol import content
from piwf.runner.workflow_runner import PipePort
from piwf.workflow import port
from piwf.workflow.port_codec import result_to_json
from tests.unit.test_runner_command import RUN, _launch


def _answer_every_call(server_end: Connection, operations: list[str]) -> None:
    """Answer each call as applied (an upload part as accepted) until the pipe closes."""
    revision = 3
    while True:
        try:
            call = canonical.decode(server_end.recv_bytes())
        except (EOFError, OSError):
            return
        assert isinstance(call, dict)
        operations.append(str(call["operation"]))
        result = None
        if call["operation"] != "content.part":
            revision += 1
            result = result_to_json(Applied(port.Committed(revision=revision)))
        response = {
            "schema": "piwf.runner.v1",
            "kind": "response",
            "messageId": call["messageId"],
            "outcome": "accepted",
            "result": result,
        }
        server_end.send_bytes(canonical.encode(response))


def test_a_batch_over_the_call_limit_is_sent_one_call_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(content, "MAX_CONTENT_BYTES", 3 * 1024 * 1024)
    output = "x" * (2 * 1024 * 1024)  # fits one call, not twice in one batch
    server_end, runner_end = Pipe(duplex=True)
    operations: list[str] = []
    server = threading.Thread(target=_answer_every_call, args=(server_end, operations))
    server.start()
    try:
        pipe_port = PipePort(runner_end, _launch(), 3)
        finished = port.NodeFinished(RUN, "a", 1, 1, output, 1_000)
        assert isinstance(pipe_port.node_finished(finished), Applied)  # deferred
        done = port.RunFinished(RUN, port.RunStatus.COMPLETED, output, None, "a")
        assert isinstance(pipe_port.finish(done), Applied)
    finally:
        runner_end.close()
        server.join(timeout=30)
        server_end.close()
    calls = [operation for operation in operations if operation != "content.part"]
    assert calls == ["node_finished", "finish"]
    assert pipe_port.revision == 5
