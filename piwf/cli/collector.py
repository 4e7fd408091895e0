"""Importing a command's or the server's modules without the garbage collector's passes.

Those imports create tens of thousands of objects that live as long as the process (classes,
functions, pydantic's schemas and validators), and every few hundred allocations start a pass
of the cyclic collector over the young ones, which finds almost nothing to free. Counted with
``gc.callbacks``: importing the server's modules ran 117 passes that freed about 800 objects
and took about a tenth of the import time; a command such as ``piwf run show`` ran 20.

:func:`collector_paused` turns the collector off for such a block of imports and restores the
state it found, so a process that had turned it off keeps it off. Reference counting still
frees every object that is not in a cycle; the few cycles made meanwhile wait for the next pass.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with the cyclic garbage collector off, then restore it as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
