"""How fast the simulator renders raw history: samples/s of historyMany over loopback.

One request = `tag?cmd=historyMany` raw, 100 tags x 1 hour, answered by a fresh render
(replay cache off). The client only reads the bytes, so the number is the node's.
Prints the median of 5 timed requests (after one warm-up) and the median of 5 for
one tag x 24 h (long single-tag answers).

    .venv/bin/python bench/bench_simulator.py [--tags 100] [--hours 1] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

import httpx
import orjson

from connectors.simulator import SimConfig, SimulatedNode, run_server

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def measure(
    client: httpx.Client, url: str, paths: list[str], hours: float, repeat: int
) -> tuple[float, int]:
    """Median samples/s of `repeat` requests, and the samples per answer."""
    params = {
        "cmd": "historyMany",
        "paths": orjson.dumps(paths).decode(),
        "start": _iso(NOW - timedelta(hours=hours) - timedelta(days=1)),
        "end": _iso(NOW - timedelta(days=1)),
        "options.mode": "raw",
        "options.limit": "1000000",
    }
    warm = client.get(f"{url}/tag", params=params)
    warm.raise_for_status()
    samples = sum(len(entry["data"]) for entry in orjson.loads(warm.content).values())
    rates = []
    for _ in range(repeat):
        began = time.perf_counter()
        answer = client.get(f"{url}/tag", params=params)
        elapsed = time.perf_counter() - began
        answer.raise_for_status()
        rates.append(samples / elapsed)
    return statistics.median(rates), samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=100)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    node = SimulatedNode(SimConfig(seed=3, tags=max(args.tags, 10), raw_cap=1_000_000))
    node.set_clock(int(NOW.timestamp() * 1000))
    paths = node.tag_paths()[: args.tags]
    fastest = min(paths, key=lambda p: node.tag_type(p) != "number")
    with run_server(node, https_port=None) as server, httpx.Client(timeout=60) as client:
        rate, samples = measure(client, server.http_url, paths, args.hours, args.repeat)
        print(
            f"historyMany raw {len(paths)} tags x {args.hours:g} h: {samples} samples/answer, "
            f"median {rate:,.0f} samples/s over {args.repeat} requests"
        )
        rate, samples = measure(client, server.http_url, [fastest], 24.0, args.repeat)
        print(
            f"historyMany raw 1 tag x 24 h: {samples} samples/answer, "
            f"median {rate:,.0f} samples/s over {args.repeat} requests"
        )


if __name__ == "__main__":
    main()
