"""Relay tests: real ``piwf server run`` processes (tests/server/harness.py), real
``piwf relay`` subprocesses and real WebSocket clients.

The tests that open WebSockets need ``websockets`` (the ``piwf[relay]`` extra). Without it
they skip and say so, unless ``PIWF_REQUIRE_RELAY=1`` (set by ``tox -e relay``), which turns a
missing package into a failure so that environment can never pass by skipping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import server, servers, short_home

__all__ = ["RelayFactory", "RelayProcess", "relays", "require_websockets", "server", "servers"]
__all__ += ["short_home"]

SKIP_REASON = (
    "websockets is not installed: pip install 'piwf[relay]' (tox -e relay runs these tests)"
)
READY_TIMEOUT_S = 30.0
RELAY_COMMAND = [sys.executable, "-m", "piwf", "relay"]


def require_websockets() -> None:
    """Skip the calling test module without websockets, or fail it when it is required."""
    if importlib.util.find_spec("websockets") is not None:
        return
    if os.environ.get("PIWF_REQUIRE_RELAY") == "1":
        pytest.fail(f"PIWF_REQUIRE_RELAY=1 but {SKIP_REASON}", pytrace=False)
    pytest.skip(SKIP_REASON, allow_module_level=True)


@dataclass
class RelayProcess:
    """One ``piwf relay --listen 127.0.0.1:0 --json`` child and the document it printed."""

    process: subprocess.Popen[bytes]
    ready: dict[str, Any]

    @property
    def url(self) -> str:
        return str(self.ready["listening"][0])

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal the relay and return its exit status (it must end within the deadline)."""
        if self.alive():
            self.process.send_signal(signum)
        return self.process.wait(timeout=15)

    def stderr(self) -> str:
        """Everything the relay wrote to stderr (only once it has ended)."""
        assert self.process.stderr is not None and not self.alive()
        return self.process.stderr.read().decode()


@dataclass
class RelayFactory:
    """Starts relays for one test and reaps every one of them afterwards."""

    home: Path
    started: list[RelayProcess] = field(default_factory=list)

    def start(self, listen: str = "127.0.0.1:0") -> RelayProcess:
        environment = {**os.environ, "PIWF_HOME": str(self.home)}
        process = subprocess.Popen(
            [*RELAY_COMMAND, "--listen", listen, "--json"],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        relay = RelayProcess(process, {})
        self.started.append(relay)
        assert process.stdout is not None
        relay.ready = json.loads(_read_line(process.stdout.fileno(), READY_TIMEOUT_S))
        return relay

    def cleanup(self) -> None:
        for relay in self.started:
            if relay.alive():
                with suppress(ProcessLookupError):
                    os.killpg(relay.process.pid, signal.SIGKILL)
            relay.process.wait(timeout=10)
            for stream in (relay.process.stdout, relay.process.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def relays(short_home: Path) -> Iterator[RelayFactory]:
    factory = RelayFactory(short_home)
    yield factory
    factory.cleanup()


def _read_line(descriptor: int, timeout_s: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the relay printed no ready line in time: {data!r}")
        readable, _, _ = select.select([descriptor], [], [], remaining)
        if readable:
            chunk = os.read(descriptor, 4096)
            if not chunk:
                raise AssertionError(f"the relay exited before it was ready: {data!r}")
            data += chunk
    return data.split(b"\n", 1)[0]
