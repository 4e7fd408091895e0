"""A spare runner warms itself up while it waits for its launch.

A child forked by the fork server shares the fork server's memory until it writes to it. The
first write to each shared page (and Python writes an object whenever its reference count
changes) costs a page fault that copies the page: about 430 faults between a launch and
``ready`` (most of its 2.8 ms on the development machine) and 250 more while the run's nodes
execute (docs/PERFORMANCE.md). A spare (server/runs/spares.py) has nothing else to do until
its launch comes, so it first does once what a launch will make it do, with piwf's own
built-in ``noop`` workflow::

    load noop.py                      read, hash, compile and import it; compile the graph
    load it again as recorded         verify the hashes, load, compare the digest
    decode a launch frame for it      canonical JSON, then the Launch model's validation
    run it through the engine         in memory (piwf.workflow.memory), not on the pipe

so the pages those paths write are the spare's own by the time its run comes. No user code
runs, nothing is written outside the process, nothing of it is kept (the built-in's modules
are dropped again), and it stops between steps once ``launch_waiting`` says the launch is
there. A failing step ends the warm-up and is reported on standard error (the runner log);
the spare still serves its launch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from piwf import canonical
from piwf.protocol.runner_v1 import Launch
from piwf.runner.verified_sources import load_verified_workflow
from piwf.workflow.failure import WORKFLOW_MODULE_PREFIX
from piwf.workflow.memory import run_in_memory
from piwf.workflow.sources import BUILTIN_DIR, load_workflow

#: The built-in workflow a spare loads to warm up: one compute node, nothing else imported.
WARM_UP_WORKFLOW = BUILTIN_DIR / "noop.py"


def warm_up(launch_waiting: Callable[[], bool]) -> bool:
    """Run the warm-up steps until one fails or ``launch_waiting()`` is true; return whether
    every step ran. Never raises for a failing step (see the module docstring)."""
    before = set(sys.modules)
    try:
        if launch_waiting():
            return False
        loaded = load_workflow(WARM_UP_WORKFLOW)
        if launch_waiting():
            return False
        source = loaded.sources.to_json()
        load_verified_workflow(source, loaded.compiled.digest)
        if launch_waiting():
            return False
        frame = Launch(
            runId="warm-up",
            generation=1,
            runnerEpoch="warm-up",
            serverEpoch=1,
            workflowSource=source,
            definitionDigest=loaded.compiled.digest,
        ).encode()  # as the server encodes a launch
        Launch.model_validate(canonical.decode(frame))
        if launch_waiting():
            return False
        run_in_memory(loaded.compiled, {"warmUp": True}, run_id="warm-up")
        return True
    except Exception as error:  # a warm-up that fails must not cost the run
        print(f"piwf runner: warm-up skipped: {type(error).__name__}", file=sys.stderr)
        return False
    finally:
        for name in set(sys.modules) - before:
            if name.startswith(WORKFLOW_MODULE_PREFIX):
                del sys.modules[name]
