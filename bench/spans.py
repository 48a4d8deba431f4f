"""Peak memory and CPU against the span of a raw backfill: does memory stay flat?

    .venv/bin/python bench/spans.py --runs 3 --contenders pipeline,pipeline@main
    .venv/bin/python bench/spans.py --spans 12h --contenders cli-prefect,cli-prefect@main

One replay-mode simulator (1,000 tags sampled every second) in its own process; the
spans are raw backfills of its first 100 tags over 1 h, 12 h, 48 h and a week, and of all
1,000 tags over a day, 1-hour windows, into a Parquet lake. One contender runs each
span once unmeasured (the node renders its answers), then each `--runs` times, alternating:
wall, CPU (user + system), the system share of it and peak RSS of the extracting
process (GNU time). `pipeline` is `run_flow` in process (bench/contenders.py);
`cli-prefect` is `historian backfill --prefect` (a flow run on Prefect's ephemeral
server); `NAME@REV` runs that contender on the package as it was at git revision REV.
The unmeasured run is `--warmup`'s (the cheap `pipeline` by default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import (
    HERE,
    HISTORIAN,
    PYTHON,
    Context,
    Workload,
    _cli_config,
    _rows_from_sink,
    checkout,
    measured_usage,
    start_simulator,
)

HOUR = timedelta(hours=1)
SPANS = {
    "1h": (100, HOUR),
    "12h": (100, 12 * HOUR),
    "48h": (100, 48 * HOUR),
    "1w": (100, 168 * HOUR),
    "1k-1d": (1000, 24 * HOUR),
}


@dataclass
class Run:
    contender: str
    span: str
    rows: int
    wall_s: float
    user_s: float
    system_s: float
    peak_rss_mb: float

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.system_s


def run(contender: str, span: str, ctx: Context, paths: list[str]) -> Run:
    name, _, revision = contender.partition("@")
    tags, length = SPANS[span]
    workload = Workload(span, tags, length, "", period_ms=1000)
    work = workload.work()
    env = {**os.environ}
    for setting in ("PREFECT_API_URL", "PREFECT_PROFILE"):
        env.pop(setting, None)
    if revision:  # the package of that checkout shadows this tree's
        env["PYTHONPATH"] = str(checkout(revision))
    folder = Path(tempfile.mkdtemp(prefix="bench-spans-"))
    try:
        tags_file = folder / "tags.json"
        tags_file.write_text(json.dumps(paths[:tags]), encoding="utf-8")
        here = Context(ctx.url, tags_file, ctx.pg_url)
        if name == "pipeline":
            command = [
                PYTHON,
                str(HERE / "contenders.py"),
                "pipeline",
                *("--url", ctx.url, "--tags-file", str(tags_file)),
                *("--work", work.to_json(), "--target", "parquet", "--out", str(folder)),
            ]
            out, *usage = measured_usage(command, env)
            rows = int(json.loads(out.strip().splitlines()[-1])["rows"])
        else:
            config = _cli_config(folder, work, here, "parquet", "unused")
            command = [
                HISTORIAN,
                *("backfill", "bench", "--start", work.start, "--end", work.end),
                *("-c", str(config), "--prefect" if name == "cli-prefect" else "--direct"),
            ]
            _, *usage = measured_usage(command, env)
            rows = _rows_from_sink(config, work)
        wall, user, system, rss = usage
        return Run(contender, span, rows, wall, user, system, rss)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(runs: list[Run], contenders: list[str], spans: list[str]) -> None:
    print(
        "\n| span | rows | contender | wall s | CPU s | system % of CPU | peak RSS MB (min-max) |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    for span in spans:
        for contender in contenders:
            mine = [r for r in runs if r.contender == contender and r.span == span]
            if not mine:
                continue
            if len({r.rows for r in mine}) != 1:
                raise SystemExit(f"{contender} {span}: row counts differ: {[r.rows for r in mine]}")
            rss = [r.peak_rss_mb for r in mine]
            share = statistics.median(100 * r.system_s / r.cpu_s for r in mine)
            print(
                f"| {span} | {mine[0].rows:,} | {contender} | "
                f"{statistics.median(r.wall_s for r in mine):.2f} | "
                f"{statistics.median(r.cpu_s for r in mine):.2f} | {share:.0f} | "
                f"{statistics.median(rss):.0f} ({min(rss):.0f}-{max(rss):.0f}) |"
            )
    rows = {(r.span, r.contender): r.rows for r in runs}
    for span in spans:
        counts = {rows[key] for key in rows if key[0] == span}
        if len(counts) > 1:
            raise SystemExit(f"{span}: contenders wrote different row counts: {rows}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", default=",".join(SPANS))
    parser.add_argument("--contenders", default="pipeline,pipeline@main")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--warmup", default="pipeline", help="the contender whose unmeasured run fills the node"
    )
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args()
    spans = args.spans.split(",")
    contenders = args.contenders.split(",")
    tags = max(SPANS[span][0] for span in spans)
    simulator, url = start_simulator(Workload("spans", tags, HOUR, "", period_ms=1000))
    runs: list[Run] = []
    try:
        answer = httpx.get(f"{url}/tag?cmd=details&path=%2F&options.recurrent=true", timeout=120)
        paths = sorted(entry["fullPath"] for entry in answer.json()["tags"].values())
        ctx = Context(url, Path(), "")
        for span in spans:
            run(args.warmup, span, ctx, paths)  # the node renders the span's answers
            for _ in range(args.runs):
                for contender in contenders:
                    measure = run(contender, span, ctx, paths)
                    runs.append(measure)
                    print(
                        f"  {span:6} {contender:22} {measure.rows:>11,} rows "
                        f"{measure.wall_s:7.2f} s cpu {measure.cpu_s:6.2f} s "
                        f"(system {measure.system_s:5.2f}) rss {measure.peak_rss_mb:5.0f} MB",
                        flush=True,
                    )
        report(runs, contenders, spans)
        if args.json:
            args.json.write_text(json.dumps([r.__dict__ for r in runs], indent=2))
    finally:
        simulator.terminate()
        simulator.wait(timeout=30)
        for folder in _checkouts():
            shutil.rmtree(folder, ignore_errors=True)


def _checkouts() -> list[Path]:
    from compare import _CHECKOUTS

    return list(_CHECKOUTS.values())


if __name__ == "__main__":
    main()
