"""The display statuses a run shows clients: the seed's closed set (no models, no pydantic).

A run parked until someone acts shows ``queued`` with ``needsAction``; see
:mod:`piwf.state.execution.runs` for how each is derived.
"""

from __future__ import annotations

from typing import Literal

RunDisplayStatus = Literal[
    "queued",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "timed_out",
    "cancelled",
    "ambiguous",
]
