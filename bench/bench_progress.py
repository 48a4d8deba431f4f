"""What a run's bookkeeping costs on a lake: reading, folding and judging the progress of a
flow of many tags, as an hourly run does when it plans and when it ends.

A local lake holds `--markers` chunk markers of one hour each over `--tags` tags (one
marker per hourly run of a flow whose chunks of one window are written as one scope).
Timed, median of `--runs`:

* plan: a fresh process's `progress()` (reads the snapshot file) and the flow watermark;
* finish: the run's own new marker folded into that progress (`progress()` again in the
  same process, as `FlowRun.finish` does) and the watermark again.

    .venv/bin/python bench/bench_progress.py [--tags 10000] [--markers 24] [--runs 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from connectors.timewindow import Window
from pipelines.state import flow_watermark
from sinks.lake.state import LakeState, new_marker
from sinks.store.objects import LakeStore

T0 = datetime(2026, 10, 1, tzinfo=UTC)


def hour(index: int) -> Window:
    return Window(T0 + timedelta(hours=index), T0 + timedelta(hours=index + 1))


def mark(state: LakeState, members: list[str], index: int) -> None:
    marker = new_marker(
        flow="f", dataset="d", kind="tag_history", chunk_id=f"c{index}",
        window=hour(index), members=members, files=[], rows_fetched=1, rows_committed=1,
    )  # fmt: skip
    state.write_marker(marker)


def timed(step: Callable[[], object]) -> float:
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tags", type=int, default=10_000)
    parser.add_argument("--markers", type=int, default=24)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    members = [f"/Plant A/Line {i // 100}/Débit {i:05d}" for i in range(args.tags)]
    times: dict[str, list[float]] = {"plan": [], "finish": []}
    for _ in range(args.runs):
        root = tempfile.mkdtemp(prefix="bench-progress-")
        try:
            writer = LakeState(LakeStore(root))
            for index in range(args.markers):
                mark(writer, members, index)
            writer.progress("f")  # the snapshot the previous run saved
            run = LakeState(LakeStore(root))  # the next run's process

            def plan(state: LakeState = run) -> None:
                flow_watermark(state.progress("f"), members, T0)

            def finish(state: LakeState = run) -> None:
                flow_watermark(state.progress("f"), members, T0)

            times["plan"].append(timed(plan))
            mark(run, members, args.markers)  # the run's chunk, written (not timed)
            times["finish"].append(timed(finish))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{args.tags:,} tags, {args.markers} markers (median of {args.runs}):")
    for name, values in times.items():
        print(f"  {name:7} {statistics.median(values) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
