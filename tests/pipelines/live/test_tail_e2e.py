"""The live tail end to end, as a user runs it: `historian tail` (its own process) against
the simulator on loopback, into the lake and the real PostgreSQL.

One test of latency (a sample's row readable in the sink within 5 s of its node time,
found by polling the sink), and one per way a tail loses events (the node discarding them
under a slow poller, the tail SIGKILLed and restarted, its subscription cancelled on the
node, a remote link going offline and draining its store-and-forward buffer): each waits
until the tail says history has re-read every gap it opened, stops it with Ctrl-C, and
compares the sink with a backfill of the span the tail covered, row for row: 0 missing,
0 extra, 0 duplicated.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.live.unit import LIVE_CHUNK
from tests.fixtures import load, write_config
from tests.live_harness import (
    backfill_rows,
    exactness,
    linked_tags,
    local_tags,
    marked,
    sink_frame,
    sink_rows,
    start_tail,
    wait_until,
)

FLOW = "f"
LATENCY_BOUND_S = 5.0
HEAL_WAIT_S = 240.0  # a loaded 2-core machine: gap runs are history runs


@dataclass
class LiveRun:
    """A node on loopback, a tailed flow of it, and the tails started on it."""

    node: SimulatedNode
    config: Path
    sink: str
    tags: list[str]
    tmp: Path
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)
    tails: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.tmp / "tail.out"

    def start(self) -> subprocess.Popen[bytes]:
        tail = start_tail(self.config, FLOW, mark=self.mark, out=self.out, json_logs=True)
        self.tails.append(tail)
        return tail

    def commits(self) -> list[dict[str, Any]]:
        """The tails' commit lines so far (`--log-format json`)."""
        found = []
        for line in self.out.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"progress"' in line:
                found.append(orjson.loads(line)["progress"])
        return found

    def wait_committed(self, count: int = 1) -> None:
        before = len(self.commits())
        wait_until(lambda: len(self.commits()) >= before + count, 120, "a tail commit")

    def wait_healed(self) -> list[dict[str, Any]]:
        """Until a commit after every gap opened so far says none is pending."""

        def healed() -> list[dict[str, Any]] | None:
            self.alive()
            commits = self.commits()
            opened = [i for i, c in enumerate(commits) if c["gaps_opened"]]
            if not opened:
                return None
            after = commits[opened[-1] + 1 :]
            if any(c["gaps_healed"] for c in commits) and any(not c["gaps_pending"] for c in after):
                return commits
            return None

        found: list[dict[str, Any]] = wait_until(healed, HEAL_WAIT_S, "every gap re-read")
        return found

    def alive(self) -> None:
        tail = self.tails[-1]
        assert tail.poll() is None, f"the tail ended: {self.out.read_text()[-2000:]}"

    def stop(self) -> None:
        tail = self.tails[-1]
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=60) == 130, self.out.read_text()[-2000:]

    def subscriptions(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = orjson.loads(self.node.subscriptions.list({}).body)
        return listed

    def span(self) -> Window:
        """What the tails covered, from the sink's record of their commits: from the end
        of the first window (the subscription began inside it, or a link's lag before,
        which a tag over the link delivers its samples after) to the start of the last
        (samples after the stop never reached the tail), and never past `now - settle`
        (the node had not delivered a lagging tag's newer samples to anyone)."""
        cfg = load(self.config)
        with SinkSet(cfg, self.config.parent) as sinks:
            records = [
                r
                for r in sinks.get(self.sink).chunk_log(FLOW, limit=1_000_000)
                if r.chunk_id.startswith(LIVE_CHUNK)
            ]
        assert records, "the tail committed"
        settled = datetime.now(UTC) - cfg.flows[FLOW].settle
        end = min(max(r.window.start for r in records), settled)
        by_path = self.node.tree().by_path
        lag = timedelta(milliseconds=max(by_path[tag].remote_lag_ms for tag in self.tags))
        span = Window(min(r.window.end for r in records) + lag, end)
        assert span.end - span.start > timedelta(seconds=5), span
        return span

    def healed_and_stopped(self) -> list[dict[str, Any]]:
        """Every gap re-read, a few more commits (the span reaches past the gaps), Ctrl-C."""
        commits = self.wait_healed()
        self.wait_committed(4)
        self.stop()
        return commits

    def assert_exact(self) -> None:
        """The sink over the tails' span equals a backfill of it, row for row, and every
        gap the tails opened lies inside the span."""
        span = self.span()
        gaps = [_window(gap) for c in self.commits() for gap in c["gaps_opened"]]
        inside = [g for g in gaps if span.start < g.end <= span.end]
        assert inside, f"a gap the tail opened ends in the span compared: {gaps} {span}"
        got = sink_rows(self.config, self.sink, FLOW, span)
        want = backfill_rows(self.config, FLOW, span, self.tmp / "reference")
        assert want, "the node had samples in the span"
        found = exactness(got, want)
        assert found.exact, f"{found} over {span}"


def _window(shown: str) -> Window:
    """A window as the tail's JSON lines show it: `[start, end)`."""
    start, end = shown.strip("[)").split(", ")
    return Window(datetime.fromisoformat(start), datetime.fromisoformat(end))


@contextmanager
def live_run(
    tmp_path: Path,
    sink: str,
    pg: tuple[str, str] | None,
    *,
    tags: int = 12,
    profile: str | None = None,
    live: dict[str, Any] | None = None,
    settle: str = "3s",
    linked: int = 0,
    link_lag_ms: int | None = None,
) -> Iterator[LiveRun]:
    """A node sampling every tag every second, a flow tailing its first local tags (and
    `linked` of its tags over the link, `link_lag_ms` late), on loopback; every tail
    stopped and checked gone."""
    simulated: dict[str, Any] = {"seed": 13, "tags": tags, "period_ms": 1000}
    if profile:
        simulated["profile"] = profile
    if link_lag_ms is not None:
        simulated["remote_lag_ms"] = link_lag_ms
    node = SimulatedNode(SimConfig(**simulated))
    chosen = local_tags(node, 6) + linked_tags(node, linked)
    assert len(chosen) == 6 + linked, "the node has the tags asked for"
    with run_server(node, http_port=0, https_port=None) as server:
        spec = {
            "node": "n",
            "tags": {"paths": chosen},
            "mode": "raw",
            "window": "10m",
            "start": "-10m",
            "settle": settle,
            "live": {"commit_every": "1s", "poll_every": "250ms", "late_within": "2s"}
            | (live or {}),
        }
        config = write_config(
            tmp_path, node={"url": server.http_url}, flows={FLOW: spec}, pg=pg, sinks=[sink]
        )
        run = LiveRun(node, config, sink, chosen, tmp_path)
        try:
            yield run
        finally:
            for tail in run.tails:
                if tail.poll() is None:
                    tail.kill()
                    tail.wait(timeout=30)
        assert marked(run.mark) == [], "a tail's process outlived it"


@pytest.fixture(params=["lake", "pg"])
def sink(request: pytest.FixtureRequest) -> Iterator[tuple[str, tuple[str, str] | None]]:
    if request.param == "lake":
        yield "lake", None
        return
    url = request.getfixturevalue("pg_url")
    schema = request.getfixturevalue("pg_schema")
    yield "pg", (url, schema)


def next_sample(node: SimulatedNode, tags: list[str], after_ms: int) -> tuple[str, int]:
    """The first sample of any of `tags` stamped after `after_ms` (tag, ts ms), once the
    node's clock has passed it (the node's samples exist only up to its clock)."""
    raw = HistoryOptions(mode="raw")
    wait_until(lambda: node.now_ms() > after_ms + 1_000, 10, "the node's clock")
    found = []
    for tag in tags:
        rows = node.ground_truth(tag, after_ms + 1, after_ms + 1_001, raw)
        found += [(int(row[0]), tag) for row in rows]
    assert found, "a sample every second"
    ts, tag = min(found)
    return tag, ts


@pytest.mark.slow
def test_a_tailed_sample_is_readable_in_the_sink_within_5_s_of_its_node_time(
    tmp_path: Path, sink: tuple[str, tuple[str, str] | None]
) -> None:
    name, pg = sink
    with live_run(tmp_path, name, pg) as run:
        run.start()
        run.wait_committed()
        tag, ts = next_sample(run.node, run.tags, run.node.now_ms())

        def visible() -> float | None:
            frame = sink_frame(run.config, name, FLOW)
            stamp = datetime.fromtimestamp(ts / 1000, UTC)
            rows = frame[(frame["tag"] == tag) & (frame["ts"] == stamp)]
            return time.time() if len(rows) else None

        seen_at = wait_until(visible, 60, f"the sample of {tag} at {ts}", every_s=0.1)
        latency = seen_at - ts / 1000
        run.stop()
    assert latency <= LATENCY_BOUND_S, f"readable {latency:.2f} s after its node time"


@pytest.mark.slow
def test_events_the_node_discarded_under_a_slow_poller_are_reread_by_history(
    tmp_path: Path, sink: tuple[str, tuple[str, str] | None]
) -> None:
    name, pg = sink
    # The node's queue holds 1,000 events and 300 tags make 300 a second: a tail that
    # stops polling (SIGSTOP) until the node has discarded some is a poller slower than
    # the queue; let go (SIGCONT), its next poll hears of the discards.
    with live_run(tmp_path, name, pg, tags=300, profile="events-queue-small") as run:
        tail = run.start()
        run.wait_committed(2)
        tail.send_signal(signal.SIGSTOP)
        try:
            wait_until(
                lambda: any(s["discardedEvents"] for s in run.subscriptions()),
                60,
                "the node discarding events",
            )
        finally:
            tail.send_signal(signal.SIGCONT)
        commits = run.healed_and_stopped()
        assert sum(c["discarded"] for c in commits) > 0, "the tail heard of the discards"
        run.assert_exact()


@pytest.mark.slow
def test_a_sigkilled_tail_restarted_has_history_fill_what_it_missed(
    tmp_path: Path, sink: tuple[str, tuple[str, str] | None]
) -> None:
    name, pg = sink
    with live_run(tmp_path, name, pg) as run:
        first = run.start()
        run.wait_committed(3)
        first.kill()
        first.wait(timeout=30)
        assert len(run.subscriptions()) == 1, "the killed tail's subscription is left"
        run.start()
        run.wait_committed(2)
        assert len(run.subscriptions()) == 1, "the restart cancelled the stale one"
        run.healed_and_stopped()
        assert run.subscriptions() == [], "Ctrl-C cancelled the subscription"
        run.assert_exact()


@pytest.mark.slow
def test_a_subscription_cancelled_on_the_node_is_replaced_and_its_gap_reread(
    tmp_path: Path, sink: tuple[str, tuple[str, str] | None]
) -> None:
    name, pg = sink
    with live_run(tmp_path, name, pg) as run:
        run.start()
        run.wait_committed(3)
        (listed,) = run.subscriptions()
        run.node.subscriptions.cancel({"id": listed["id"]})
        wait_until(
            lambda: [s for s in run.subscriptions() if s["id"] != listed["id"]],
            60,
            "a new subscription",
        )
        run.healed_and_stopped()
        run.assert_exact()


@pytest.mark.slow
def test_a_remote_link_that_went_offline_and_drained_is_reread_by_history(
    tmp_path: Path, sink: tuple[str, tuple[str, str] | None]
) -> None:
    name, pg = sink
    # Two tags over the link (2 s late, as it delivers them) beside the local ones. The
    # link goes offline for 6 s, its samples kept on the remote side, then drains them
    # over 4 s, stamped in the past: the tail hears the remote tags' status events (off,
    # then on) and gives the outage to history, which holds it while the link drains.
    with live_run(tmp_path, name, pg, tags=24, linked=2, link_lag_ms=2_000, settle="5s") as run:
        run.start()
        run.wait_committed(3)
        went = run.node.now_ms()
        run.node.link.set_outage(went, offline_s=6, drain_s=4)
        run.healed_and_stopped()
        gaps = [_window(gap) for c in run.commits() for gap in c["gaps_opened"]]
        outage = Window.from_ms(went, went + 6_000)
        assert any(g.start <= outage.start and g.end >= outage.end for g in gaps), (
            f"a gap over the outage {outage}: {gaps}"
        )
        run.assert_exact()
