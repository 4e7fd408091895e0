"""Failure records on both ports: the same type, message and traceback shape for each failure.

The store side reads what the server stores (``node_attempts.failure_hash``, after the record
crossed the runner codec); the memory side what ``MemoryPort`` keeps. Each test asserts one
exact record, so both ports must hold the same one.
"""

from __future__ import annotations

import sys
from typing import Any

from piwf.workflow import compute, idempotent_effect, shell
from piwf.workflow import port as p
from piwf.workflow.context import Outcome
from piwf.workflow.failure import AttemptFailure, FailureKind, NodeFailure

from .ports import PortUnderTest
from .workflows import chain, wait_for_signal


class QuotaError(Exception):
    """An error class of the user's own module: recorded by its qualified name."""


def fetch(ctx: Any) -> Any:
    table = {"present": 1}
    return table["missing"]


def over_quota(ctx: Any) -> Any:
    raise QuotaError("quota of 5 runs reached")


def frame(function: Any, offset: int, line: str) -> str:
    """The traceback entry of ``function``'s line ``offset`` below its ``def``."""
    lineno = function.__code__.co_firstlineno + offset
    return f'  File "{__file__}", line {lineno}, in {function.__name__}\n    {line}\n'


def test_a_raising_node_records_its_type_message_and_traceback(subject: PortUnderTest) -> None:
    result = subject.start(
        chain(("prepare", compute(lambda ctx: {"ready": True})), ("fetch", compute(fetch)))
    )
    assert (result.status, result.error) == (
        p.RunStatus.FAILED,
        """node "fetch" failed: KeyError: 'missing'""",
    )
    expected = NodeFailure(
        kind=FailureKind.EXCEPTION,
        message="'missing'",
        error_type="KeyError",
        # piwf's own calling frames are dropped: the user's function comes first.
        traceback=frame(fetch, 2, 'return table["missing"]'),
    )
    assert subject.failures() == [AttemptFailure("fetch", 1, 1, Outcome.FAILED, expected)]
    (failed,) = subject.sent(p.NodeFailed)
    assert (failed.error, failed.failure) == ("KeyError: 'missing'", expected)


def test_an_error_class_of_the_users_module_is_named_by_its_qualified_name(
    subject: PortUnderTest,
) -> None:
    subject.start(chain(("spend", compute(over_quota))))
    (found,) = subject.failures()
    failure = found.failure
    assert (failure.error_type, failure.message) == (
        f"{__name__}.QuotaError",
        "quota of 5 runs reached",
    )
    assert failure.traceback == frame(over_quota, 1, 'raise QuotaError("quota of 5 runs reached")')


def test_a_timeout_records_its_kind_without_a_traceback(subject: PortUnderTest) -> None:
    result = subject.start(chain(("slow", compute(wait_for_signal, timeout_ms=40))))
    assert result.status is p.RunStatus.TIMED_OUT
    assert result.error == 'node "slow" timed out: timed out after 40 ms'
    assert subject.failures() == [
        AttemptFailure(
            "slow",
            1,
            1,
            Outcome.TIMED_OUT,
            NodeFailure(kind=FailureKind.TIMED_OUT, message="timed out after 40 ms"),
        )
    ]


def test_a_shell_exit_records_its_code_and_the_end_of_stderr(subject: PortUnderTest) -> None:
    script = "import sys; sys.stderr.write(''.join(f'err {i}\\n' for i in range(30))); sys.exit(4)"
    node = shell(effect=idempotent_effect("svc.apply"), command=[sys.executable, "-c", script])
    subject.start(chain(("apply", node)))
    tail = "\n".join(f"err {i}" for i in range(10, 30))
    assert subject.failures() == [
        AttemptFailure(
            "apply",
            1,
            1,
            Outcome.FAILED,
            NodeFailure(
                kind=FailureKind.EXIT,
                message=f"{sys.executable!r} exited with code 4",
                exit_code=4,
                stderr_tail=tail,
                stderr_cut=True,
            ),
        )
    ]
    (failed,) = subject.sent(p.NodeFailed)
    assert failed.error == (
        f"{sys.executable!r} exited with code 4; last lines of stderr, earlier output cut:\n{tail}"
    )


def test_a_completed_visit_keeps_no_failure_record(subject: PortUnderTest) -> None:
    result = subject.start(chain(("fine", compute(lambda ctx: {"fine": True}))))
    assert result.status is p.RunStatus.COMPLETED
    assert subject.failures() == []
