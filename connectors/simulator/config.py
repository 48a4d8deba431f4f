"""Simulator settings: everything that shapes the simulated node, fixed by a seed."""

from __future__ import annotations

from dataclasses import dataclass

MAX_PERIOD_MS = 86_400_000


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
    # Replay mode keeps answers while they fit in this many bytes, zstd-compressed if asked.
    cache_limit_bytes: int = 8 << 30
    cache_compress: bool = False
    # Every tag sampled every `period_ms` on a regular grid; None: mixed periods (1 s .. 60 s)
    # and a third of the tags irregular, as a real node's tags are.
    period_ms: int | None = None

    def __post_init__(self) -> None:
        if not 10 <= self.tags <= 100_000:
            raise ValueError(f"tags must be between 10 and 100000, not {self.tags}")
        if self.raw_cap < 1:
            raise ValueError("raw_cap must be positive")
        if self.period_ms is not None and not 1 <= self.period_ms <= MAX_PERIOD_MS:
            raise ValueError(
                f"period_ms must be between 1 and {MAX_PERIOD_MS}, not {self.period_ms}"
            )
        if self.cache_limit_bytes < 0:
            raise ValueError("cache_limit_bytes must not be negative")

    def __repr__(self) -> str:
        secret = "***" if self.token or self.password else None
        return (
            f"SimConfig(seed={self.seed}, tags={self.tags}, raw_cap={self.raw_cap}, "
            f"period_ms={self.period_ms}, auth={secret})"
        )
