"""Fixtures for tests against real server processes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.harness import ServerFactory, ServerProcess


@pytest.fixture
def short_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh state home under /tmp whose socket path fits in sun_path."""
    root = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    home = root / "h"
    monkeypatch.setenv("PIWF_HOME", str(home))
    yield home
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def servers(short_home: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(short_home)
    yield factory
    factory.cleanup()


@pytest.fixture
def server(servers: ServerFactory) -> ServerProcess:
    """One running server with a short frame deadline."""
    started = servers.start(env={"PIWF_FRAME_DEADLINE_S": "1", "PIWF_IDLE_EXIT_S": "0"})
    assert started.ready.get("ok") is True, started.ready
    return started
