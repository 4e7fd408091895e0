"""Server settings, their defaults and the files the server keeps under ``$PIWF_HOME/server/``."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from piwf.config import (
    MAX_RETENTION_DAYS,
    MAX_SETTING_INTEGER,
    MAX_SETTING_MILLISECONDS,
    MAX_SETTING_SECONDS,
    ServerPaths,
    plain_number,
    split_agent_command,
    state_home,
)
from piwf.server.children.start_methods import (
    StartMethod,
    default_start_method,
    start_method_from,
)

DEFAULT_MAX_WORKERS = 4
DEFAULT_IDLE_EXIT_S = 300.0
#: The most spare runners ``PIWF_SPARE_RUNNERS`` asks for: each is a started Python process
#: holding tens of MiB and five of the server's file descriptors while it waits, all started
#: at once when the server starts; a huge value would fork the machine full. A spare saves a
#: launch about a millisecond (docs/PERFORMANCE.md), so more than a burst of starts takes
#: gains nothing.
MAX_SPARE_RUNNERS = 32


def _env_int(
    name: str, default: int, *, minimum: int = 1, maximum: int = MAX_SETTING_INTEGER
) -> int:
    """``$name`` as an integer from ``minimum`` to ``maximum`` (unset or empty: ``default``);
    raise ``ValueError`` naming the variable and what it takes otherwise."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    what = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
    problem = f"{name} must be {what} and at most {maximum}, not {value!r}; set it so, or unset it"
    if not plain_number(value):
        raise ValueError(problem)
    try:
        number = int(value)
    except ValueError:
        raise ValueError(problem) from None
    if not minimum <= number <= maximum:
        raise ValueError(problem)
    return number


def _check_lease(lease: str, lease_ms: int, renew: str, renew_s: float) -> None:
    """Raise ``ValueError`` unless the lease ``lease_ms`` lasts at least two renewal
    intervals ``renew_s``.

    The server renews its epoch and each run's claim on a timer; a lease that lapses before
    the next renewal is lost while it is still in use: a run is taken up again by the next
    generation over and over, repeating its effects, and the server loses its own epoch and
    stops."""
    if lease_ms >= 2 * renew_s * 1000:
        return
    raise ValueError(
        f"{lease} ({lease_ms}) must be at least twice {renew} ({renew_s:g} s, so at least"
        f" {math.ceil(2 * renew_s * 1000)} ms): the lease would lapse between two renewals,"
        " losing what it holds while it is in use; raise the lease or shorten the renewal"
        " interval, or unset both"
    )


def _env_start_method() -> StartMethod:
    value = os.environ.get("PIWF_START_METHOD")
    if value is None or value == "":
        return default_start_method()
    return start_method_from(value)


