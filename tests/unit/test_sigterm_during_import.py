"""A SIGTERM that comes while a command imports a module (its pydantic models being built) is
not raised inside that import, where it would come out as the import's error and a traceback:
the import completes, and the stop comes right after it (``sigterm_stops_waiting``)."""

from __future__ import annotations

import importlib
import signal
import sys
import time
from pathlib import Path

import pytest

from piwf.cli.common import Terminated, sigterm_stops_waiting

#: A module whose import sends its own process SIGTERM, then goes on and finishes.
SELF_STOPPING = """
import os, signal
os.kill(os.getpid(), signal.SIGTERM)
total = 0
for number in range(200_000):
    total += number
FINISHED = True
"""


def test_a_sigterm_during_an_import_stops_the_command_after_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "piwf_self_stopping.py").write_text(SELF_STOPPING)
    monkeypatch.syspath_prepend(str(tmp_path))
    # As in a command: SIGTERM has its default action (a test runner may have its own).
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        stopped_after_the_import()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert sys.modules["piwf_self_stopping"].FINISHED is True
    sys.modules.pop("piwf_self_stopping")


def stopped_after_the_import() -> None:
    with pytest.raises(Terminated), sigterm_stops_waiting():
        module = importlib.import_module("piwf_self_stopping")
        assert module.FINISHED is True  # the import was not cut short
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the stop comes again once the import is over
            time.sleep(0.01)
