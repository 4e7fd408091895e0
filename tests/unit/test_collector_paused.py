"""Imports under :func:`piwf.cli.collector.collector_paused`: no collector pass runs while
they do, and the collector is left as it was found.

The probe runs in a new interpreter (a command's modules must not be imported yet) and counts
the collector's passes with ``gc.callbacks`` while the ``requests`` command's module loads: once
through the command table (paused), once imported plainly (the collector on), which shows the
count can see the passes a load would otherwise run.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from piwf.cli.collector import collector_paused

PROBE = """
import gc, importlib, json, sys
from piwf.cli import COMMANDS
passes = []
gc.callbacks.append(lambda phase, info: phase == "start" and passes.append(info["generation"]))
if sys.argv[1] == "paused":
    COMMANDS["requests"].load()
else:
    importlib.import_module(COMMANDS["requests"].module)
print(json.dumps({"passes": len(passes), "enabledAfter": gc.isenabled()}))
"""


def passes_while_loading(how: str) -> dict[str, object]:
    finished = subprocess.run(
        [sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=60, check=True
    )
    report: dict[str, object] = json.loads(finished.stdout)
    return report


def test_a_command_loads_without_the_collectors_passes_and_the_collector_runs_again_after() -> None:
    plain = passes_while_loading("plain")
    assert isinstance(plain["passes"], int) and plain["passes"] > 5, plain
    paused = passes_while_loading("paused")
    # At most the one pass the collector runs when it is turned on again, over what is pending.
    assert isinstance(paused["passes"], int) and paused["passes"] <= 1, paused
    assert paused["enabledAfter"] is True


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_collector_is_restored_as_found_even_when_the_block_raises(
    enabled_before: bool,
) -> None:
    was = gc.isenabled()
    try:
        if not enabled_before:
            gc.disable()
        with pytest.raises(RuntimeError), collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("an import failed")
        assert gc.isenabled() is enabled_before
    finally:
        if was:
            gc.enable()
