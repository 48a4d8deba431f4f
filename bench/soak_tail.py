"""Soak of the live tail: SIGKILLs at random points, forced discards, a link flap; then
the sink against a backfill of the same span, row for row.

    .venv/bin/python bench/soak_tail.py                       # 20 kills, lake and PostgreSQL
    .venv/bin/python bench/soak_tail.py --kills 5 --sinks lake --tags 100

A simulated node (in this process, on loopback; its subscriptions hold 1,000 events:
profile `events-queue-small`) samples every tag every second. `historian tail` (its own
process, as a user runs it) tails its local tags and two tags behind its remote link into
the sinks, and is SIGKILLed `--kills` times, each at a random point (seeded) of its run,
and started again at once. For a stretch of those runs the tail is a poller slower than the
node's queue: stopped (SIGSTOP) until the node has discarded events (more than 1,000
between two polls), then let go. Once, the link to the remote site goes offline and comes back (draining). Then a
last tail runs until history has re-read every gap the tails opened, and is stopped with
Ctrl-C (exit 130).

Compared with a backfill of the span the tails covered (from the end of their first
window to the start of their last, and up to the node's clock minus `settle`): rows
missing, extra and duplicated, first as the tails left the sink (their rows and their gap
re-reads), then after the flow's scheduled history run (`historian run`). Every process
started carries a marker: any alive at the end counts as left (walking /proc).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.live.unit import LIVE_CHUNK
from tests.fixtures import load, write_config
from tests.live_harness import (
    HISTORIAN,
    MARK,
    backfill_rows,
    exactness,
    local_tags,
    marked,
    sink_rows,
    start_tail,
)

FLOW = "f"
PG_URL = os.environ.get(
    "HISTORIAN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SETTLE = "150s"  # remote samples arrive 2 minutes late
LIVE = {"commit_every": "1s", "poll_every": "250ms", "late_within": SETTLE}


def write_config_of(folder: Path, url: str, tags: list[str], sinks: list[str]) -> Path:
    """flows.yaml: the tailed flow over the node at `url`, into `sinks`."""
    schema = f"soak_{uuid.uuid4().hex[:8]}"
    spec = {
        "node": "n",
        "tags": {"paths": tags},
        "mode": "raw",
        "window": "10m",
        # Fixed, before the soak: a relative start would move with every run, and a gap
        # older than it would never be re-read.
        "start": (datetime.now(UTC) - timedelta(minutes=2)).isoformat(),
        "settle": SETTLE,
        "live": LIVE,
    }
    pg = (PG_URL, schema) if "pg" in sinks else None
    return write_config(folder, node={"url": url}, flows={FLOW: spec}, pg=pg, sinks=sinks)


def commits(out: Path) -> list[dict[str, Any]]:
    found = []
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"progress"' in line:
            found.append(orjson.loads(line)["progress"])
    return found


def wait(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"soak: {what}: not within {timeout_s:.0f} s")
        time.sleep(0.2)
    return found


def kills(
    args: argparse.Namespace, node: SimulatedNode, config: Path, mark: str, out: Path
) -> dict[str, int]:
    """The tails, SIGKILLed `args.kills` times at random points; a stretch polls slowly,
    and the link flaps once."""
    rng = random.Random(args.seed)
    slow = set(range(args.kills // 3, args.kills // 3 + max(1, args.kills // 5)))
    flap_at = args.kills // 2
    discards_before = 0
    for kill in range(args.kills):
        before = len(commits(out))
        tail = start_tail(config, FLOW, mark=mark, out=out, json_logs=True)
        wait(
            lambda t=tail, n=before: len(commits(out)) > n or t.poll() is not None, 180, "a commit"
        )
        if kill == flap_at:
            node.link.set_outage(node.now_ms() + 1_000, offline_s=10, drain_s=5)
        if kill in slow:  # a poller slower than the queue: stopped until the node discards
            stopped_until_discards(node, tail)
        time.sleep(rng.uniform(0.5, 6.0))
        tail.send_signal(signal.SIGKILL)
        tail.wait(timeout=30)
        print(
            f"kill {kill + 1}/{args.kills} ({'slow poller' if kill in slow else 'normal'})",
            flush=True,
        )
        discards_before = sum(c["discarded"] for c in commits(out))
    return {"discarded": discards_before}


def stopped_until_discards(node: SimulatedNode, tail: subprocess.Popen[bytes]) -> None:
    """SIGSTOP the tail until the node has discarded events of its subscription, then
    SIGCONT: its next poll hears of them (`poll_every` cannot be slower than
    `commit_every`: the tail polls at every commit)."""
    tail.send_signal(signal.SIGSTOP)
    try:
        wait(
            lambda: any(
                item["discardedEvents"] for item in orjson.loads(node.subscriptions.list({}).body)
            ),
            300,
            "the node discarding events",
        )
    finally:
        tail.send_signal(signal.SIGCONT)


def healed(out: Path, since: int) -> bool:
    """A commit of the last tail, after every gap opened so far, with none pending."""
    mine = commits(out)[since:]
    opened = [i for i, c in enumerate(mine) if c["gaps_opened"]]
    last = opened[-1] if opened else -1
    return any(not c["gaps_pending"] for c in mine[last + 1 :]) and len(mine) > last + 3


def span_of(config: Path, sink: str) -> Window:
    cfg = load(config)
    with SinkSet(cfg, config.parent) as sinks:
        records = [
            r
            for r in sinks.get(sink).chunk_log(FLOW, limit=1_000_000)
            if r.chunk_id.startswith(LIVE_CHUNK)
        ]
    settled = datetime.now(UTC) - cfg.flows[FLOW].settle
    return Window(
        min(r.window.end for r in records), min(max(r.window.start for r in records), settled)
    )


def compare(config: Path, sinks: list[str], span: Window, folder: Path) -> dict[str, Any]:
    want = backfill_rows(config, FLOW, span, folder)
    return {sink: exactness(sink_rows(config, sink, FLOW, span), want) for sink in sinks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--sinks", default="lake,pg")
    parser.add_argument("--tags", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sinks = args.sinks.split(",")
    mark = uuid.uuid4().hex
    os.environ[MARK] = mark  # the backfills and the history run carry it too
    began = time.monotonic()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M}Z load {os.getloadavg()}", flush=True)
    node = SimulatedNode(
        SimConfig(seed=17, tags=args.tags, period_ms=1000, profile="events-queue-small")
    )
    tags = local_tags(node) + [s.path for s in node.tree().specs if s.remote_lag_ms][:2]
    with (
        tempfile.TemporaryDirectory(prefix="soak-tail-") as tmp,
        run_server(node, http_port=0, https_port=None) as server,
    ):
        folder = Path(tmp)
        config = write_config_of(folder, server.http_url, tags, sinks)
        out = folder / "tail.out"
        out.touch()
        try:
            seen = kills(args, node, config, mark, out)
            since = len(commits(out))
            last = start_tail(config, FLOW, mark=mark, out=out, json_logs=True)
            wait(lambda: healed(out, since), 900, "every gap re-read")
            last.send_signal(signal.SIGINT)
            code = last.wait(timeout=60)
        finally:  # an interrupted soak leaves no tail behind
            for pid in marked(mark):
                os.kill(pid, signal.SIGKILL)
        listed = orjson.loads(node.subscriptions.list({}).body)
        all_commits = commits(out)
        span = span_of(config, sinks[0])
        tails = compare(config, sinks, span, folder / "reference-tails")
        history = subprocess.run(
            [HISTORIAN, "run", FLOW, "--config", str(config), "--direct"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=900,
        )
        after = compare(config, sinks, span, folder / "reference-history")
    time.sleep(1.0)
    left = marked(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    discarded = sum(c["discarded"] for c in all_commits)
    gaps = sum(len(c["gaps_opened"]) for c in all_commits)
    print(
        f"span {span} ({(span.end - span.start).total_seconds():.0f} s), {len(tags)} tags",
        flush=True,
    )
    print(
        f"{args.kills} SIGKILLs, {discarded:,} events discarded by the node "
        f"({seen['discarded']:,} while killing), 1 link flap, {gaps} gaps opened; "
        f"last tail exit {code}, subscriptions left on the node {len(listed)}",
        flush=True,
    )
    for sink in sinks:
        print(
            f"{sink}: as the tails left it: {tails[sink]}; after the history run: {after[sink]}",
            flush=True,
        )
    print(
        f"history run exit {history.returncode}; processes left {len(left)}; {time.monotonic() - began:.0f} s; load {os.getloadavg()}",
        flush=True,
    )


if __name__ == "__main__":
    main()
