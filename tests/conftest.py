"""Shared fixtures: a private state home per test and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.clock import FakeClock
from piwf.state import StateDatabase


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A not-yet-existing state home selected through PIWF_HOME."""
    path = tmp_path / "piwf-home"
    monkeypatch.setenv("PIWF_HOME", str(path))
    return path


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_700_000_000_000)


@pytest.fixture
def db(home: Path, clock: FakeClock) -> Iterator[StateDatabase]:
    database = StateDatabase(home / "state.sqlite", clock=clock)
    yield database
    database.close()
