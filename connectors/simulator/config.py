"""Simulator settings: everything that shapes the simulated node, fixed by a seed."""

from __future__ import annotations

from dataclasses import dataclass, field

from connectors.simulator.profiles import behaviours_of
from connectors.simulator.tagtree import REMOTE_LAG_MS

MAX_PERIOD_MS = 86_400_000
# The node's own raw cap under the `raw_cap_small` behaviour.
SMALL_RAW_CAP = 250
# How far the node's clock is behind the caller's under the `clock_behind` behaviour.
CLOCK_BEHIND_MS = 600_000
# The name the node gives itself under `other_identity` (its license uid follows the name).
OTHER_NODE_NAME = "sim-node-b"


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
    # How late the tags over the link (about one in nine) reach the node: a test on the
    # wall clock makes it short, so their samples arrive within its run.
    remote_lag_ms: int = REMOTE_LAG_MS
    # How this node reads what the spec leaves open: a profile spec (profiles.py), such as
    # `default`, `repeated-names` or `node-1.21.5+raw-cap`.
    profile: str = "default"
    # The tag paths to serve instead of the generated ones (property tests draw trees).
    tag_paths: tuple[str, ...] | None = None
    behaviours: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "behaviours", behaviours_of(self.profile))
        if "other_identity" in self.behaviours and self.node_name == "sim-node":
            object.__setattr__(self, "node_name", OTHER_NODE_NAME)
        if self.tag_paths is not None:
            if not self.tag_paths or len(set(self.tag_paths)) != len(self.tag_paths):
                raise ValueError("tag_paths must be distinct and not empty")
            if any(not path.startswith("/") or path.endswith("/") for path in self.tag_paths):
                raise ValueError("a tag path starts with / and does not end with /")
            object.__setattr__(self, "tags", len(self.tag_paths))
        elif not 10 <= self.tags <= 100_000:
            raise ValueError(f"tags must be between 10 and 100000, not {self.tags}")
        if self.raw_cap < 1:
            raise ValueError("raw_cap must be positive")
        if self.period_ms is not None and not 1 <= self.period_ms <= MAX_PERIOD_MS:
            raise ValueError(
                f"period_ms must be between 1 and {MAX_PERIOD_MS}, not {self.period_ms}"
            )
        if self.cache_limit_bytes < 0:
            raise ValueError("cache_limit_bytes must not be negative")
        if not 1 <= self.remote_lag_ms <= MAX_PERIOD_MS:
            raise ValueError(
                f"remote_lag_ms must be between 1 and {MAX_PERIOD_MS}, not {self.remote_lag_ms}"
            )

    def clock_offset_ms(self) -> int:
        """How far the node's clock is from the caller's (negative: behind)."""
        return -CLOCK_BEHIND_MS if "clock_behind" in self.behaviours else 0

    def node_raw_cap(self) -> int | None:
        """The node's own cap on raw samples per tag (None: only `limit` caps)."""
        if "raw_uncapped" in self.behaviours:
            return None
        if "raw_cap_small" in self.behaviours:
            return min(SMALL_RAW_CAP, self.raw_cap)
        return self.raw_cap

    def __repr__(self) -> str:
        secret = "***" if self.token or self.password else None
        return (
            f"SimConfig(seed={self.seed}, tags={self.tags}, raw_cap={self.raw_cap}, "
            f"period_ms={self.period_ms}, profile={self.profile!r}, auth={secret})"
        )
