"""A server's first fork server and resource tracker are forks of the server
(server/children/forked_fork_server.py): the fork server's children see the modules it
inherited, and neither holds anything else of the server's: no descriptor but its own, no
Python signal handler, none of the server's or the CLI's modules.

The driver (tests/server/forked_fork_server_driver.py) is a real process that starts a real
fork server through the standard library with the fork in place, and one real child."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from piwf.server.children.forked_fork_server import (
    FORK_SERVER_COMMAND,
    RESOURCE_TRACKER_COMMAND,
    _fork_server_arguments,
    _helper_arguments,
    is_fork_server,
)
from tests.server.children import driver_process


@pytest.fixture
def driven(tmp_path: Path) -> Iterator[tuple[dict[str, object], Path]]:
    held = tmp_path / "held-by-the-server"
    argv = [sys.executable, "-m", "tests.server.forked_fork_server_driver", str(held)]
    with driver_process(argv) as driver:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line, "the driver printed nothing"
        yield json.loads(line), held


def _a_fork_holding_nothing_else(helper: psutil.Process, driver: int, held: Path) -> None:
    """``helper`` is a fork of the driver (it still maps the file the driver mapped before the
    fork) that holds no descriptor and no Python signal handler of the driver's."""
    assert helper.ppid() == driver
    mapped = Path(f"/proc/{helper.pid}/maps").read_text()
    assert str(held) in mapped, "a new interpreter would not map the driver's file"
    # Its descriptors: the standard three, the ones it was handed, and what its loop opened;
    # never the file the driver held open at the fork.
    targets = [str(fd.readlink()) for fd in Path(f"/proc/{helper.pid}/fd").iterdir()]
    assert str(held) not in targets, targets
    # No Python handler of the driver's: SIGTERM is not caught (the default, or ignored).
    status = Path(f"/proc/{helper.pid}/status").read_text()
    caught = int(
        next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16
    )
    assert not caught & (1 << (signal.SIGTERM - 1)), f"SIGTERM caught: {caught:#x}"


def test_the_fork_server_is_a_fork_holding_nothing_else_of_the_server(
    driven: tuple[dict[str, object], Path],
) -> None:
    seen, held = driven
    assert seen["marker"] is True, "a child sees a module its fork server inherited"
    assert seen["serverModules"] == [], "nor the server's or the CLI's modules"
    fork_server = psutil.Process(int(str(seen["forkServer"])))
    assert is_fork_server(fork_server.cmdline()), fork_server.cmdline()
    _a_fork_holding_nothing_else(fork_server, int(str(seen["driver"])), held)


def test_the_resource_tracker_is_a_fork_that_answers(
    driven: tuple[dict[str, object], Path],
) -> None:
    seen, held = driven
    tracker = psutil.Process(int(str(seen["tracker"])))
    assert RESOURCE_TRACKER_COMMAND in " ".join(tracker.cmdline()), tracker.cmdline()
    assert seen["trackerAnswers"] is True, "the tracker reads its pipe"
    _a_fork_holding_nothing_else(tracker, int(str(seen["driver"])), held)


def test_only_the_standard_fork_server_command_is_read_and_only_as_literals() -> None:
    command = f"{FORK_SERVER_COMMAND}; main(8, 10, ['a.b'], **{{'sys_path': ['/x']}})"
    assert _fork_server_arguments(["python", "-c", command]) == (
        [8, 10, ["a.b"]],
        {"sys_path": ["/x"]},
    )
    tracker = "from multiprocessing.resource_tracker import main;main(8)"
    assert _fork_server_arguments(["python", "-c", tracker]) is None
    assert _helper_arguments(["python", "-c", tracker], RESOURCE_TRACKER_COMMAND) == ([8], {})
    assert _fork_server_arguments(["python", "script.py"]) is None
    # Anything but literals is never evaluated: the start goes to the standard library.
    assert (
        _fork_server_arguments(["python", "-c", f"{FORK_SERVER_COMMAND}; main(len('x'))"]) is None
    )
