"""The failure record's bounds and names (``piwf.workflow.failure``), one rule per test."""

from __future__ import annotations

import importlib.util
import typing
from pathlib import Path
from typing import Any

import pytest

from piwf import canonical
from piwf.protocol.payloads import FailedOutcome
from piwf.workflow import compute, define_workflow
from piwf.workflow.context import Outcome
from piwf.workflow.failure import (
    MAX_MESSAGE_BYTES,
    MAX_STDERR_BYTES,
    MAX_STDERR_LINES,
    MAX_TRACEBACK_BYTES,
    FailureKind,
    describe_error,
    exception_failure,
    node_error_text,
    reported_failure,
    tail_lines,
)
from piwf.workflow.memory import run_in_memory
from piwf.workflow.port import message_to_json


def raised(error: Exception) -> Exception:
    """``error`` as it is after a raise (with its traceback)."""
    try:
        raise error
    except Exception as caught:
        return caught


def test_a_long_message_is_cut_to_whole_characters_and_marked() -> None:
    failure = exception_failure(raised(ValueError("é" * 3000)))  # 6000 bytes of UTF-8
    assert failure.message_cut is True
    assert failure.message == "é" * (MAX_MESSAGE_BYTES // 2)
    # The one-line error keeps the whole message: a long one travels by content reference.
    assert describe_error(ValueError("é" * 3000)) == f"ValueError: {'é' * 3000}"
    short = exception_failure(raised(ValueError("short")))
    assert (short.message, short.message_cut) == ("short", False)


def test_texts_become_valid_unicode_so_the_record_crosses_canonical_json() -> None:
    failure = exception_failure(raised(ValueError("bad \udcff byte")))
    assert failure.message == "bad ? byte"
    canonical.encode(message_to_json(failure))


def test_an_exception_whose_str_raises_still_gets_a_record() -> None:
    class UnprintableError(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    failure = exception_failure(raised(UnprintableError()))
    assert failure.message == "<str() of the exception raised RuntimeError>"
    assert failure.error_type is not None and failure.error_type.endswith("UnprintableError")


def test_builtin_and_library_errors_are_named_by_their_qualified_name() -> None:
    assert exception_failure(raised(KeyError("k"))).error_type == "KeyError"
    decode = exception_failure(raised(canonical.CanonicalJsonError("nan", "no NaN")))
    assert decode.error_type == "piwf.errors.CanonicalJsonError"


def test_a_raise_that_ended_the_visit_timed_out_or_cancelled_keeps_no_traceback() -> None:
    for outcome, kind in (
        (Outcome.TIMED_OUT, FailureKind.TIMED_OUT),
        (Outcome.CANCELLED, FailureKind.CANCELLED),
    ):
        failure = exception_failure(raised(RuntimeError("stopped")), outcome)
        assert (failure.kind, failure.message, failure.traceback) == (kind, "stopped", None)
        assert failure.error_type is None
    assert reported_failure(Outcome.FAILED, "output is not JSON").kind is FailureKind.REPORTED


def test_one_frame_longer_than_the_bound_keeps_its_end(tmp_path: Path) -> None:
    # A module whose raising line alone is longer than the whole traceback may be.
    source = tmp_path / "wide_line.py"
    padding = "p" * (MAX_TRACEBACK_BYTES + 4000)
    source.write_text(f'def boom():\n    return {{"pad": "{padding}"}}["missing"]\n')
    spec = importlib.util.spec_from_file_location("wide_line", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.boom()
    except KeyError as error:
        failure = exception_failure(error)
    assert failure.traceback is not None and failure.traceback_cut is True
    assert len(failure.traceback.encode()) <= MAX_TRACEBACK_BYTES
    assert "\n  ... the frame below is cut to its last " in failure.traceback
    assert failure.traceback.endswith('"}["missing"]\n')


def test_only_piwfs_calling_frames_are_dropped_not_those_the_user_called() -> None:
    def publish_badly(ctx: Any) -> Any:
        ctx.publish_update("", "key", 1)  # refused inside the engine

    workflow = define_workflow(
        name="bad_update", start_at="a", nodes={"a": compute(publish_badly)}, edges=[]
    )
    result, port = run_in_memory(workflow)
    assert result.error == (
        'node "a" failed: ValueError: update_type must be a string of 1..256 characters'
    )
    (found,) = port.failures_of("dry-run")
    traceback = found.failure.traceback
    assert traceback is not None
    entries = [line for line in traceback.splitlines() if line.startswith('  File "')]
    assert entries[0] == (
        f'  File "{__file__}", line {publish_badly.__code__.co_firstlineno + 1}, in publish_badly'
    )
    assert "piwf/workflow/engine.py" in entries[-1] and entries[-1].endswith("in __call__")


@pytest.mark.parametrize(
    ("lines", "expected_lines", "cut"),
    [
        (0, [], False),
        (MAX_STDERR_LINES, list(range(MAX_STDERR_LINES)), False),
        (MAX_STDERR_LINES + 1, list(range(1, MAX_STDERR_LINES + 1)), True),
    ],
)
def test_the_stderr_tail_keeps_the_last_lines(
    lines: int, expected_lines: list[int], cut: bool
) -> None:
    data = "".join(f"line {i}\n" for i in range(lines)).encode()
    assert tail_lines(data, earlier_dropped=False) == (
        "\n".join(f"line {i}" for i in expected_lines),
        cut,
    )


def test_the_stderr_tail_is_bounded_in_bytes_and_drops_a_partial_first_line() -> None:
    # 10 lines of 503 bytes: the last 2 KiB hold the end of line 5, then lines 6 to 9 whole.
    data = b"".join(b"%d:" % i + b"x" * 500 + b"\n" for i in range(10))
    tail, cut = tail_lines(data, earlier_dropped=False)
    assert cut is True and len(tail.encode()) <= MAX_STDERR_BYTES
    assert [line.split(":")[0] for line in tail.split("\n")] == ["6", "7", "8", "9"]
    # A stream whose start was already left out loses its partial first line too.
    assert tail_lines(b"tial line\nwhole line\n", earlier_dropped=True) == ("whole line", True)


@pytest.mark.parametrize(
    ("visit", "attempt", "outcome", "expected"),
    [
        (1, 1, Outcome.FAILED, 'node "a/fetch" failed: E'),
        (2, 1, Outcome.FAILED, 'node "a/fetch" (visit 2) failed: E'),
        (1, 3, Outcome.TIMED_OUT, 'node "a/fetch" (attempt 3) timed out: E'),
        (2, 2, Outcome.CANCELLED, 'node "a/fetch" (visit 2, attempt 2) was cancelled: E'),
    ],
)
def test_the_run_error_names_the_node_and_its_visit_when_it_matters(
    visit: int, attempt: int, outcome: Outcome, expected: str
) -> None:
    assert node_error_text("a/fetch", visit, attempt, outcome, "E") == expected


def test_the_wire_names_the_failure_outcomes_of_a_visit() -> None:
    assert set(typing.get_args(FailedOutcome)) == {o.value for o in Outcome} - {"ok"}


def _handle_badly(ctx: Any) -> Any:
    try:
        return {}["missing"]
    except KeyError:
        raise ValueError("while handling")  # noqa: B904 (the mistake under test)


def _handle_quietly(ctx: Any) -> Any:
    try:
        return {}["missing"]
    except KeyError:
        raise ValueError("while handling") from None


def test_a_raise_inside_except_keeps_the_exception_it_was_handling() -> None:
    workflow = define_workflow(
        name="handling", start_at="a", nodes={"a": compute(_handle_badly)}, edges=[]
    )
    result, port = run_in_memory(workflow)
    assert result.error == 'node "a" failed: ValueError: while handling'
    (found,) = port.failures_of("dry-run")
    traceback = found.failure.traceback
    assert traceback is not None and found.failure.traceback_cut is False
    line = _handle_badly.__code__.co_firstlineno
    assert traceback == (
        f'  File "{__file__}", line {line + 2}, in _handle_badly\n'
        '    return {}["missing"]\n'
        "KeyError: 'missing'\n"
        "\nDuring handling of the above exception, another exception occurred:\n\n"
        f'  File "{__file__}", line {line + 4}, in _handle_badly\n'
        '    raise ValueError("while handling")  # noqa: B904 (the mistake under test)\n'
    )
    quiet = define_workflow(
        name="quiet", start_at="a", nodes={"a": compute(_handle_quietly)}, edges=[]
    )
    _, port = run_in_memory(quiet)  # `from None` hides the context, as Python does
    (found,) = port.failures_of("dry-run")
    assert found.failure.traceback is not None and "KeyError" not in found.failure.traceback


def test_a_cause_chain_is_kept_newest_first_and_cut_within_the_bounds() -> None:
    def chain(depth: int) -> Exception:
        error: Exception | None = None
        for number in range(depth):
            try:
                raise OSError(f"step {number}") from error
            except OSError as caught:
                error = caught
        assert error is not None
        return error

    traceback = exception_failure(chain(3)).traceback
    assert traceback is not None
    assert traceback.count("The above exception was the direct cause") == 2
    assert "OSError: step 0\n" in traceback and "OSError: step 1\n" in traceback
    long = exception_failure(chain(20))
    assert long.traceback is not None and long.traceback_cut is True
    assert long.traceback.startswith("  ... earlier chained exceptions cut\n")
    assert "OSError: step 18\n" in long.traceback and "OSError: step 14\n" not in long.traceback
    assert len(long.traceback.encode()) <= MAX_TRACEBACK_BYTES


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("output", "error"),
    [
        (
            {"items": [{"ok": 1}, {"when": {1, 2}}]},
            "set is not a JSON value (at ['items'][1]['when'])",
        ),
        ({"a": {(1, 2): 3}}, "object keys must be strings (at ['a'], key tuple (1, 2))"),
        ({1: "x"}, "object keys must be strings (at key int 1)"),
        ([1e300, 0.5, float("nan")], "NaN and Infinity are not JSON numbers (at [2])"),
        (
            {"big": 10**20},
            "integers must lie within ±(2**53 - 1) = ±9007199254740991 to stay "
            "exact; send a larger number as a string (at ['big'])",
        ),
        (b"raw", "bytes is not a JSON value"),
        (
            {"deep": _nested(140)},
            "value nests deeper than 128 levels (at ['deep'][0][0][0][0][0][0][0]"
            "...117 more...[0][0][0][0])",
        ),
    ],
)
def test_an_output_that_is_not_json_names_where_inside_it(output: Any, error: str) -> None:
    workflow = define_workflow(
        name="unusable", start_at="a", nodes={"a": compute(lambda ctx: output)}, edges=[]
    )
    result, port = run_in_memory(workflow)
    assert result.error == f'node "a" failed: output is not JSON: {error}'
    (found,) = port.failures_of("dry-run")
    assert found.failure.message == f"output is not JSON: {error}"
