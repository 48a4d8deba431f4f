"""Shards of a backfill: independent parts of one flow's work, each a flow run of its own.

A sharded backfill (`historian backfill FLOW --shards N --pool P`) splits a unit's planned
chunks into N contiguous parts, by tag batch (equal chunk counts, batch by batch: whole
batches where they divide evenly, `Shard.select`) or by time (whole windows of the flow's
grid), and submits each part as a flow run to a Prefect work pool (`pipelines/orchestration/fleet.py`). The core (`runner.FlowRun.plan`) keeps only the shard's
chunks; their ids are those of the unsharded plan, so progress is shared: a re-run of the
same backfill, sharded or not, skips every chunk already committed.

Each shard locks `<unit>#<i>-of-<n>` in every sink (shards of one backfill run at once;
the same shard twice does not) and records progress under the unit, like any run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipelines.planning import Chunk

ShardBy = Literal["tags", "time"]
SHARD_BY: tuple[ShardBy, ...] = ("tags", "time")


@dataclass(frozen=True)
class Shard:
    """Part `index` (0-based) of `count`, cut `by` tag batches or by time windows."""

    index: int
    count: int
    by: ShardBy = "tags"

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index} of {self.count} does not exist")
        if self.by not in SHARD_BY:
            raise ValueError(f"shard by {self.by!r}: use {' or '.join(SHARD_BY)}")

    @property
    def label(self) -> str:
        """`2-of-4`: 1-based, as the lock key and the output show it."""
        return f"{self.index + 1}-of-{self.count}"

    def lock_key(self, unit: str) -> str:
        """The key this shard locks in every sink: `<unit>#<i>-of-<n>`."""
        return f"{unit}#{self.label}"

    def as_parameter(self) -> dict[str, Any]:
        """The Prefect flow parameter (plain JSON)."""
        return {"index": self.index, "count": self.count, "by": self.by}

    @classmethod
    def from_parameter(cls, value: dict[str, Any] | None) -> Shard | None:
        if value is None:
            return None
        return cls(int(value["index"]), int(value["count"]), value.get("by", "tags"))

    def _mine(self, position: int, total: int) -> bool:
        """Whether item `position` of `total` falls in this shard's contiguous range."""
        return self.index * total // self.count <= position < (self.index + 1) * total // self.count

    def select(self, chunks: Sequence[Chunk]) -> list[Chunk]:
        """This shard's chunks of a plan, in plan order, every chunk in exactly one shard.

        `time`: whole windows, contiguous. `tags`: the chunks taken batch by batch (in the
        plan's batch order), each batch window by window, cut into `count` contiguous runs
        of equal chunk count (one apart at most): whole batches when the batches divide
        evenly among the shards, otherwise a batch at a cut has its windows split between
        two neighbouring shards, so 3 batches over 2 shards are 1.5 batches each, not 2 + 1.
        """
        if self.by == "tags":
            batch = {key: i for i, key in enumerate(dict.fromkeys(c.members for c in chunks))}
            order = sorted(
                range(len(chunks)),
                key=lambda i: (batch[chunks[i].members], chunks[i].window.start),
            )
            rank = {at: position for position, at in enumerate(order)}
            return [c for i, c in enumerate(chunks) if self._mine(rank[i], len(chunks))]
        windows = sorted({chunk.window.start for chunk in chunks})
        at = {start: i for i, start in enumerate(windows)}
        return [c for c in chunks if self._mine(at[c.window.start], len(windows))]

    def writes_metadata(self) -> bool:
        """Only the first shard writes the tag dimension (one writer, not N at once)."""
        return self.index == 0
