"""What the live tests share: a fresh simulated node on loopback, a tailed flow over it,
and its history samples published as the node's subscription events."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.config.destinations import SinkSet
from pipelines.config.models import Config
from pipelines.config.nodes import NodePool
from pipelines.live.unit import LiveUnit
from sinks.base import Reads
from tests.fixtures import load, write_config

FLOW = "live"
LIVE = {"commit_every": "1s", "late_within": "2s", "poll_limit": 500}


@dataclass
class Tailed:
    node: SimulatedNode
    config: Config
    path: Path
    tags: list[str]

    def now_ms(self) -> int:
        return self.node.now_ms()

    def advance(self, ms: int) -> int:
        """Move the node's (frozen) clock on by `ms`: its next poll brings the samples
        history shows in between. The new time."""
        now = self.node.now_ms() + ms
        self.node.set_clock(now)
        return now

    def samples(self, start_ms: int, end_ms: int, tags: list[str] | None = None) -> int:
        """How many samples history holds for the tags (default the flow's) in
        [start_ms, end_ms): a stretch may fall in one of the node's gaps."""
        raw = HistoryOptions(mode="raw")
        return sum(
            len(self.node.ground_truth(tag, start_ms, end_ms, raw)) for tag in tags or self.tags
        )

    def subscriptions(self) -> list[dict[str, Any]]:
        import orjson

        answer = self.node.subscriptions.list({})
        listed: list[dict[str, Any]] = orjson.loads(answer.body)
        return listed

    @contextmanager
    def unit(self, run: str = "r1") -> Iterator[LiveUnit]:
        with (
            NodePool(self.config) as pool,
            SinkSet(self.config, self.path.parent, writing=True) as sinks,
            SinkSet(self.config, self.path.parent, writing=True) as gap_sinks,
            LiveUnit(
                self.config, FLOW, "n", nodes=pool, sinks=sinks, gap_sinks=gap_sinks, run=run
            ) as unit,
        ):
            yield unit


@contextmanager
def tailed(
    tmp_path: Path, profile: str = "default", pg: tuple[str, str] | None = None, **flow: Any
) -> Iterator[Tailed]:
    """A node of 10 tags sampled every second, its clock frozen on a whole second 10
    minutes back (tests move it on: `Tailed.advance`; history completes windows up to the
    earlier of its clock and ours), and a flow tailing 4 of them (by path)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    node = SimulatedNode(SimConfig(seed=3, tags=10, period_ms=1000, profile=profile))
    node.set_clock((node.now_ms() - 600_000) // 1000 * 1000)
    tags = node.tag_paths()[:4]
    with run_server(node, http_port=0, https_port=None) as server:
        spec = {
            "node": "n",
            "tags": {"paths": tags},
            "mode": "raw",
            "window": "1h",
            "start": "2020-01-01T00:00:00Z",
            "settle": "2s",
            "live": LIVE,
            **flow,
        }
        sinks = ["lake", "duck", "pg"] if pg is not None else ["lake", "duck"]
        path = write_config(
            tmp_path, node={"url": server.http_url}, flows={FLOW: spec}, pg=pg, sinks=sinks
        )
        yield Tailed(node, load(path), path, tags)


def read(config: Config, base: Path, sink: str) -> pd.DataFrame:
    with SinkSet(config, base) as sinks:
        found = sinks.get(sink)
        assert isinstance(found, Reads)
        return found.read(FLOW, "tag_history")
