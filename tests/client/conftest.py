"""Fixtures for client tests: a short state home (the socket path must fit in sun_path)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.client import launcher


@pytest.fixture
def short_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh state home under /tmp, selected through PIWF_HOME."""
    root = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    home = root / "h"
    monkeypatch.setenv("PIWF_HOME", str(home))
    yield home
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def no_server_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to start a real server."""

    def refuse(*args: object, **kwargs: object) -> launcher.ServerStarted:
        raise AssertionError("this test must not start a server")

    monkeypatch.setattr(launcher, "start_server", refuse)
