"""The ``subject`` fixture: every contract test runs once per port (see :mod:`.ports`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from piwf.clock import FakeClock
from piwf.state import StateDatabase

from .memory_side import MemoryUnderTest
from .ports import PortUnderTest
from .store_side import StoreUnderTest


@pytest.fixture(params=["memory", "store"])
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PortUnderTest]:
    clock = FakeClock(1_700_000_000_000)
    with ExitStack() as stack:
        under_test: PortUnderTest
        if request.param == "memory":
            under_test = MemoryUnderTest(clock)
        else:
            db = StateDatabase(tmp_path / "piwf-home" / "state.sqlite", clock=clock)
            stack.callback(db.close)
            under_test = StoreUnderTest(clock, db)
        yield under_test
        under_test.check()
