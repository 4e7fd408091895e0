"""A spare runner's warm-up (piwf/runner/warm_up.py): every step runs, nothing is kept, it stops
as soon as a launch waits, and a failing step costs nothing but a line on standard error."""

from __future__ import annotations

import sys

import pytest

from piwf.runner import warm_up as warm_up_module
from piwf.runner.warm_up import warm_up
from piwf.workflow.failure import WORKFLOW_MODULE_PREFIX


def workflow_modules() -> set[str]:
    return {name for name in sys.modules if name.startswith(WORKFLOW_MODULE_PREFIX)}


def test_every_step_runs_and_no_workflow_module_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    before = workflow_modules()
    ran: list[object] = []
    real_run = warm_up_module.run_in_memory

    def run_in_memory(*args: object, **kwargs: object) -> object:
        result, port = real_run(*args, **kwargs)  # type: ignore[arg-type]
        ran.append(result.status)
        return result, port

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(warm_up_module, "run_in_memory", run_in_memory)
        assert warm_up(lambda: False) is True
    assert [str(status) for status in ran] == ["completed"]  # the built-in really ran
    assert workflow_modules() == before
    assert capsys.readouterr().err == ""


def test_a_waiting_launch_stops_it_between_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    checks: list[int] = []
    ran: list[object] = []
    monkeypatch.setattr(warm_up_module, "run_in_memory", lambda *a, **k: ran.append(a))

    def waiting() -> bool:
        checks.append(1)
        return len(checks) > 1  # the launch comes while the first step runs

    assert warm_up(waiting) is False
    assert len(checks) == 2 and ran == []
    assert warm_up(lambda: True) is False  # already waiting: nothing runs at all
    assert ran == []


def test_a_failing_step_is_reported_without_its_message_and_costs_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = workflow_modules()

    def broken(*_args: object) -> None:
        raise RuntimeError("token=abc123")

    monkeypatch.setattr(warm_up_module, "load_verified_workflow", broken)
    assert warm_up(lambda: False) is False
    err = capsys.readouterr().err
    assert err == "piwf runner: warm-up skipped: RuntimeError\n"
    assert "abc123" not in err
    assert workflow_modules() == before  # the first load's module was dropped too
