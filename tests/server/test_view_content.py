"""``view.content`` against a real server: only advertised values, only valid ranges.

Every refusal is a typed answer on a connection that stays usable (the test ends each case by
reading a real part on the same socket), and no read leaves a receipt.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from piwf import canonical
from piwf.config import CONTENT_PART_BYTES
from piwf.protocol.content import MAX_CONTENT_BYTES
from piwf.state import StateDatabase
from tests.server.harness import RawClient, ServerFactory, ServerProcess, raw_client
from tests.server.test_content_refs import BIG_OUTPUT, big_value
from tests.server.test_execution import FAST

N = 100_000  # 900 KB of output: two parts


def finished_runs(server: ServerProcess) -> tuple[dict[str, Any], ...]:
    """Two completed runs with different large outputs; their ``outputRef``s."""
    workflow = BIG_OUTPUT
    refs = []
    with raw_client(server) as client:
        for n, key in ((N, "first"), (N + 1, "second")):
            response = client.request(
                "run.start", {"workflow": workflow, "input": {"n": n}}, key=key
            )
            assert response.receipt is not None, response
            run_id = response.receipt["run"]["runId"]
            waited = client.request("run.wait", {"timeoutMs": 60_000}, run_id=run_id)
            assert waited.receipt is not None
            assert waited.receipt["run"]["status"] == "completed", waited.receipt
            refs.append(waited.receipt["outputRef"])
    return tuple(refs)


def read(client: RawClient, ref: Any, offset: int = 0, length: int = CONTENT_PART_BYTES) -> Any:
    return client.request("view.content", {"ref": ref, "offset": offset, "length": length})


def assert_still_usable(client: RawClient, ref: dict[str, Any]) -> None:
    response = read(client, ref, 0, 100)
    assert response.outcome == "accepted", response
    assert response.receipt is not None
    data = base64.b64decode(response.receipt["data"])
    assert data == canonical.encode(big_value(N))[:100]


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    started = servers.start(env=FAST)
    assert started.ready["ok"] is True, started.ready
    return started


def receipts(server: ServerProcess) -> int:
    with StateDatabase(server.home / "state.sqlite", mode="read-only") as db, db.read() as tx:
        return int(tx.scalar("SELECT count(*) FROM server_commands"))


def test_parts_read_back_the_exact_value(server: ServerProcess) -> None:
    first, _ = finished_runs(server)
    before = receipts(server)
    assembled = b""
    with raw_client(server) as client:
        while len(assembled) < first["length"]:
            response = read(client, first, len(assembled))
            assert response.outcome == "accepted", response
            part = response.receipt
            assert part is not None
            assert (part["sha256"], part["total"], part["offset"]) == (
                first["sha256"],
                first["length"],
                len(assembled),
            )
            assembled += base64.b64decode(part["data"])
        at_end = read(client, first, first["length"])
    assert assembled == canonical.encode(big_value(N))
    assert at_end.outcome == "accepted" and at_end.receipt is not None
    assert at_end.receipt["data"] == ""
    assert receipts(server) == before, "reads must not store receipts"


def refused(client: RawClient, payload: dict[str, Any]) -> tuple[str, str]:
    response = client.request("view.content", payload)
    assert response.error is not None, response
    return response.outcome, response.error.code


def test_references_another_run_or_nothing_ever_advertised_are_not_found(
    server: ServerProcess,
) -> None:
    first, second = finished_runs(server)
    input_bytes = canonical.encode({"n": N})
    forged: list[dict[str, Any]] = [
        {**first, "owner": second["owner"]},  # another run's blob under this run's name
        {**first, "owner": "run-does-not-exist"},
        {**first, "scope": "resource"},
        {**first, "sha256": hashlib.sha256(b"made up").hexdigest()},
        {**first, "mediaType": "text/plain"},
        {**first, "length": first["length"] - 1},
        # The run's input exists as a blob but is never advertised.
        {
            **first,
            "sha256": hashlib.sha256(input_bytes).hexdigest(),
            "length": len(input_bytes),
        },
    ]
    with raw_client(server) as client:
        for ref in forged:
            payload = {"ref": ref, "offset": 0, "length": 10}
            assert refused(client, payload) == ("notFound", "contentNotFound"), ref
        assert_still_usable(client, first)


def test_bad_ranges_and_shapes_are_rejected(server: ServerProcess) -> None:
    first, _ = finished_runs(server)
    good = {"ref": first, "offset": 0, "length": 10}
    cases: list[tuple[dict[str, Any], str]] = [
        ({**good, "offset": first["length"] + 1}, "contentReference"),
        ({**good, "offset": -1}, "invalidPayload"),
        ({**good, "length": 0}, "invalidPayload"),
        ({**good, "length": -5}, "invalidPayload"),
        ({**good, "length": CONTENT_PART_BYTES + 1}, "invalidPayload"),
        ({**good, "offset": True}, "invalidPayload"),
        ({**good, "length": "10"}, "invalidPayload"),
        ({**good, "ref": {**first, "length": MAX_CONTENT_BYTES + 1}}, "invalidPayload"),
        ({**good, "ref": {**first, "sha256": "ABC"}}, "invalidPayload"),
        ({**good, "ref": {**first, "extra": 1}}, "invalidPayload"),
        ({**good, "unknown": 1}, "invalidPayload"),
        ({"offset": 0, "length": 10}, "invalidPayload"),
    ]
    with raw_client(server) as client:
        for payload, code in cases:
            assert refused(client, payload) == ("rejected", code), payload
        assert_still_usable(client, first)
