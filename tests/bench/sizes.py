"""How big each figure is: the full suite (``tox -e bench``) and the smoke suite (CI)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    """Every size a figure reads; ``smoke`` only checks that the figures are produced."""

    name: str
    reps: int
    throughput_runs: int
    submit_threads: int
    latency_samples: int
    chain_nodes: int
    floor_commits: int
    poll_clients: int
    poll_processes: int
    poll_seconds: float
    terminal_runs: int
    resumable_runs: int
    growth_small: int
    growth_large: int
    growth_requests: int
    memory_runs: int
    mixed_runs: int
    mixed_resources: int
    mixed_rounds: int

    @property
    def smoke(self) -> bool:
        return self.name == "smoke"


FULL = Sizes(
    name="full",
    reps=3,
    throughput_runs=200,
    submit_threads=8,
    latency_samples=20,
    chain_nodes=200,
    floor_commits=200,
    poll_clients=32,
    poll_processes=4,
    poll_seconds=5.0,
    terminal_runs=10_000,
    resumable_runs=100,
    growth_small=1_000,
    growth_large=100_000,
    growth_requests=200,
    memory_runs=100,
    mixed_runs=40,
    mixed_resources=8,
    mixed_rounds=5,
)

SMOKE = Sizes(
    name="smoke",
    reps=1,
    throughput_runs=4,
    submit_threads=2,
    latency_samples=2,
    chain_nodes=6,
    floor_commits=20,
    poll_clients=4,
    poll_processes=2,
    poll_seconds=0.5,
    terminal_runs=30,
    resumable_runs=2,
    growth_small=10,
    growth_large=50,
    growth_requests=5,
    memory_runs=4,
    mixed_runs=4,
    mixed_resources=2,
    mixed_rounds=2,
)
