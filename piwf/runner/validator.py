"""The validation child: validate one candidate output of one agent request, then exit.

Started by the server like every child (:mod:`piwf.runner.bootstrap`: its own session and
process group, its lifeline, then :func:`run_child`), it is the only kind of process that runs
an agent node's ``validate`` (never the server, never a workflow runner). Its life::

    receive validate (piwf.validator.v1) -> read a referenced context in parts, if any
      -> verify every source hash (before importing anything of the workflow)
      -> load and compile -> rebuild the waiting visit's context from the saved run
      -> validate(candidate, ctx), bounded by timeoutMs -> one result -> exit

It needs no claim and makes no port call: it proposes nothing but its verdict, and the server
settles the submission only when the verdict carries the validation id it gave this child. A
source that changed, a workflow that fails to load, a ``validate`` that raises or overruns, and
a normalised value too large for one reply all become a ``rejected`` verdict that says so.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.config import MAX_FRAME_BYTES
from piwf.protocol import content
from piwf.protocol.validator_v1 import Part, Read, Result, Validate
from piwf.runner.entry import EXIT_OK, name_process
from piwf.runner.lifeline import Lifeline
from piwf.runner.verified_sources import SourcesChanged, load_verified_workflow
from piwf.workflow.port import SavedRun
from piwf.workflow.port_codec import from_json
from piwf.workflow.validation import Accepted, Rejected, Verdict, bounded, validate_candidate


def run_child(connection: Connection, _lifeline: Lifeline) -> int:
    """Validate the one candidate the server sends over ``connection``; return the exit code
    (whatever ``validate`` started is ended when it returns, by
    :func:`~piwf.runner.entry.serve_channel`)."""
    request = Validate.model_validate(canonical.decode(connection.recv_bytes(MAX_FRAME_BYTES)))
    name_process(f"piwf validator {request.run_id} {request.request_id}")
    context = _context(connection, request)
    verdict = _verdict(request, context)
    connection.send_bytes(_reply(request, verdict))
    return EXIT_OK


def _context(connection: Connection, request: Validate) -> dict[str, JsonValue]:
    """The ``{savedRun, candidate}`` object, read back in parts when it came by reference."""
    found = content.parse_reference(request.context)
    if found is None:
        return dict(request.context)
    digest, length = found
    data = bytearray()
    while True:
        ask = Read(validationId=request.validation_id, sha256=digest, offset=len(data))
        connection.send_bytes(ask.encode())
        part = Part.model_validate(canonical.decode(connection.recv_bytes(MAX_FRAME_BYTES)))
        data += content.decode_part(part.data)
        if part.complete or len(data) >= length:
            break
    value = content.verified_value(bytes(data), digest, length)
    if not isinstance(value, dict):
        raise content.ContentError("a validation context must be an object")
    return value


def _verdict(request: Validate, context: dict[str, JsonValue]) -> Verdict:
    try:
        loaded = load_verified_workflow(request.workflow_source, request.definition_digest)
    except Exception as error:  # the workflow's own import failed: the candidate cannot be judged
        return Rejected(
            bounded(f"the workflow could not be loaded: {type(error).__name__}: {error}")
        )
    if isinstance(loaded, SourcesChanged):
        return Rejected(
            bounded(
                "the workflow source is not what the run started with"
                f" ({loaded.drift.describe()}); restore it, or "
                "cancel the run: nothing can be submitted to it until then"
            )
        )
    saved = from_json(SavedRun, context.get("savedRun"))
    return validate_candidate(
        loaded.compiled,
        saved,
        request.request_id,
        context.get("candidate"),
        timeout_ms=request.timeout_ms,
    )


def _reply(request: Validate, verdict: Verdict) -> bytes:
    if isinstance(verdict, Accepted):
        frame = Result(
            validationId=request.validation_id, outcome="accepted", value=verdict.value
        ).encode()
        if len(frame) <= content.INLINE_LIMIT:
            return frame
        size = len(canonical.encode(verdict.value))
        verdict = Rejected(
            f"validate returned a value of {size} bytes; a validated output may be at most "
            f"{content.INLINE_LIMIT} bytes: return a smaller value"
        )
    return Result(
        validationId=request.validation_id, outcome="rejected", error=verdict.error
    ).encode()
