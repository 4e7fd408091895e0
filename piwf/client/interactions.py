"""The interaction methods of :class:`piwf.client.Client`: answering checkpoints and decisions,
submitting agent outputs and their progress updates.

Each names one exact request id (``piwf requests`` lists them); the server never picks "the
oldest pending request". Kept in their own module so ``client.py`` stays one concern per
screen; ``Client`` inherits them.
"""

from __future__ import annotations

from typing import Final

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.client.arguments import build_payload, flag_argument
from piwf.client.calls import ClientCalls, parse_receipt
from piwf.client.content import resolve_references
from piwf.protocol import Operation
from piwf.protocol.agent_payloads import (
    SubmissionReceipt,
    SubmitPayload,
    UpdatePayload,
    UpdateReceipt,
)
from piwf.protocol.payloads import AnswerPayload, AnswerReceipt

#: A submit waits for its validation (at most 30 s of ``validate`` and its admission) on top of
#: the request timeout; a longer wait retries under the same key and joins the same outcome.
SUBMIT_EXTRA_WAIT_S: Final = 60.0


class InteractionMethods(ClientCalls):
    """``Client`` methods that answer requests and submit agent outputs."""

    def answer(
        self,
        request_id: str,
        response: JsonValue,
        *,
        idempotency_key: str | None = None,
        as_human: bool = True,
    ) -> AnswerReceipt:
        """Answer the exact request ``request_id`` and return the receipt with the winner.

        ``as_human`` (the default) sends ``decision.answer``, the only path that settles a
        protected decision; ``as_human=False`` sends ``checkpoint.answer`` for automation,
        which a protected decision refuses. ``outcome`` is ``won``, ``adopted`` (equal to the
        winner) or ``already_resolved`` (another winner; ``resolution`` is that winner).
        Raises :class:`~piwf.errors.RejectedError` (code ``answerRejected``) for an answer that
        does not fit, :class:`~piwf.errors.NotFoundError` for an unknown request, and
        :class:`~piwf.errors.CanonicalJsonError` before anything is sent when ``response``
        breaks the canonical JSON rules, :class:`~piwf.errors.InvalidArgumentError` when
        ``as_human`` is not a bool.
        """
        flag_argument("as_human", as_human)  # "no" must never send a person's answer
        canonical.check_value(response, "response")
        operation: Operation = "decision.answer" if as_human else "checkpoint.answer"
        payload = build_payload(AnswerPayload, request_id=request_id, response=response)
        return self._call(operation, payload, AnswerReceipt, idempotency_key=idempotency_key)

    def submit(
        self, request_id: str, output: JsonValue, *, idempotency_key: str | None = None
    ) -> SubmissionReceipt:
        """Submit ``output`` for the exact agent request ``request_id`` and wait for its
        validation (``interaction.submit``): the receipt comes back once the outcome is durable.

        Accepted: ``receipt.value`` is the output as the step's ``validate`` normalised it and
        the request is answered. A rejection raises
        :class:`~piwf.errors.SubmissionRejectedCommandError` whose message is the stored,
        actionable error (the request stays pending: fix the output and submit again, under a
        new key). Other refusals raise :class:`~piwf.errors.RejectedError` with codes
        ``validationPending`` (:class:`~piwf.errors.ValidationPendingCommandError`),
        ``runPaused``, ``requestNotOpen``, ``notAgentRequest``;
        :class:`~piwf.errors.NotFoundError` for an unknown request;
        :class:`~piwf.errors.ConflictError` for a key reused with another output. A repeat
        with the same ``idempotency_key`` (after a lost connection too) returns the same
        outcome. :class:`~piwf.errors.CanonicalJsonError` before anything is sent when
        ``output`` breaks the canonical JSON rules, and
        :class:`~piwf.errors.InvalidArgumentError` when ``request_id`` is not a request id.
        """
        canonical.check_value(output, "output")
        build_payload(SubmitPayload, request_id=request_id, output=output)  # checks, or raises
        payload = {"requestId": request_id, "output": output}
        response = self.request(
            "interaction.submit",
            payload,
            idempotency_key=idempotency_key,
            timeout_s=self.request_timeout_s + SUBMIT_EXTRA_WAIT_S,
        )
        return resolve_references(parse_receipt(SubmissionReceipt, response), self.read_content)

    def update(
        self, request_id: str, data: JsonValue, *, idempotency_key: str | None = None
    ) -> UpdateReceipt:
        """Record ``data`` as the latest progress update of the agent request ``request_id``
        (``interaction.update``); the request stays pending. Refusals as :meth:`submit`, and
        :class:`~piwf.errors.InvalidArgumentError` before anything is sent for ``data`` over
        64 KiB of JSON (:data:`~piwf.protocol.agent_payloads.MAX_UPDATE_DATA_BYTES`)."""
        canonical.check_value(data, "data")
        build_payload(UpdatePayload, request_id=request_id, data=data)  # checks, or raises
        payload = {"requestId": request_id, "data": data}
        response = self.request("interaction.update", payload, idempotency_key=idempotency_key)
        return parse_receipt(UpdateReceipt, response)
