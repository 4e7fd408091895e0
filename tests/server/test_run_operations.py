"""The protocol's table of operations about one run (``RUN_OPERATIONS``) is the server's.

The client refuses a missing run id before sending for exactly the operations in the table,
so the table must name every operation the server refuses without ``runId`` and nothing else.
Each operation goes to a real server without a run id, with a payload the operation takes
(empty where that is all it needs); the server's answer says whether it needed a run id. An
operation outside the table whose empty payload is refused first is not judged by this.
"""

from __future__ import annotations

from typing import Any

from piwf.protocol.operations import OPERATIONS, RUN_OPERATIONS, is_durable
from tests.server.harness import ServerProcess, raw_client

#: Operations not sent: a stop would end the server the test asks.
NOT_SENT = {"server.stop"}
#: A valid payload for the operations that check their payload before their run id.
PAYLOADS: dict[str, dict[str, Any]] = {
    "run.changeSettings": {"patch": [{"op": "add", "path": "/limit", "value": 1}]},
    "run.fork": {"fromNode": "a"},
    "view.page": {"kind": "steps", "cursor": "c1"},
    "view.run.watch": {"subscriptionId": "watch-1"},
}


def test_the_server_needs_a_run_id_for_exactly_the_run_operations(server: ServerProcess) -> None:
    needed = set()
    with raw_client(server) as client:
        for operation in sorted(set(OPERATIONS) - NOT_SENT):
            key = f"key-{operation}" if is_durable(operation) else None
            response = client.request(operation, PAYLOADS.get(operation, {}), key=key)
            if response.error is not None and "needs a runId" in response.error.message:
                needed.add(operation)
    assert needed == RUN_OPERATIONS - NOT_SENT