def _env_float(name: str, default: float, *, zero_allowed: bool = True) -> float:
    """``$name`` as a finite number of seconds up to :data:`MAX_SETTING_SECONDS`, 0 or more
    (``zero_allowed``, where 0 means off or never) or more than 0 (an interval or a deadline
    that 0 would turn into a busy loop or an instant failure); unset or empty: ``default``.
    Raise ``ValueError`` naming the variable and what it takes otherwise."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowest = "0 or more" if zero_allowed else "more than 0"
    problem = (
        f"{name} must be a finite number of seconds, {lowest} and at most"
        f" {MAX_SETTING_SECONDS}, not {value!r}; set it so, or unset it"
    )
    if not plain_number(value):
        raise ValueError(problem)
    try:
        number = float(value)
    except ValueError:
        raise ValueError(problem) from None
    above_lowest = number >= 0 if zero_allowed else number > 0
    if not (math.isfinite(number) and above_lowest and number <= MAX_SETTING_SECONDS):
        raise ValueError(problem)
    return number


def _env_agent_command() -> tuple[str, ...] | None:
    value = os.environ.get("PIWF_AGENT_COMMAND")
    if value is None or value.strip() == "":
        return None
    try:
        return tuple(split_agent_command(value))
    except ValueError as error:
        raise ValueError(f"PIWF_AGENT_COMMAND: {error}") from None


@dataclass(frozen=True)
class ServerSettings:
    """Tunables of one server process; tests shorten the intervals."""

    paths: ServerPaths = field(default_factory=lambda: ServerPaths(state_home()))
    max_workers: int = DEFAULT_MAX_WORKERS
    #: Idle runner children kept started while slots are free, so a launch need not wait for
    #: a child's start (docs/EXECUTION.md, "Spare runners"); 0: none.
    spare_runners: int = 1
    idle_exit_s: float = DEFAULT_IDLE_EXIT_S
    server_lease_ms: int = 30_000
    server_renew_s: float = 10.0
    frame_deadline_s: float = 10.0
    #: A connection that sends no byte this long after it was accepted is closed.
    first_frame_deadline_s: float = 10.0
    #: A connection whose buffered answers make no progress this long is closed.
    output_stall_deadline_s: float = 30.0
    #: At the limit the connection idle longest is closed for a new one (docs/PROTOCOL.md §7).
    max_connections: int = 128
    max_inflight_per_connection: int = 32
    output_cap_bytes: int = 8 * 1024 * 1024
    #: How long a resolver child may take to load a workflow or a resource manager (and
    #: compute its initial status) before it is killed.
    resolver_timeout_s: float = 30.0
    run_lease_ms: int = 30_000
    run_renew_s: float = 10.0
    claim_poll_s: float = 2.0
    runner_ready_timeout_s: float = 30.0
    #: How long a resource reconcile may overrun its manager's ``timeout_ms`` before it is
    #: killed (its signal is set at the deadline itself).
    reconcile_grace_s: float = 1.0
    #: How long an agent node's ``validate`` may run in its validation child (docs/AGENTS.md).
    validation_timeout_s: float = 30.0
    #: Retention (docs/RETENTION.md): days kept after ``finished_at``, the wait after a failed
    #: or postponed sweep, the interval between completed sweeps, and the reclaimable bytes an
    #: automatic VACUUM needs.
    retention_days: int = 30
    retention_retry_s: float = 300.0
    retention_interval_s: float = 86_400.0
    retention_vacuum_min_bytes: int = 64 * 1024 * 1024
    #: How children start (docs/EXECUTION.md): forked by a fork server, or spawned.
    start_method: StartMethod = field(default_factory=default_start_method)
    #: At most this long on ``PRAGMA quick_check`` when the database opens (0: skip it).
    quick_check_s: float = 2.0
    #: The agent command of headless steps that name none (docs/AGENTS.md).
    agent_command: tuple[str, ...] | None = None

    @classmethod
    def from_environment(cls, **overrides: object) -> ServerSettings:
        """Read the ``PIWF_*`` tunables (``MAX_WORKERS``, ``SPARE_RUNNERS`` (``0``: none; at most
        :data:`MAX_SPARE_RUNNERS`),
        ``IDLE_EXIT_S``, ``SERVER_LEASE_MS`` (at least twice ``SERVER_RENEW_S``),
        ``SERVER_RENEW_S``, ``FRAME_DEADLINE_S``,
        ``FIRST_FRAME_DEADLINE_S`` and
        ``OUTPUT_STALL_DEADLINE_S`` (``0``: off), ``MAX_CONNECTIONS``, ``OUTPUT_CAP_BYTES``,
        ``RUN_LEASE_MS`` (at least twice ``RUN_RENEW_S``), ``RUN_RENEW_S``,
        ``CLAIM_POLL_S``, ``RUNNER_READY_TIMEOUT_S``, ``RESOLVER_TIMEOUT_S``, ``RETENTION_DAYS``,
        ``RETENTION_RETRY_S``,
        ``RETENTION_INTERVAL_S``, ``RETENTION_VACUUM_MIN_BYTES``, ``RECONCILE_GRACE_S``,
        ``START_METHOD`` (``forkserver`` or ``spawn``), ``QUICK_CHECK_S``, ``AGENT_COMMAND``
        (``'CMD ARGS'``, split like a shell would; empty: none)); ``overrides`` win.

        Raises ``ValueError`` naming the variable for a value it cannot use: not a number, out
        of its range (every one is bounded above, so that it fits the protocol's exact integers
        and SQLite's), or 0 for an interval or deadline that 0 would break (docs/CLI.md,
        ``server start``)."""
        run_lease_ms = _env_int("PIWF_RUN_LEASE_MS", 30_000, maximum=MAX_SETTING_MILLISECONDS)
        run_renew_s = _env_float("PIWF_RUN_RENEW_S", 10.0, zero_allowed=False)
        _check_lease("PIWF_RUN_LEASE_MS", run_lease_ms, "PIWF_RUN_RENEW_S", run_renew_s)
        server_lease_ms = _env_int("PIWF_SERVER_LEASE_MS", 30_000, maximum=MAX_SETTING_MILLISECONDS)
        server_renew_s = _env_float("PIWF_SERVER_RENEW_S", 10.0, zero_allowed=False)
        _check_lease("PIWF_SERVER_LEASE_MS", server_lease_ms, "PIWF_SERVER_RENEW_S", server_renew_s)
        values: dict[str, object] = {
            "paths": ServerPaths(state_home()),
            "max_workers": _env_int("PIWF_MAX_WORKERS", DEFAULT_MAX_WORKERS),
            "spare_runners": _env_int(
                "PIWF_SPARE_RUNNERS", 1, minimum=0, maximum=MAX_SPARE_RUNNERS
            ),
            "idle_exit_s": _env_float("PIWF_IDLE_EXIT_S", DEFAULT_IDLE_EXIT_S),
            "server_lease_ms": server_lease_ms,
            "server_renew_s": server_renew_s,
            "frame_deadline_s": _env_float("PIWF_FRAME_DEADLINE_S", 10.0, zero_allowed=False),
            "first_frame_deadline_s": _env_float("PIWF_FIRST_FRAME_DEADLINE_S", 10.0),
            "output_stall_deadline_s": _env_float("PIWF_OUTPUT_STALL_DEADLINE_S", 30.0),
            "max_connections": _env_int("PIWF_MAX_CONNECTIONS", 128),
            "output_cap_bytes": _env_int("PIWF_OUTPUT_CAP_BYTES", 8 * 1024 * 1024),
            "run_lease_ms": run_lease_ms,
            "run_renew_s": run_renew_s,
            "claim_poll_s": _env_float("PIWF_CLAIM_POLL_S", 2.0, zero_allowed=False),
            "runner_ready_timeout_s": _env_float(
                "PIWF_RUNNER_READY_TIMEOUT_S", 30.0, zero_allowed=False
            ),
            "resolver_timeout_s": _env_float("PIWF_RESOLVER_TIMEOUT_S", 30.0, zero_allowed=False),
            "reconcile_grace_s": _env_float("PIWF_RECONCILE_GRACE_S", 1.0),
            "validation_timeout_s": _env_float(
                "PIWF_VALIDATION_TIMEOUT_S", 30.0, zero_allowed=False
            ),
            "retention_days": _env_int("PIWF_RETENTION_DAYS", 30, maximum=MAX_RETENTION_DAYS),
            "retention_retry_s": _env_float("PIWF_RETENTION_RETRY_S", 300.0),
            "retention_interval_s": _env_float("PIWF_RETENTION_INTERVAL_S", 86_400.0),
            "retention_vacuum_min_bytes": _env_int(
                "PIWF_RETENTION_VACUUM_MIN_BYTES", 64 * 1024 * 1024
            ),
            "start_method": _env_start_method(),
            "quick_check_s": _env_float("PIWF_QUICK_CHECK_S", 2.0),
            "agent_command": _env_agent_command(),
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)  # type: ignore[arg-type]
