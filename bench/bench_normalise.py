"""Rows per second of `parse_history_answer`, from answer bytes to the typed Arrow table.

A realistic historyMany answer: 100 tags x 36,000 rows (10 h at 1 Hz), `[ts, value,
quality, extra]` rows, numbers with some nulls (invalidAsNull hides bad samples), and
about 10 % of the tags boolean or string. Prints the median of 7 runs with the cyclic GC
paused (what the normaliser does) and, for comparison, with it left running.

    .venv/bin/python bench/bench_normalise.py [--tags 100] [--rows 36000] [--runs 7]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable
from unittest import mock

import orjson

from connectors.normalise import parse_history_answer

START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def build_answer(tags: int, rows: int, seed: int = 7) -> bytes:
    """A historyMany answer as the node would send it."""
    rng = random.Random(seed)
    answer: dict[str, object] = {}
    for index in range(tags):
        path = f"/Plant A/Line {index // 10}/Sensor {index:03d}"
        kind = "bool" if index % 20 == 5 else "str" if index % 20 == 15 else "num"
        data: list[list[object]] = []
        level = rng.uniform(0, 100)
        for row in range(rows):
            ts = START_MS + row * 1000
            quality = 192 if rng.random() > 0.02 else 0
            value: object
            if quality != 192:
                value = None
            elif kind == "bool":
                value = rng.random() < 0.5
            elif kind == "str":
                value = rng.choice(("RUN", "STOP", "IDLE", "FAULT"))
            else:
                level += rng.gauss(0, 0.5)
                value = round(level, 3)
            data.append([ts, value, quality, 0])
        answer[path] = {
            "request": {
                "tag": path,
                "start": START_MS,
                "end": START_MS + rows * 1000,
                "options": {"mode": "raw", "invalidAsNull": True},
                "data": None,
            },
            "data": data,
        }
    return orjson.dumps(answer)


def median_seconds(run: Callable[[], object], runs: int) -> float:
    times: list[float] = []
    for _ in range(runs):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=100)
    parser.add_argument("--rows", type=int, default=36_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    body = build_answer(args.tags, args.rows)
    total = args.tags * args.rows
    page = parse_history_answer(body, "node-1")
    assert page.table.num_rows == total, page.table.num_rows
    print(f"answer: {len(body) / 1e6:.1f} MB, {args.tags} tags x {args.rows:,} rows = {total:,}")

    def parse() -> object:
        return parse_history_answer(body, "node-1")

    paused = median_seconds(parse, args.runs)
    print(f"GC paused (default): {paused:.3f} s median -> {total / paused:,.0f} rows/s")

    # The same code with the pause made a no-op: what the GC would cost per answer.
    with mock.patch.object(gc, "disable", return_value=None):
        gc.enable()
        running = median_seconds(parse, args.runs)
    print(f"GC running:          {running:.3f} s median -> {total / running:,.0f} rows/s")

    loads = median_seconds(lambda: orjson.loads(body), args.runs)
    print(f"orjson.loads alone:  {loads:.3f} s median (GC running)")


if __name__ == "__main__":
    main()
