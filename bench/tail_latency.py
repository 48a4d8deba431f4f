"""The live tail's latency and throughput: from a sample's node time to its row being
readable in the sink, and whether the tail keeps up with a large node.

    .venv/bin/python bench/tail_latency.py                      # both parts
    .venv/bin/python bench/tail_latency.py --part latency --tags 1000 --seconds 45 --rounds 2
    .venv/bin/python bench/tail_latency.py --part keepup --keepup-tags 10000 --keepup-seconds 90

latency: a simulated node (`historian simulate`, its own process) samples N tags every
second; for each sink (lake, DuckDB, PostgreSQL: the contenders, in turn, `--rounds`
times, ABCABC) a tail of every tag (`pipelines.live.tail.tail_flow`, in this process)
commits into a fresh sink, and a reader in this process reads the dataset as any reader
does (`Sink.read`) back to back. A row's latency is the end of the first read that shows
it minus its sample's node time (an upper bound: the row may have been readable a read
earlier). DuckDB admits no reader from another process while the tail holds the file,
hence the reader here, for every contender alike. p50, p95 and max over every row whose
sample was stamped while the tail ran (after a warm-up), and the commits' own lag.

keepup: the same with `--keepup-tags` (10,000) into the lake, no reader: events per second
the node produced (tags x 1 Hz) against rows per second committed, the node's backlog
(`tag?cmd=subscriptions` `events`, pending) sampled every 2 s, and the events it discarded;
this process's resident memory (the tail runs in it) sampled alongside, its peak
(`ru_maxrss`), and the Parquet files the lake holds at the end by folder (the dataset's,
which the tail compacts, and its ledger's, `<dataset>.coverage`).
The machine's load is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.simulator import SimConfig, SimulatedNode
from pipelines.config.destinations import SinkSet
from pipelines.config.models import Config, load_config
from pipelines.core.memory import bound_memory
from pipelines.live.tail import TailCommit, tail_flow
from pipelines.orchestration.server import free_port
from tests.live_harness import HISTORIAN, MARK, local_tags, marked

PG_URL = os.environ.get(
    "HISTORIAN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SEED = 5
LIVE = {"commit_every": "1s", "poll_every": "250ms", "late_within": "20s"}
WARMUP_S = 5.0
EPOCH = pd.Timestamp(0, tz="UTC")


def sink_defs(name: str, folder: Path) -> dict[str, Any]:
    if name == "lake":
        return {"lake": {"type": "parquet", "url": str(folder / "lake")}}
    if name == "duck":
        return {"duck": {"type": "sql", "url": f"duckdb:///{folder / 'warehouse.duckdb'}"}}
    schema = f"tail_{uuid.uuid4().hex[:8]}"
    return {"pg": {"type": "sql", "url": PG_URL, "schema": schema}}


def write_flows(folder: Path, port: int, sink: str, tags: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "nodes": {"n": {"url": f"http://127.0.0.1:{port}"}},
        "sinks": sink_defs(sink, folder),
        "flows": {
            "f": {
                "node": "n",
                "tags": {"paths": tags},
                "mode": "raw",
                "window": "10m",
                "start": "-1m",
                "settle": "20s",
                "sinks": [sink],
                "live": LIVE,
            }
        },
    }
    path = folder / "flows.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


class Simulator:
    """`historian simulate` in its own process (so its work is not this one's GIL)."""

    def __init__(self, tags: int, mark: str) -> None:
        self.tags = local_tags(SimulatedNode(SimConfig(seed=SEED, tags=tags, period_ms=1000)))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, MARK: mark}
        self.process = subprocess.Popen(
            [
                *(HISTORIAN, "simulate", "--port", str(self.port), "--https-port", "0"),
                *("--tags", str(tags), "--period-ms", "1000", "--seed", str(SEED)),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while not self.answers():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit("the simulator did not start")
            time.sleep(0.2)

    def get(self, query: str) -> Any:
        with urllib.request.urlopen(f"{self.url}/{query}", timeout=5) as answer:
            return orjson.loads(answer.read())

    def answers(self) -> bool:
        try:
            self.get("system?cmd=status")
            return True
        except OSError:
            return False

    def pending(self) -> tuple[int, int]:
        """Events queued and discarded on the node's subscriptions."""
        listed = self.get("tag?cmd=subscriptions")
        return (
            sum(int(item.get("events") or 0) for item in listed),
            sum(int(item.get("discardedEvents") or 0) for item in listed),
        )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


@dataclass
class Tailed:
    commits: list[TailCommit] = field(default_factory=list)
    began: float = 0.0
    seconds: float = 0.0
    error: BaseException | None = None


def run_tail(cfg: Config, path: Path, stop: threading.Event, tailed: Tailed) -> threading.Thread:
    def body() -> None:
        tailed.began = time.time()
        try:
            tail_flow(cfg, "f", stop=stop, base=path.parent, on_commit=tailed.commits.append)
        except BaseException as exc:  # reported by the caller
            tailed.error = exc
        tailed.seconds = time.time() - tailed.began

    thread = threading.Thread(target=body, name="tail", daemon=True)
    thread.start()
    return thread


def read_latencies(
    cfg: Config, path: Path, sink: str, stop: threading.Event, since: float
) -> tuple[list[float], list[float]]:
    """Each new row's latency (end of the first read showing it minus its node time), for
    samples stamped after `since`; and each read's duration."""
    seen: set[tuple[str, int, int]] = set()
    latencies: list[float] = []
    reads: list[float] = []
    with SinkSet(cfg, path.parent) as sinks:
        reader: Any = sinks.get(sink)
        while not stop.is_set():
            began = time.time()
            try:
                frame = reader.read("f", "tag_history")
            except Exception:  # the dataset not created yet
                stop.wait(0.2)
                continue
            done = time.time()
            reads.append(done - began)
            stamps_ms = ((frame["ts"] - EPOCH) // pd.Timedelta(milliseconds=1)).tolist()
            for tag, ts, seq in zip(frame["tag"], stamps_ms, frame["seq"], strict=True):
                key = (tag, ts, int(seq))
                if key in seen:
                    continue
                seen.add(key)
                if ts / 1000 >= since:
                    latencies.append(done - ts / 1000)
            stop.wait(0.1)
    return latencies, reads


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_round(sim: Simulator, sink: str, seconds: float, root: Path) -> dict[str, Any]:
    folder = root / f"{sink}-{uuid.uuid4().hex[:6]}"
    path = write_flows(folder, sim.port, sink, sim.tags)
    cfg = load_config(path)
    stop, done_reading = threading.Event(), threading.Event()
    tailed = Tailed()
    thread = run_tail(cfg, path, stop, tailed)
    since = time.time() + WARMUP_S
    result: dict[str, Any] = {}

    def reader() -> None:
        while not tailed.commits and not done_reading.wait(0.05):
            pass  # the sink's tables are made by the tail's first commit
        result["latencies"], result["reads"] = read_latencies(cfg, path, sink, done_reading, since)

    reading = threading.Thread(target=reader, name="reader", daemon=True)
    reading.start()
    time.sleep(WARMUP_S + seconds)
    stop.set()
    thread.join(timeout=60)
    time.sleep(1.0)  # the last commit read back
    done_reading.set()
    reading.join(timeout=60)
    if tailed.error is not None:
        raise SystemExit(f"{sink}: the tail failed: {tailed.error}")
    latencies = result.get("latencies", [])
    lags = [c.lag_s for c in tailed.commits if c.lag_s is not None]
    return {
        "sink": sink,
        "rows": len(latencies),
        "p50": percentile(latencies, 0.50),
        "p95": percentile(latencies, 0.95),
        "max": max(latencies, default=float("nan")),
        "read_s": statistics.median(result.get("reads") or [float("nan")]),
        "commit_lag_p95": percentile(lags, 0.95),
        "commits": len(tailed.commits),
        "discarded": sum(c.discarded for c in tailed.commits),
    }


def latency_part(args: argparse.Namespace, mark: str, root: Path) -> list[dict[str, Any]]:
    sim = Simulator(args.tags, mark)
    results: list[dict[str, Any]] = []
    try:
        for round_ in range(args.rounds):
            for sink in args.sinks.split(","):
                outcome = latency_round(sim, sink, args.seconds, root)
                outcome["round"] = round_ + 1
                results.append(outcome)
                print(_latency_line(outcome), flush=True)
    finally:
        sim.stop()
    return results


def _latency_line(r: dict[str, Any]) -> str:
    return (
        f"round {r['round']} {r['sink']:5}: {r['rows']:>7,} rows  p50 {r['p50']:.2f} s  "
        f"p95 {r['p95']:.2f} s  max {r['max']:.2f} s  (read {r['read_s']:.2f} s, "
        f"{r['commits']} commits, commit lag p95 {r['commit_lag_p95']:.2f} s, "
        f"{r['discarded']} discarded)"
    )


def keepup_part(args: argparse.Namespace, mark: str, root: Path) -> dict[str, Any]:
    sim = Simulator(args.keepup_tags, mark)
    try:
        path = write_flows(root / "keepup", sim.port, "lake", sim.tags)
        cfg = load_config(path)
        stop = threading.Event()
        tailed = Tailed()
        thread = run_tail(cfg, path, stop, tailed)
        backlog: list[tuple[float, int, int]] = []
        rss: list[tuple[float, int]] = []
        ends = time.monotonic() + args.keepup_seconds
        while time.monotonic() < ends and thread.is_alive():
            try:
                pending, discarded = sim.pending()
                backlog.append((time.time() - tailed.began, pending, discarded))
            except OSError:
                pass
            rss.append((time.time() - tailed.began, resident_bytes()))
            time.sleep(2.0)
        stop.set()
        thread.join(timeout=120)
    finally:
        sim.stop()
    if tailed.error is not None:
        raise SystemExit(f"keepup: the tail failed: {tailed.error}")
    figures = _keepup_figures(args, tailed, backlog)
    _memory_figures(figures, rss, root / "keepup" / "lake")
    return figures


def resident_bytes() -> int:
    """This process's resident set now (Linux `/proc/self/statm`)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _memory_figures(figures: dict[str, Any], rss: list[tuple[float, int]], lake: Path) -> None:
    mib = 1024 * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    files = {top.name: sum(1 for _ in top.rglob("*.parquet")) for top in lake.iterdir()}
    figures.update(peak_rss=peak, rss=rss, files=files)
    later = [b for t, b in rss if t > 60]
    print(
        f"memory: peak RSS {peak / mib:,.0f} MiB; after the first minute "
        f"{min(later, default=0) / mib:,.0f}-{max(later, default=0) / mib:,.0f} MiB; "
        f"Parquet files in the lake at the end: {sum(files.values()):,} "
        f"({', '.join(f'{name} {count:,}' for name, count in sorted(files.items()))})",
        flush=True,
    )
    shown = ", ".join(f"{t:.0f}s:{b / mib:,.0f}" for t, b in rss[:: max(1, len(rss) // 12)])
    print(f"RSS (MiB) over time: {shown}", flush=True)


def _keepup_figures(
    args: argparse.Namespace, tailed: Tailed, backlog: list[tuple[float, int, int]]
) -> dict[str, Any]:
    commits = tailed.commits
    steady = [c for c in commits if (c.at.timestamp() - tailed.began) > 10]
    span = (steady[-1].at - steady[0].at).total_seconds() if len(steady) > 1 else float("nan")
    rows = sum(c.rows for c in steady[1:])
    events = sum(c.events for c in steady[1:])
    figures = {
        "tags": args.keepup_tags,
        "in_per_s": float(args.keepup_tags),
        "events_per_s": events / span if span else float("nan"),
        "rows_per_s": rows / span if span else float("nan"),
        "discarded": sum(c.discarded for c in commits),
        "gaps": sum(len(c.gaps_opened) for c in commits),
        "lag_p95": percentile([c.lag_s for c in steady if c.lag_s is not None], 0.95),
        "backlog": backlog,
    }
    print(
        f"keepup {args.keepup_tags:,} tags x 1 Hz: node {figures['in_per_s']:,.0f} events/s, "
        f"tail received {figures['events_per_s']:,.0f} events/s, committed "
        f"{figures['rows_per_s']:,.0f} rows/s; commit lag p95 {figures['lag_p95']:.1f} s; "
        f"{figures['discarded']:,} discarded, {figures['gaps']} gaps",
        flush=True,
    )
    shown = ", ".join(f"{t:.0f}s:{p:,}" for t, p, _ in backlog[:: max(1, len(backlog) // 12)])
    print(f"backlog (pending events on the node) over time: {shown}", flush=True)
    return figures


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["latency", "keepup", "both"], default="both")
    parser.add_argument("--tags", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sinks", default="lake,duck,pg")
    parser.add_argument("--keepup-tags", type=int, default=10_000)
    parser.add_argument("--keepup-seconds", type=float, default=90.0)
    args = parser.parse_args(argv)
    bound_memory()  # as the `historian` command does at start (its allocator settings)
    mark = uuid.uuid4().hex
    load_before = os.getloadavg()
    out(f"{datetime.now(UTC):%Y-%m-%d %H:%M}Z, {os.cpu_count()} cores, load {load_before}")
    with tempfile.TemporaryDirectory(prefix="tail-bench-") as folder:
        root = Path(folder)
        if args.part in ("latency", "both"):
            results = latency_part(args, mark, root)
            for sink in args.sinks.split(","):
                mine = [r for r in results if r["sink"] == sink]
                out(
                    f"{sink:5} median over {len(mine)} rounds: p50 "
                    f"{statistics.median(r['p50'] for r in mine):.2f} s, p95 "
                    f"{statistics.median(r['p95'] for r in mine):.2f} s, max "
                    f"{max(r['max'] for r in mine):.2f} s"
                )
        if args.part in ("keepup", "both"):
            keepup_part(args, mark, root)
    left = marked(mark)
    out(f"load after {os.getloadavg()}; processes left: {len(left)}")


if __name__ == "__main__":
    main()
