"""Fixtures for client tests: a short state home (the socket path must fit in sun_path)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture
def autostarted(short_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Let clients start real servers for ``short_home`` (their pids are listed); SIGKILL and
    reap every one of them, with its process group, at the end."""
    started: list[int] = []
    start_server = launcher.start_server

    def recording(*args: Any, **kwargs: Any) -> launcher.ServerStarted:
        report = start_server(*args, **kwargs)
        started.append(report.pid)
        return report

    monkeypatch.setattr(launcher, "start_server", recording)
    yield started
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
