"""A client that speaks the protocol's bytes itself and gets things wrong on purpose: each
refusal is the documented outcome and code, and a refused request changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from piwf.protocol import Request, Response, encode_message
from tests.server.harness import RawClient, ServerProcess, raw_client
from tests.server.test_decisions import decision_workflow, waiting_request
from tests.server.test_execution import (
    fast_server,  # noqa: F401 - a fixture used by name
    run_view,
    start,
)


def send_with_revision(
    client: RawClient, operation: str, run_id: str, revision: int, key: str
) -> Response:
    request = Request(
        request_id=f"{client.client_id}-{key}",
        client_id=client.client_id,
        operation=operation,  # type: ignore[arg-type]
        payload={},
        idempotency_key=key,
        run_id=run_id,
        expected_revision=revision,
    )
    client.send_bytes(encode_message(request))
    return client.response()


def test_a_stale_expected_revision_is_a_conflict_and_changes_nothing(
    fast_server: ServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    """PROTOCOL.md, "Outcomes": a stale ``expectedRevision`` is ``conflict`` (``staleRevision``),
    for a run command as for a resource, and the run is left exactly as it was."""
    workflow = decision_workflow(tmp_path, "stale_revision", 600_000)
    with raw_client(fast_server) as client:
        run_id = start(client, workflow, {}, "stale")
        waiting_request(client, run_id)
        before: dict[str, Any] = run_view(client, run_id)["run"]
        revision = before["revision"]
        for operation in ("run.pause", "run.cancel", "run.resume"):
            refused = send_with_revision(client, operation, run_id, revision - 1, operation)
            assert refused.outcome == "conflict", refused
            assert refused.error is not None and refused.error.code == "staleRevision"
            assert f"at revision {revision}" in refused.error.message
            assert f"piwf run show {run_id}" in refused.error.message
        assert run_view(client, run_id)["run"] == before
        paused = send_with_revision(client, "run.pause", run_id, revision, "pause-current")
        assert paused.outcome == "accepted", paused
        assert run_view(client, run_id)["run"]["paused"] is True


def test_a_duplicate_key_is_refused_without_repeating_the_key_as_sent(
    server: ServerProcess,
) -> None:
    """PROTOCOL.md section 4: messages never repeat a value, and a name is shown only as at
    most 64 characters of ``[A-Za-z0-9_.-]``; a JSON key may be user data (an input's keys)."""
    key = "tok\u00e9n\\u0001" + "s3cret" * 40  # "\\u0001" is the JSON escape of U+0001
    frame = f'{{"payload":{{"{key}":1,"{key}":2}}}}\n'.encode()
    with raw_client(server) as client:
        client.send_bytes(frame)
        refused = client.response()
        assert refused.outcome == "rejected" and refused.request_id == "-"
        assert refused.error is not None and refused.error.code == "invalidJson"
        message = refused.error.message
        assert message == f"duplicate object key 'tok?n?{('s3cret' * 40)[:58]}…'", message
        assert client.closed_by_server()
    log = (server.home / "server" / "server.log").read_text()
    assert "s3crets3cret" not in log and "tok\u00e9n" not in log


def test_a_relative_project_path_is_refused_before_anything_starts(
    server: ServerProcess,
) -> None:
    """A project path relative to the server's working directory means nothing to the client:
    ``run.start`` and ``resource.apply`` refuse it as ``workflow.list`` and ``workflow.show``
    do, and no run is created."""
    with raw_client(server) as client:
        starts = [
            ("run.start", {"workflow": "noop", "projectPath": "project"}),
            ("resource.apply", {"manager": "m", "key": "k", "spec": {}, "projectPath": "p"}),
            ("workflow.show", {"workflow": "noop", "projectPath": "./project"}),
        ]
        for number, (operation, payload) in enumerate(starts):
            key = None if operation == "workflow.show" else f"relative-{number}"
            refused = client.request(operation, payload, key=key)
            assert refused.outcome == "rejected", refused
            assert refused.error is not None and refused.error.code == "invalidPayload"
            assert "projectPath must be an absolute path" in refused.error.message
        assert client.request("run.list").receipt == {"runs": []}
