"""Simulator settings: everything that shapes the simulated node, fixed by a seed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimConfig:
    seed: int = 1
    tags: int = 100
    raw_cap: int = 10_000
    token: str | None = None
    username: str | None = None
    password: str | None = None
    node_name: str = "sim-node"
    history_start_ms: int = 1_577_836_800_000  # 2020-01-01T00:00:00Z
    hostile_names: bool = False
    restart_s: float = 0.5
    cache_answers: bool = False

    def __post_init__(self) -> None:
        if not 10 <= self.tags <= 100_000:
            raise ValueError(f"tags must be between 10 and 100000, not {self.tags}")
        if self.raw_cap < 1:
            raise ValueError("raw_cap must be positive")

    def __repr__(self) -> str:
        secret = "***" if self.token or self.password else None
        return (
            f"SimConfig(seed={self.seed}, tags={self.tags}, raw_cap={self.raw_cap}, auth={secret})"
        )
