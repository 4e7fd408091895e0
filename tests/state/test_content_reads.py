"""Reads behind content references: cheap peeks, ranged reads, and whose values they are."""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.state import StateDatabase, blobs, content_owners
from piwf.state.enums import MediaType, RunnerStatus
from piwf.state.enums import SubmissionSource as Source
from piwf.workflow import checkpoint, compute, define_workflow
from piwf.workflow.compiler import CompiledWorkflow

from .test_decisions import answer
from .test_execution_support import compiled, create, exit_and_recover, run_once

# Spans several 4 KiB pages and ends mid-page, so slices cross overflow-page boundaries.
LARGE = os.urandom(3 * 4096 * 7 + 123).hex().encode("ascii")


def store_text(db: StateDatabase, data: bytes) -> bytes:
    with db.write() as tx:
        return blobs.put_bytes(tx, data, MediaType.TEXT)


def test_peek_reads_the_bytes_only_of_a_small_blob(db: StateDatabase) -> None:
    small, large = b"small", bytes(20_000)
    small_digest, large_digest = store_text(db, small), store_text(db, large)
    with db.read() as tx:
        seen_small = blobs.peek(tx, small_digest, inline_limit=16)
        seen_large = blobs.peek(tx, large_digest, inline_limit=16)
        at_limit = blobs.peek(tx, small_digest, inline_limit=len(small))
        never = blobs.peek(tx, small_digest, inline_limit=-1)
        missing = blobs.peek(tx, hashlib.sha256(b"nothing").digest(), inline_limit=16)
    assert seen_small is not None and seen_small.content == small
    assert (seen_small.length, seen_small.media_type) == (5, MediaType.TEXT)
    assert seen_large is not None and seen_large.content is None
    assert seen_large.length == 20_000
    assert at_limit is not None and at_limit.content == small
    assert never is not None and never.content is None
    assert missing is None


@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, 1), (0, len(LARGE)), (4095, 2), (4096 * 5 + 17, 70_000), (len(LARGE) - 3, 100)],
)
def test_a_ranged_read_returns_exactly_that_slice(
    db: StateDatabase, offset: int, length: int
) -> None:
    digest = store_text(db, LARGE)
    with db.read() as tx:
        blob = blobs.peek(tx, digest, inline_limit=-1)
        assert blob is not None
        sliced = blobs.read_range(tx, blob, offset, length)
        # The Python 3.10 fallback must cut the very same bytes.
        fallback = blobs._read_range_substr(
            tx, blob.rowid, offset, min(length, blob.length - offset)
        )
    assert sliced == LARGE[offset : offset + length]
    assert fallback == sliced


@pytest.mark.skipif(sys.version_info < (3, 11), reason="blobopen needs Python 3.11")
def test_the_incremental_read_is_used_where_python_has_it(db: StateDatabase) -> None:
    digest = store_text(db, LARGE)
    with db.read() as tx:
        blob = blobs.peek(tx, digest, inline_limit=-1)
        assert blob is not None
        assert blobs._read_range_incremental(tx, blob.rowid, 100, 5000) == LARGE[100:5100]


def test_a_range_outside_the_blob_is_refused(db: StateDatabase) -> None:
    digest = store_text(db, b"abc")
    with db.read() as tx:
        blob = blobs.peek(tx, digest, inline_limit=-1)
        assert blob is not None
        assert blobs.read_range(tx, blob, 3, 10) == b""
        for offset, length in [(4, 1), (-1, 1), (0, -1)]:
            with pytest.raises(ValueError, match="outside"):
                blobs.read_range(tx, blob, offset, length)


def park(db: StateDatabase, workflow: CompiledWorkflow, run_id: str, run_input: JsonValue) -> str:
    """Create the run and execute it until its checkpoint waits; return the request id."""
    create(db, workflow, run_id, run_input)
    launched, _, result = run_once(db, workflow)
    exit_and_recover(db, launched, RunnerStatus.EXITED)
    assert result.request_id is not None
    return result.request_id


def test_a_run_holds_its_output_request_content_and_answers_only(db: StateDatabase) -> None:
    workflow = compiled(
        define_workflow(
            name="gate",
            start_at="gate",
            nodes={
                "gate": checkpoint(summary="ready?", run=lambda ctx: ctx.input),
                "done": compute(lambda ctx: {"wrapped": ctx.outputs["gate"]}),
            },
            edges=[{"from": "gate", "to": "done"}],
        )
    )
    request_id = park(db, workflow, "run-1", {"who": "one"})
    answer(db, request_id, {"go": "first"}, source=Source.CLIENT, submission_id="s-1")
    run_once(db, workflow)
    park(db, workflow, "run-2", {"who": "two"})
    with db.read() as tx:
        values = content_owners.run_values(tx, "run-1")
        content_hash = bytes(
            tx.scalar("SELECT content_hash FROM interactive_requests WHERE run_id = 'run-1'")
        )
        input_hash = bytes(tx.scalar("SELECT input_hash FROM runs WHERE run_id = 'run-1'"))
        assert values.output is not None and values.error is None
        answer_hash = canonical.sha256(canonical.encode({"go": "first"}))
        for digest in (values.output, content_hash, answer_hash):
            assert content_owners.holds(tx, "run", "run-1", digest)
            assert not content_owners.holds(tx, "run", "run-2", digest)
            assert not content_owners.holds(tx, "resource", "run-1", digest)
        # The input is stored but never advertised, so no reference may name it.
        assert not content_owners.holds(tx, "run", "run-1", input_hash)
        assert not content_owners.holds(tx, "run", "run-1", hashlib.sha256(b"x").digest())
        assert content_owners.run_values(tx, "run-missing") == content_owners.RunValues(None, None)
