"""How fast the simulator serves history: samples (or rows) per second over loopback.

Every case is `tag?cmd=historyMany` for a batch of tags over one window, the request a
backfill sends (bench/compare.py: batches of 100 tags). The client only reads the bytes,
so the number is the node's (a lean socket client: httpx adds about a third to the time
of reading a replayed 10 MB answer). Median of `--repeat` timed requests after one
warm-up; the machine is shared, so compare numbers from one run only.

* raw            mixed periods (1 s .. 60 s), 100 tags x 1 h, and 1 tag x 24 h
* raw-1s         `period_ms=1000`: 100 tags x 1 h (the raw-1k-day workload's request)
* agg            `period_ms=60000`, 15-min `avg`: 100 tags x 1 week (agg-10k-year's request)
* agg-mixed      mixed periods, 15-min `avg`: 20 tags x 1 week (up to 604,800 samples a tag)
* replay         replay mode, raw-1s requests: served from memory after the first
* replay-full    replay mode, the whole raw-1k-day workload (1,000 tags x 1 day at 1 s,
                 240 requests): bytes held, process RSS, and the rate of the second pass
* compare        aggregated answers in-process, the former bucket loop (kept in
                 tests/connectors/test_simulator_aggregates.py) against the node, alternating

    .venv/bin/python bench/bench_simulator.py [--cases raw,raw-1s,agg,agg-mixed,replay]
    .venv/bin/python bench/bench_simulator.py --cases compare --repeat 3
    .venv/bin/python bench/bench_simulator.py --cases replay-full --repeat 1
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import orjson

from connectors.simulator import SimConfig, SimulatedNode, history, run_server
from connectors.simulator.tagtree import TagSpec

NOW = datetime(2026, 1, 1, tzinfo=UTC)
QUARTER_MS = 900_000


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _params(paths: list[str], start: datetime, end: datetime, aggregated: bool) -> dict[str, str]:
    params = {
        "cmd": "historyMany",
        "paths": orjson.dumps(paths).decode(),
        "start": _iso(start),
        "end": _iso(end),
    }
    if aggregated:
        params |= {
            "options.mode": "aggregated",
            "options.method": "avg",
            "options.interval": str(QUARTER_MS),
        }
    else:
        params |= {"options.mode": "raw", "options.limit": "1000000"}
    return params


def _count(body: bytes) -> int:
    return sum(len(entry["data"]) for entry in orjson.loads(body).values())


class LeanClient:
    """A keep-alive HTTP/1.1 GET over one socket that only reads the bytes.

    Reading a replayed 10 MB answer with httpx takes about a third longer, which would
    put the client's cost, not the node's, in a replayed answer's rate.
    """

    def __init__(self, base_url: str) -> None:
        url = httpx.URL(base_url)
        self._base = base_url
        self._sock = socket.create_connection((url.host, url.port or 80))

    def get(self, path: str, params: dict[str, str]) -> bytes:
        target = httpx.Request("GET", f"{self._base}{path}", params=params).url.raw_path
        self._sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: sim\r\n\r\n")
        head = bytearray()
        while b"\r\n\r\n" not in head:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the node closed the connection")
            head += chunk
        header, _, first = bytes(head).partition(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        fields = dict(line.split(b":", 1) for line in header.split(b"\r\n")[1:] if b":" in line)
        length = int(next(v for k, v in fields.items() if k.lower() == b"content-length"))
        body = bytearray(first)
        while len(body) < length:
            chunk = self._sock.recv(min(1 << 20, length - len(body)))
            if not chunk:
                raise ConnectionError("the node closed the connection")
            body += chunk
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {bytes(body[:200])!r}")
        return bytes(body)

    def close(self) -> None:
        self._sock.close()


def measure(client: LeanClient, params: dict[str, str], repeat: int) -> tuple[float, float, int]:
    """Median rows/s of `repeat` requests (after one warm-up) by wall time and by CPU time
    of this process (the node and the lean client), and the rows per answer."""
    rows = _count(client.get("/tag", params))
    rates, cpu_rates = [], []
    for _ in range(repeat):
        began, cpu = time.perf_counter(), time.process_time()
        client.get("/tag", params)
        rates.append(rows / (time.perf_counter() - began))
        cpu_rates.append(rows / max(time.process_time() - cpu, 1e-9))
    return statistics.median(rates), statistics.median(cpu_rates), rows


COMPRESS = False  # --replay-compress


def _node(tags: int, period_ms: int | None = None, replay: bool = False) -> SimulatedNode:
    config = SimConfig(
        seed=42,
        tags=max(tags, 10),
        raw_cap=1_000_000,
        period_ms=period_ms,
        cache_answers=replay,
        cache_compress=replay and COMPRESS,
    )
    node = SimulatedNode(config)
    node.set_clock(int(NOW.timestamp() * 1000))
    return node


def serve_case(
    label: str,
    node: SimulatedNode,
    paths: list[str],
    span: timedelta,
    aggregated: bool,
    repeat: int,
    unit: str = "samples",
) -> None:
    end = NOW - timedelta(days=1)
    params = _params(paths, end - span, end, aggregated)
    with run_server(node, https_port=None) as server:
        client = LeanClient(server.http_url)
        rate, cpu_rate, rows = measure(client, params, repeat)
        client.close()
    print(
        f"{label}: {rows:,} {unit}/answer, median {rate:,.0f} {unit}/s over {repeat} requests "
        f"({cpu_rate:,.0f} {unit} per CPU second)",
        flush=True,
    )


def case_raw(repeat: int) -> None:
    node = _node(100)
    paths = node.tag_paths()
    hour, day = timedelta(hours=1), timedelta(hours=24)
    serve_case("raw, mixed periods, 100 tags x 1 h", node, paths, hour, False, repeat)
    first = [next(p for p in paths if node.tag_type(p) == "number")]
    serve_case("raw, mixed periods, 1 tag x 24 h", node, first, day, False, repeat)


def case_raw_1s(repeat: int) -> None:
    node = _node(100, period_ms=1000)
    label = "raw-1s, 100 tags x 1 h at 1 s"
    serve_case(label, node, node.tag_paths(), timedelta(hours=1), False, repeat)


def case_agg(repeat: int) -> None:
    node = _node(100, period_ms=60_000)
    label = "agg, 15-min avg, 100 tags x 1 week at 60 s"
    serve_case(label, node, node.tag_paths(), timedelta(weeks=1), True, repeat, "rows")


def case_agg_mixed(repeat: int) -> None:
    node = _node(20)
    label = "agg-mixed, 15-min avg, 20 tags x 1 week, mixed periods"
    serve_case(label, node, node.tag_paths(), timedelta(weeks=1), True, repeat, "rows")


def case_replay(repeat: int) -> None:
    node = _node(100, period_ms=1000, replay=True)
    label = "replay, raw-1s 100 tags x 1 h, served from memory"
    serve_case(label, node, node.tag_paths(), timedelta(hours=1), False, repeat)
    answers, size = node.cache_stats()
    print(f"  replay cache: {answers} answer(s), {size / 1e6:,.1f} MB", flush=True)


def case_replay_full(repeat: int) -> None:
    """The raw-1k-day workload (batches of 100 tags, 1-hour windows) through replay mode."""
    node = _node(1000, period_ms=1000, replay=True)
    paths = node.tag_paths()
    end = NOW - timedelta(days=1)
    requests = [
        _params(paths[i : i + 100], end - timedelta(hours=h + 1), end - timedelta(hours=h), False)
        for h in range(24)
        for i in range(0, len(paths), 100)
    ]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with run_server(node, https_port=None) as server:
        client = LeanClient(server.http_url)
        for attempt in range(1 + repeat):
            began, samples, size = time.perf_counter(), 0, 0
            for params in requests:
                body = client.get("/tag", params)
                size += len(body)
                samples += body.count(b"],[") + 1
            elapsed = time.perf_counter() - began
            what = "first pass (render + keep)" if attempt == 0 else "replayed pass"
            print(
                f"replay-full, 1,000 tags x 1 day at 1 s, {what}: {len(requests)} answers, "
                f"~{samples:,} samples, {size / 1e9:.2f} GB in {elapsed:.1f} s: "
                f"{samples / elapsed:,.0f} samples/s, {size / elapsed / 1e6:,.0f} MB/s",
                flush=True,
            )
        client.close()
    answers, held = node.cache_stats()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"  replay cache: {answers} answers, {held / 1e9:.2f} GB of bytes; peak RSS "
        f"{rss:,.0f} MB (client and node in one process; {rss_before:,.0f} MB before)",
        flush=True,
    )


def case_compare(repeat: int) -> None:
    """Aggregated answers in-process (rows built and JSON-encoded), former loop vs now."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.connectors.test_simulator_aggregates import reference_aggregated

    def node_rows(spec: TagSpec, start: int, end: int, now: int) -> list[object]:
        return history.aggregate(
            spec,
            start,
            end,
            QUARTER_MS,
            "avg",
            history_start_ms=SimConfig().history_start_ms,
            visible_until_ms=now,
        )

    def former_rows(spec: TagSpec, start: int, end: int, now: int) -> list[object]:
        return list(reference_aggregated(spec, start, end, QUARTER_MS, "avg", (), now))

    now = int(NOW.timestamp() * 1000)
    end = now - 86_400_000
    cases = [
        ("60 s tags, 1 year", 60_000, 365),
        ("1 s tags, 2 weeks", 1000, 14),
    ]
    for label, period, days in cases:
        node = _node(10, period_ms=period)
        specs = [s for s in node.tree().specs if s.type == "number"][:3]
        start = end - days * 86_400_000
        timings: dict[str, list[float]] = {"former": [], "now": []}
        contenders: dict[str, Callable[..., list[object]]] = {
            "former": former_rows,
            "now": node_rows,
        }
        rows = 0
        for _ in range(repeat):
            for name, produce in contenders.items():
                began = time.process_time()
                rows = 0
                for spec in specs:
                    answer = produce(spec, start, end, now)
                    orjson.dumps(answer)
                    rows += len(answer)
                timings[name].append(time.process_time() - began)
        former, current = (statistics.median(timings[n]) for n in ("former", "now"))
        print(
            f"compare, 15-min avg, {len(specs)} number tags, {label} ({rows:,} rows): former "
            f"{rows / former:,.0f} rows/s ({former:.2f} s CPU), now {rows / current:,.0f} "
            f"rows/s ({current:.3f} s CPU): {former / current:,.0f}x",
            flush=True,
        )


CASES: dict[str, Callable[[int], None]] = {
    "raw": case_raw,
    "raw-1s": case_raw_1s,
    "agg": case_agg,
    "agg-mixed": case_agg_mixed,
    "replay": case_replay,
    "replay-full": case_replay_full,
    "compare": case_compare,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", default="raw,raw-1s,agg,agg-mixed,replay")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--replay-compress", action="store_true", help="replay cases: zstd")
    args = parser.parse_args()
    global COMPRESS
    COMPRESS = args.replay_compress
    for name in args.cases.split(","):
        if name not in CASES:
            parser.error(f"unknown case {name!r}: one of {', '.join(CASES)}")
        CASES[name](args.repeat)


if __name__ == "__main__":
    main()
