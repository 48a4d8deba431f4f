"""Rows per second of `parse_history_answer`, from answer bytes to the typed Arrow table.

A realistic historyMany answer: 100 tags x 36,000 rows (10 h at 1 Hz), `[ts, value,
quality, extra]` rows, numbers with some nulls (invalidAsNull hides bad samples), and
about 10 % of the tags boolean or string (`--numeric-only`: none). Prints the median of 7
runs with the cyclic GC paused (what the normaliser does) and, for comparison, with it left
running, of the careful reading alone (orjson for the whole answer), and of orjson.loads.

`--compare REV` also times `parse_history_answer` of connectors/normalise/ as it was at
the git revision REV, alternating with the current one run by run (the machine is shared:
only a side-by-side ratio means anything), after checking both give the same table.

    .venv/bin/python bench/bench_normalise.py [--tags 100] [--rows 36000] [--runs 7]
        [--numeric-only] [--compare c01bdc2]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from unittest import mock

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.revisions import package_module_at  # noqa: E402
from connectors.normalise.history import (  # noqa: E402
    parse_history_answer,
    parse_history_answer_careful,
)

START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def build_answer(tags: int, rows: int, seed: int = 7, numeric_only: bool = False) -> bytes:
    """A historyMany answer as the node would send it."""
    rng = random.Random(seed)
    answer: dict[str, object] = {}
    for index in range(tags):
        path = f"/Plant A/Line {index // 10}/Sensor {index:03d}"
        kind = "bool" if index % 20 == 5 else "str" if index % 20 == 15 else "num"
        if numeric_only:
            kind = "num"
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


def module_at(revision: str) -> ModuleType:
    """The history normaliser as it was at a git revision (connectors/normalise.py, or
    connectors/normalise/history.py since it became a package), imported beside ours."""
    return package_module_at(revision, "connectors", "normalise.history", "normalise")


def compare(body: bytes, total: int, revision: str, runs: int) -> None:
    """The current and the revision's parse_history_answer, alternated run by run."""
    old = module_at(revision).parse_history_answer
    ours, theirs = parse_history_answer(body, "node-1"), old(body, "node-1")
    assert ours.table.equals(theirs.table)
    assert ours.table.schema == theirs.table.schema
    assert {tag: vars(stats) for tag, stats in ours.tags.items()} == {
        tag: vars(stats) for tag, stats in theirs.tags.items()
    }
    times: dict[str, list[tuple[float, float]]] = {revision: [], "current": []}
    for _ in range(runs):
        for name, parse in ((revision, old), ("current", parse_history_answer)):
            wall, cpu = time.perf_counter(), time.process_time()
            parse(body, "node-1")
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    medians = {}
    for name, pairs in times.items():
        wall = statistics.median(pair[0] for pair in pairs)
        cpu = statistics.median(pair[1] for pair in pairs)
        medians[name] = (wall, cpu)
        print(
            f"{name:>12}: {wall:.3f} s wall ({total / wall:,.0f} rows/s), "
            f"{cpu:.3f} s CPU ({total / cpu:,.0f} rows/s)"
        )
    print(
        f"current vs {revision}: x{medians[revision][0] / medians['current'][0]:.2f} wall, "
        f"x{medians[revision][1] / medians['current'][1]:.2f} CPU (medians of {runs})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=100)
    parser.add_argument("--rows", type=int, default=36_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--numeric-only", action="store_true", help="no boolean or string tag")
    parser.add_argument("--compare", metavar="REV", help="also time the normaliser at REV")
    args = parser.parse_args()

    body = build_answer(args.tags, args.rows, numeric_only=args.numeric_only)
    total = args.tags * args.rows
    page = parse_history_answer(body, "node-1")
    assert page.table.num_rows == total, page.table.num_rows
    print(f"answer: {len(body) / 1e6:.1f} MB, {args.tags} tags x {args.rows:,} rows = {total:,}")

    if args.compare:
        compare(body, total, args.compare, args.runs)
        return

    def parse() -> object:
        return parse_history_answer(body, "node-1")

    paused = median_seconds(parse, args.runs)
    print(f"GC paused (default): {paused:.3f} s median -> {total / paused:,.0f} rows/s")

    # The same code with the pause made a no-op: what the GC would cost per answer.
    with mock.patch.object(gc, "disable", return_value=None):
        gc.enable()
        running = median_seconds(parse, args.runs)
    print(f"GC running:          {running:.3f} s median -> {total / running:,.0f} rows/s")

    careful = median_seconds(lambda: parse_history_answer_careful(body, "node-1"), args.runs)
    print(f"careful reading:     {careful:.3f} s median -> {total / careful:,.0f} rows/s")

    loads = median_seconds(lambda: orjson.loads(body), args.runs)
    print(f"orjson.loads alone:  {loads:.3f} s median (GC running)")


if __name__ == "__main__":
    main()
