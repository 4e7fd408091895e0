"""What the operation handlers share: the database, the command runner and the server hooks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from piwf.protocol.client_v1 import Request
from piwf.server.channels.adapters import ChannelAdapters
from piwf.server.children.resolvers import ResolverJobs
from piwf.server.commands import DurableCommands
from piwf.server.coordinators import Coordinators
from piwf.server.loop import EventLoop, Reply, Timer
from piwf.state import StateDatabase
from piwf.state.leases import Claim


@dataclass
class Waiter:
    """One ``run.wait`` request parked until its run is terminal or its timer fires."""

    reply: Reply
    request_id: str
    timer: Timer


@dataclass
class ServerContext:
    """What handlers may use; the lifecycle builds it once per server process."""

    db: StateDatabase
    commands: DurableCommands
    loop: EventLoop
    resolvers: ResolverJobs
    home: Path
    epoch: int
    max_workers: int
    connection_count: Callable[[], int]
    request_stop: Callable[[], None]
    server_id: str = "server"
    run_lease_ms: int = 30_000
    active_runners: Callable[[], int] = lambda: 0
    active_claim: Callable[[str], Claim | None] = lambda _run_id: None
    stop_runner: Callable[[str, str], None] = lambda _run_id, _reason: None
    wake_scheduler: Callable[[], None] = lambda: None
    #: Queue a ``validating`` submission for a validation child (submission id, run id).
    request_validation: Callable[[str, str], None] = lambda _submission_id, _run_id: None
    #: Tell ``run.wait`` waiters (and the server's other watchers) that a run changed.
    run_changed: Callable[[str], None] = lambda _run_id: None
    #: The active coordinator (connection and epoch) of each origin session.
    coordinators: Coordinators = field(default_factory=lambda: Coordinators(0))
    #: The channel adapters (None in handler tests that start none).
    channels: ChannelAdapters | None = None
    waiters: dict[str, list[Waiter]] = field(default_factory=dict)
    starts_in_flight: dict[tuple[str, str], list[tuple[Request, Reply]]] = field(
        default_factory=dict
    )
    #: Client-chosen run ids whose start is still resolving → controls that wait for it.
    pending_run_ids: dict[str, list[tuple[Request, Reply]]] = field(default_factory=dict)
