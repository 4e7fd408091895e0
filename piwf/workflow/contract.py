"""The step contract: the text every agent prompt ends with, as the request stores it.

An agent (a person at a shell, a headless coding agent, an MCP client) learns from it which
exact request it works on and how to complete it; nothing else ties its output to this visit::

    <prompt>

    Workflow step contract (workflow: release, step: review, attempt: attempt-6f9d…)
    Complete this step by submitting your output for request request-2b1c… exactly once:
      piwf submit request-2b1c… '<your output as JSON>'
    or call the `submit` tool of `piwf mcp` with {"request_id": "request-2b1c…", "output": …}.
    If your output is refused, the error says why: fix it and submit again.
    Progress without completing: piwf update request-2b1c… '<JSON>'.
    Expected output: {"summary": "text"}

The request id binds the run, the node's full path, the visit and the attempt; the server
never picks "the oldest pending request" for anyone.
"""

from __future__ import annotations

CONTRACT_HEADING = "Workflow step contract"


def step_contract(
    *,
    workflow: str,
    path: str,
    attempt_id: str,
    request_id: str,
    expected_output: str,
    session: bool = False,
) -> str:
    """Return the contract text of one agent request (no leading blank line).

    ``session``: the run is interactive, so the output goes through its origin session (its
    coordinator submits it; ``piwf submit`` is refused there) and the contract says so.
    """
    if session:
        return "\n".join(
            [
                f"{CONTRACT_HEADING} (workflow: {workflow}, step: {path}, attempt: {attempt_id})",
                f"Complete this step by submitting your output for request {request_id}"
                " exactly once, through this session.",
                "If your output is refused, the error says why: fix it and submit again.",
                f"Expected output: {expected_output}",
            ]
        )
    return "\n".join(
        [
            f"{CONTRACT_HEADING} (workflow: {workflow}, step: {path}, attempt: {attempt_id})",
            f"Complete this step by submitting your output for request {request_id} exactly once:",
            f"  piwf submit {request_id} '<your output as JSON>'",
            "or call the `submit` tool of `piwf mcp` with "
            f'{{"request_id": "{request_id}", "output": <your output>}}.',
            "If your output is refused, the error says why: fix it and submit again.",
            f"Progress without completing: piwf update {request_id} '<JSON>'.",
            f"Expected output: {expected_output}",
        ]
    )


def with_contract(prompt: str, contract: str) -> str:
    """Return ``prompt`` followed by ``contract`` after one blank line."""
    return f"{prompt.rstrip()}\n\n{contract}" if prompt.strip() else contract
