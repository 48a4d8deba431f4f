"""Side by side, one run: this pipeline vs dlt vs a hand-written baseline, same node, same data.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/compare.py --workload small --runs 3

The simulator runs in its own process in replay mode (answers rendered once, then served
from memory), so the node is not what is measured; a warm-up run of every contender fills
its cache. Each measured run is a fresh child process: wall time, CPU time (user+sys) and
peak RSS come from `os.wait4`. Contenders alternate within each round, so machine noise
hits them alike; the report gives medians and the ratio of this pipeline to each peer.
`--smoke` runs the smallest workload once and checks row counts (CI), never times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
HISTORIAN = str(Path(sys.executable).with_name("historian"))


@dataclass(frozen=True)
class Workload:
    name: str
    tags: int
    hours: int
    note: str


WORKLOADS = {
    "smoke": Workload("smoke", 20, 1, "CI smoke test: results only"),
    "small": Workload("small", 100, 6, "raw backfill, scaled down"),
    "raw-1k-day": Workload("raw-1k-day", 1000, 24, "raw backfill, 1,000 tags x 1 day"),
}


@dataclass
class Measure:
    contender: str
    target: str
    rows: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s if self.wall_s else 0.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_simulator(tags: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [
            HISTORIAN,
            "simulate",
            "--port",
            str(port),
            "--https-port",
            "0",
            "--tags",
            str(tags),
            "--seed",
            "42",
            "--replay",
            "--raw-cap",
            "1000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/system?cmd=status", timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("simulator did not start")


def measured(
    command: list[str], env: dict[str, str] | None = None
) -> tuple[str, float, float, float]:
    """Run a child; return its stdout, wall seconds, CPU seconds and peak RSS in MB.

    The child runs under GNU time: a process forked from this (large) parent inherits the
    parent's high-water mark, so the child's own `ru_maxrss` would report ours.
    """
    began = time.perf_counter()
    wrapper = ["/usr/bin/time", "-f", "__maxrss_kb=%M"] if Path("/usr/bin/time").exists() else []
    process = subprocess.Popen(
        [*wrapper, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None
    assert process.stderr is not None
    out = process.stdout.read()
    err = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - began
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{command[:3]} failed: {err.decode(errors='replace')[-2000:]}")
    peak_kb = 0 if wrapper else usage.ru_maxrss  # without GNU time: may include ours
    for line in err.decode(errors="replace").splitlines():
        if line.startswith("__maxrss_kb="):
            peak_kb = int(line.split("=", 1)[1])
    return out.decode(), wall, usage.ru_utime + usage.ru_stime, peak_kb / 1024


def run_contender(
    name: str,
    target: str,
    url: str,
    tags_file: Path,
    start: str,
    end: str,
    pg_url: str,
    *,
    extra: list[str] | None = None,
) -> Measure:
    work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        if target == "postgres":
            _create_schema(pg_url, schema)
        if name == "cli":
            config = _cli_config(work, url, tags_file, start, target, pg_url, schema)
            out, wall, cpu, rss = measured(
                [HISTORIAN, "backfill", "bench", "--start", start, "--end", end, "-c", str(config)]
            )
            rows = _rows_from_sink(config)
        else:
            out, wall, cpu, rss = measured(
                [
                    PYTHON,
                    str(HERE / "contenders.py"),
                    name,
                    "--url",
                    url,
                    "--tags-file",
                    str(tags_file),
                    "--start",
                    start,
                    "--end",
                    end,
                    "--target",
                    target,
                    "--out",
                    str(work),
                    "--pg-url",
                    pg_url,
                    "--pg-schema",
                    schema,
                    *(extra or []),
                ]
            )
            rows = json.loads(out.strip().splitlines()[-1])["rows"]
        return Measure(name, target, rows, wall, cpu, rss)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if target == "postgres":
            _drop_schema(pg_url, schema)


def _cli_config(
    work: Path, url: str, tags_file: Path, start: str, target: str, pg_url: str, schema: str
) -> Path:
    import yaml

    tags = json.loads(tags_file.read_text(encoding="utf-8"))
    sink = (
        {"type": "parquet", "url": "lake"}
        if target == "parquet"
        else {"type": "sql", "url": pg_url, "schema": schema}
    )
    document = {
        "nodes": {"n": {"url": url, "max_connections": 2}},
        "sinks": {"s": sink},
        "flows": {
            "bench": {
                "node": "n",
                "tags": {"paths": tags},
                "mode": "raw",
                "window": "1h",
                "batch": 100,
                "start": start,
                "settle": "0s",
                "metadata": False,
                "sinks": ["s"],
            }
        },
    }
    path = work / "flows.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    return path


def _rows_from_sink(config: Path) -> int:
    """Count rows without loading them (keeps this parent small)."""
    import yaml

    document = yaml.safe_load(config.read_text(encoding="utf-8"))
    sink = document["sinks"]["s"]
    if sink["type"] == "parquet":
        import pyarrow.dataset as ds

        return int(ds.dataset(config.parent / sink["url"] / "bench", format="parquet").count_rows())
    import sqlalchemy as sa

    engine = sa.create_engine(sink["url"])
    with engine.connect() as conn:
        count = conn.execute(sa.text(f'select count(*) from "{sink["schema"]}"."bench"')).scalar()
    engine.dispose()
    return int(count or 0)


def _create_schema(pg_url: str, schema: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'create schema "{schema}"'))
    engine.dispose()


def _drop_schema(pg_url: str, schema: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'drop schema if exists "{schema}" cascade'))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="small")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--targets", default="parquet,postgres")
    parser.add_argument("--contenders", default="pipeline,cli,dlt,baseline")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "HISTORIAN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument(
        "--smoke", action="store_true", help="one run, check rows, no timing claims"
    )
    parser.add_argument("--json", type=Path, help="also write the measures here")
    args = parser.parse_args()
    workload = WORKLOADS["smoke" if args.smoke else args.workload]
    runs = 1 if args.smoke else args.runs
    contenders = args.contenders.split(",")
    targets = args.targets.split(",")

    simulator, url = start_simulator(workload.tags)
    try:
        from datetime import UTC, datetime, timedelta

        end = datetime(2026, 11, 1, tzinfo=UTC)
        start = end - timedelta(hours=workload.hours)
        start_s, end_s = start.strftime("%Y-%m-%dT%H:%M:%SZ"), end.strftime("%Y-%m-%dT%H:%M:%SZ")
        tags = httpx.get(
            f"{url}/tag?cmd=details&path=%2F&options.recurrent=true", timeout=60
        ).json()
        paths = sorted(entry["fullPath"] for entry in tags["tags"].values())[: workload.tags]
        tags_file = Path(tempfile.mkstemp(suffix=".json")[1])
        tags_file.write_text(json.dumps(paths), encoding="utf-8")
        results: list[Measure] = []
        for target in targets:
            for name in contenders:  # warm-up: fills the simulator's replay cache
                if not args.smoke:
                    run_contender(name, target, url, tags_file, start_s, end_s, args.pg_url)
            for _ in range(runs):
                for name in contenders:
                    measure = run_contender(
                        name, target, url, tags_file, start_s, end_s, args.pg_url
                    )
                    results.append(measure)
                    print(
                        f"  {target:8} {name:9} {measure.rows:>11,} rows {measure.wall_s:7.2f} s "
                        f"{measure.rows_per_s:>11,.0f} rows/s cpu {measure.cpu_s:6.2f} s "
                        f"rss {measure.peak_rss_mb:6.0f} MB",
                        flush=True,
                    )
        report(workload, results, contenders, targets)
        if args.json:
            args.json.write_text(json.dumps([m.__dict__ for m in results], indent=2))
    finally:
        simulator.terminate()
        simulator.wait(timeout=10)


def report(
    workload: Workload, results: list[Measure], contenders: list[str], targets: list[str]
) -> None:
    print(f"\n## {workload.name}: {workload.note} ({workload.tags} tags x {workload.hours} h)\n")
    print("| target | contender | rows | wall s | rows/s | CPU s | peak RSS MB | pipeline / this |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for target in targets:
        medians: dict[str, float] = {}
        for name in contenders:
            runs = [m for m in results if m.contender == name and m.target == target]
            if not runs:
                continue
            rows = {m.rows for m in runs}
            if len(rows) != 1:
                raise SystemExit(f"{name} {target}: row counts differ between runs: {rows}")
            medians[name] = statistics.median(m.rows_per_s for m in runs)
        for name in contenders:
            runs = [m for m in results if m.contender == name and m.target == target]
            if not runs:
                continue
            ratio = medians.get("pipeline", 0) / medians[name] if medians[name] else 0
            print(
                f"| {target} | {name} | {runs[0].rows:,} | "
                f"{statistics.median(m.wall_s for m in runs):.2f} | {medians[name]:,.0f} | "
                f"{statistics.median(m.cpu_s for m in runs):.2f} | "
                f"{statistics.median(m.peak_rss_mb for m in runs):.0f} | {ratio:.1f}x |"
            )
    counts = {(m.contender, m.target): m.rows for m in results}
    print("\nrows per contender:", counts)


if __name__ == "__main__":
    main()
