"""Side by side, one run: this pipeline vs dlt vs a hand-written baseline, same node, same data.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/compare.py --workload raw-small --runs 3
    .venv/bin/python bench/compare.py --list          # every workload

The simulator runs in its own process in replay mode (answers rendered once, then served
from memory), so the node is not what is measured; a warm-up run of every contender fills
its cache. Each measured run is a fresh child process: wall time, CPU time (user+sys) and
peak RSS (GNU time) of that process, start-up and imports included. Contenders alternate
within each round, so machine noise hits them alike; the report gives medians and the
ratio of this pipeline to each peer. The `node` contender only downloads the answers: its
line is the simulator's own serving rate on the same requests. `cli` is `historian` as a
one-off command, as a user types it (in this process since issue 29: no Prefect server is
configured); `cli-prefect` is the same command with `--prefect` (a flow run on Prefect's
ephemeral server, the default before issue 29); `cli-served` is the same command against a
long-lived Prefect server (PREFECT_API_URL), as scheduled runs have; `cli-direct` is the
same command with `--direct` (no Prefect), so that what Prefect adds reads apart from
what the command line adds (its imports, reading flows.yaml).

`pipeline@REV` is the `pipeline` contender with the package as it was at git revision
REV (a checkout in a temporary folder, first on the child's PYTHONPATH): a change
measured against its parent in the same alternation.

Incremental workloads first run each contender once over the span before (not measured,
same output directory or schema), then measure the run that continues from there, as an
hourly schedule does.

`--smoke` runs the smallest workload once and checks row counts (CI), never times.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from contenders import Work, flow_document, pipeline_sink  # noqa: E402

from pipelines.orchestration.children import die_with_parent  # noqa: E402
from pipelines.orchestration.server import free_port, local_server  # noqa: E402

PYTHON = sys.executable
HISTORIAN = str(Path(sys.executable).with_name("historian"))
# `cli` is the command as typed (in process); `cli-prefect` starts Prefect's ephemeral
# server itself (--prefect); `cli-served` talks to a long-lived server (PREFECT_API_URL),
# as scheduled runs under `historian serve` or a deployment do; `cli-direct` runs the
# command with --direct, without Prefect.
CLI_CONTENDERS = ("cli", "cli-prefect", "cli-served", "cli-direct")
# Every workload ends here (a Thursday: on the grid of 1-day and 7-day windows alike).
END = datetime(2026, 10, 29, tzinfo=UTC)


@dataclass(frozen=True)
class Workload:
    name: str
    tags: int
    span: timedelta
    note: str
    mode: str = "raw"
    method: str | None = None
    interval: timedelta | None = None
    window: timedelta = timedelta(hours=1)
    period_ms: int | None = None  # the simulator samples every tag at this period
    incremental: bool = False
    replay_limit_mb: int | None = None  # the simulator's replay cache, when past its default

    def work(self) -> Work:
        """The measured range; an incremental flow starts where `prime` does."""
        start = END - self.span
        return self._range(start, END, flow_start=start - self.span if self.incremental else None)

    def prime(self) -> Work:
        """The span before, run once unmeasured by an incremental workload."""
        start = END - self.span
        return self._range(start - self.span, start)

    def _range(self, start: datetime, end: datetime, flow_start: datetime | None = None) -> Work:
        return Work(
            start=_iso(start),
            end=_iso(end),
            mode=self.mode,
            method=self.method,
            interval_ms=int(self.interval.total_seconds() * 1000) if self.interval else None,
            window_s=int(self.window.total_seconds()),
            flow_start=_iso(flow_start) if flow_start else None,
        )

    def describe(self) -> str:
        what = f"{self.tags:,} tags x {_span(self.span)}"
        if self.mode == "aggregated" and self.interval:
            what += f" at {_span(self.interval)} {self.method}"
        elif self.period_ms:
            what += f" at {self.period_ms / 1000:g} s"
        else:
            what += " (mixed 1-60 s periods)"
        return what + (", incremental" if self.incremental else "")


HOUR, DAY, WEEK = timedelta(hours=1), timedelta(days=1), timedelta(weeks=1)
QUARTER = timedelta(minutes=15)
WORKLOADS = {
    "smoke": Workload("smoke", 20, HOUR, "CI smoke test: results only"),
    "small": Workload("small", 100, 6 * HOUR, "raw backfill, the 2026-11-22 comparison"),
    "raw-small": Workload("raw-small", 100, 6 * HOUR, "raw backfill, scaled down", period_ms=1000),
    "raw-4m": Workload(
        "raw-4m",
        200,
        6 * HOUR,
        "raw backfill, ~4 M rows (peak RSS through Prefect)",
        period_ms=1000,
    ),
    "raw-1k-day": Workload(
        "raw-1k-day", 1000, DAY, "raw backfill, full size (86 M samples)", period_ms=1000
    ),
    "agg-small": Workload(
        "agg-small",
        1000,
        4 * WEEK,
        "aggregated backfill, scaled down",
        mode="aggregated",
        method="avg",
        interval=QUARTER,
        window=WEEK,
        period_ms=60_000,
    ),
    "agg-10k-month": Workload(
        "agg-10k-month",
        10_000,
        4 * WEEK,
        "aggregated backfill, 10,000 tags over one month of the year",
        mode="aggregated",
        method="avg",
        interval=QUARTER,
        window=WEEK,
        period_ms=60_000,
    ),
    "agg-10k-year": Workload(
        "agg-10k-year",
        10_000,
        52 * WEEK,
        "aggregated backfill, full size (349 M rows)",
        mode="aggregated",
        method="avg",
        interval=QUARTER,
        window=WEEK,
        period_ms=60_000,
        replay_limit_mb=14_000,  # ~10.5 GB of answers, held uncompressed: the node stays idle
    ),
    # Small chunks: one run's rows (720,000) in windows of 1, 5 and 30 minutes, so a chunk's
    # fixed cost (its request, parse, write and commit) reads apart from the cost per row.
    **{
        f"chunks-{minutes}m": Workload(
            f"chunks-{minutes}m",
            100,
            2 * HOUR,
            f"raw backfill in {minutes}-minute windows ({120 // minutes} chunks)",
            window=timedelta(minutes=minutes),
            period_ms=1000,
        )
        for minutes in (1, 5, 30)
    },
    "chunks-1m-day": Workload(
        "chunks-1m-day",
        100,
        DAY,
        "raw backfill of a day in 1-minute windows (1,440 chunks in one partition)",
        window=timedelta(minutes=1),
        period_ms=1000,
    ),
    # Incremental hourly runs: the span before is primed, unmeasured (fixed costs).
    **{
        name: Workload(
            name,
            tags,
            HOUR,
            note,
            mode="aggregated",
            method="avg",
            interval=QUARTER,
            window=HOUR,
            period_ms=60_000,
            incremental=True,
        )
        for name, tags, note in (
            ("incr-1k-hour", 1000, "incremental hourly run of 1,000 tags (fixed costs)"),
            ("incr-10k-hour", 10_000, "incremental hourly run (fixed costs)"),
        )
    },
}


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, plural, size in (
        ("week", "weeks", 604_800),
        ("day", "days", 86_400),
        ("h", "h", 3600),
        ("min", "min", 60),
    ):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit if count == 1 else plural}"
    return f"{seconds} s"


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


def start_simulator(workload: Workload) -> tuple[subprocess.Popen[bytes], str]:
    options = ["--period-ms", str(workload.period_ms)] if workload.period_ms else []
    if workload.replay_limit_mb:
        options += ["--replay-limit-mb", str(workload.replay_limit_mb)]
    tags = str(workload.tags)
    return simulator("--tags", tags, "--seed", "42", "--replay", "--raw-cap", "1000000", *options)


def simulator(*options: str) -> tuple[subprocess.Popen[bytes], str]:
    """`historian simulate` with `options` on a free loopback port, once it answers: the
    process and the node's URL."""
    port = free_port()
    process = subprocess.Popen(
        [HISTORIAN, "simulate", "--port", str(port), "--https-port", "0", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent(),  # a benchmark killed leaves no node behind
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
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
    """Run a child; return its stdout, wall seconds, CPU seconds and peak RSS in MB."""
    stdout, wall, user_s, system_s, peak_mb = measured_usage(command, env)
    return stdout, wall, user_s + system_s, peak_mb


def measured_usage(
    command: list[str], env: dict[str, str] | None = None
) -> tuple[str, float, float, float, float]:
    """Run a child; return its stdout, wall seconds, user and system CPU seconds and peak
    RSS in MB.

    The child runs under GNU time, which reports its own CPU time and high-water mark: a
    process forked from this (large) parent inherits the parent's high-water mark, so
    `ru_maxrss` of the children would report ours.
    """
    if not Path("/usr/bin/time").exists():
        raise SystemExit("bench needs GNU time (/usr/bin/time): apt-get install time")
    compiled(HERE.parent)
    began = time.perf_counter()
    process = subprocess.run(
        ["/usr/bin/time", "-f", "__usage %M %U %S", *command],
        capture_output=True,
        check=False,
        env=env,
    )
    wall = time.perf_counter() - began
    err = process.stderr.decode(errors="replace")
    if process.returncode != 0:
        raise SystemExit(f"{command[:3]} failed: {err[-2000:]}")
    usage = [line for line in err.splitlines() if line.startswith("__usage ")][-1].split()
    peak_kb, user_s, system_s = int(usage[1]), float(usage[2]), float(usage[3])
    return process.stdout.decode(), wall, user_s, system_s, peak_kb / 1024


@dataclass(frozen=True)
class Context:
    url: str
    tags_file: Path
    pg_url: str
    prefect_api: str | None = None  # the long-lived server of the `cli-served` contender


def run_contender(name: str, target: str, workload: Workload, ctx: Context) -> Measure:
    work_dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    work = workload.work()
    try:
        if target == "postgres":
            _create_schema(ctx.pg_url, schema)
        if workload.incremental:  # the run before, as the previous hour's schedule left it
            _invoke(name, target, workload.prime(), ctx, work_dir, schema, incremental=False)
        out, wall, cpu, rss = _invoke(
            name, target, work, ctx, work_dir, schema, incremental=workload.incremental
        )
        if name in CLI_CONTENDERS:
            rows = _rows_from_sink(work_dir / "flows.yaml", work)
        else:
            rows = json.loads(out.strip().splitlines()[-1])["rows"]
        return Measure(name, target, rows, wall, cpu, rss)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
        if target == "postgres":
            _drop_schema(ctx.pg_url, schema)


def _invoke(
    name: str,
    target: str,
    work: Work,
    ctx: Context,
    work_dir: Path,
    schema: str,
    *,
    incremental: bool,
) -> tuple[str, float, float, float]:
    if name in CLI_CONTENDERS:
        config = _cli_config(work_dir, work, ctx, target, schema)
        if incremental:
            command = [HISTORIAN, "run", "bench", "--end", work.end, "-c", str(config)]
        else:
            command = [
                HISTORIAN,
                "backfill",
                "bench",
                "--start",
                work.start,
                "--end",
                work.end,
                "-c",
                str(config),
            ]
        if name == "cli-direct":
            command.append("--direct")
        if name == "cli-prefect":
            command.append("--prefect")
        env = {**os.environ}
        for setting in ("PREFECT_API_URL", "PREFECT_PROFILE"):  # `cli`: no server configured
            env.pop(setting, None)
        if name == "cli-served":
            assert ctx.prefect_api is not None
            env = {**os.environ, "PREFECT_API_URL": ctx.prefect_api}
        return measured(command, env)
    env = None
    if "@" in name:  # pipeline@REV: the package of that checkout shadows the installed one
        name, revision = name.split("@", 1)
        env = {**os.environ, "PYTHONPATH": str(checkout(revision))}
    return measured(
        [
            PYTHON,
            str(HERE / "contenders.py"),
            name,
            "--url",
            ctx.url,
            "--tags-file",
            str(ctx.tags_file),
            "--work",
            work.to_json(),
            "--target",
            target,
            "--out",
            str(work_dir),
            "--pg-url",
            ctx.pg_url,
            "--pg-schema",
            schema,
            *(["--incremental"] if incremental else []),
        ],
        env,
    )


_CHECKOUTS: dict[str, Path] = {}
_COMPILED: set[Path] = set()


def compiled(root: Path) -> None:
    """Byte-compile the project's packages under `root` once, as an install does: a
    child never writes its bytecode where PYTHONDONTWRITEBYTECODE is set (this sandbox
    sets it), and would then compile every module of the tree from source on every run,
    charging a larger tree for its size rather than for what it does."""
    if root in _COMPILED:
        return
    for package in ("connectors", "pipelines", "sinks"):
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=1)
    _COMPILED.add(root)


def checkout(revision: str) -> Path:
    """The repository's tree at `revision` in a temporary folder (once per run)."""
    if revision not in _CHECKOUTS:
        folder = Path(tempfile.mkdtemp(prefix="bench-rev-"))
        archive = subprocess.run(
            ["git", "archive", revision], cwd=HERE.parent, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        compiled(folder)
        _CHECKOUTS[revision] = folder
    return _CHECKOUTS[revision]


def _cli_config(work_dir: Path, work: Work, ctx: Context, target: str, schema: str) -> Path:
    import yaml

    tags = json.loads(ctx.tags_file.read_text(encoding="utf-8"))
    sink = pipeline_sink(target, Path("."), ctx.pg_url, schema)
    if target == "parquet":
        sink["url"] = "lake"
    path = work_dir / "flows.yaml"
    document = flow_document(work, ctx.url, tags, sink)
    path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    return path


def _rows_from_sink(config: Path, work: Work) -> int:
    """Rows of the measured range, counted without loading them (keeps this parent small)."""
    import yaml

    document = yaml.safe_load(config.read_text(encoding="utf-8"))
    sink = document["sinks"]["s"]
    start, end = work.start_dt, work.end_dt
    if sink["type"] == "parquet":
        import pyarrow.dataset as ds

        dataset = ds.dataset(
            config.parent / sink["url"] / "bench", format="parquet", partitioning="hive"
        )
        ts = ds.field("ts")
        return int(dataset.count_rows(filter=(ts >= start) & (ts < end)))
    import sqlalchemy as sa

    engine = sa.create_engine(sink["url"])
    with engine.connect() as conn:
        count = conn.execute(
            sa.text(f'select count(*) from "{sink["schema"]}"."bench" where ts >= :s and ts < :e'),
            {"s": start, "e": end},
        ).scalar()
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
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="raw-small")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--targets", default="parquet,postgres")
    parser.add_argument("--contenders", default="pipeline,cli,dlt,baseline,node")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "HISTORIAN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the warm-up round (the first measured run fills the cache)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="one run, check rows, no timing claims"
    )
    parser.add_argument("--json", type=Path, help="also write the measures here")
    parser.add_argument("--list", action="store_true", help="print the workloads and stop")
    args = parser.parse_args()
    if args.list:
        for workload in WORKLOADS.values():
            print(f"{workload.name:14} {workload.describe()}: {workload.note}")
        return
    workload = WORKLOADS["smoke" if args.smoke else args.workload]
    runs = 1 if args.smoke else args.runs
    contenders = args.contenders.split(",")
    targets = args.targets.split(",")

    simulator, url = start_simulator(workload)
    servers = ExitStack()
    prefect_home = Path(tempfile.mkdtemp(prefix="bench-prefect-"))
    try:
        prefect_api = None
        if "cli-served" in contenders:  # a long-lived server, as `historian serve` starts one
            home = {"PREFECT_HOME": str(prefect_home), "PREFECT_UI_ENABLED": "false"}
            server = local_server(prefect_home / "server.log", {**home, "DO_NOT_TRACK": "1"})
            prefect_api = servers.enter_context(server)
        tags = httpx.get(
            f"{url}/tag?cmd=details&path=%2F&options.recurrent=true", timeout=120
        ).json()
        paths = sorted(entry["fullPath"] for entry in tags["tags"].values())[: workload.tags]
        tags_file = Path(tempfile.mkstemp(suffix=".json")[1])
        tags_file.write_text(json.dumps(paths), encoding="utf-8")
        ctx = Context(url, tags_file, args.pg_url, prefect_api)
        print(f"# {workload.name}: {workload.describe()}; {workload.note}", flush=True)
        results: list[Measure] = []
        for target in targets:
            names = [  # the node's serving once; the physical limit is a lake's
                n
                for n in contenders
                if not (n == "node" and target != targets[0])
                and not (n == "limit" and target != "parquet")
            ]
            if not args.smoke and not args.no_warmup and target == targets[0]:
                for name in names:  # warm-up: fills the simulator's replay cache (kept)
                    run_contender(name, target, workload, ctx)
            for _ in range(runs):
                for name in names:
                    measure = run_contender(name, target, workload, ctx)
                    results.append(measure)
                    unit = "bytes" if name == "node" else "rows"  # node: what it served
                    print(
                        f"  {target:8} {name:9} {measure.rows:>12,} {unit} {measure.wall_s:8.2f} s "
                        f"{measure.rows_per_s:>11,.0f} {unit}/s cpu {measure.cpu_s:7.2f} s "
                        f"rss {measure.peak_rss_mb:6.0f} MB",
                        flush=True,
                    )
        report(workload, results, contenders, targets)
        if args.json:
            args.json.write_text(json.dumps([m.__dict__ for m in results], indent=2))
    finally:
        servers.close()
        simulator.terminate()
        simulator.wait(timeout=30)
        shutil.rmtree(prefect_home, ignore_errors=True)
        for folder in _CHECKOUTS.values():
            shutil.rmtree(folder, ignore_errors=True)


def report(
    workload: Workload, results: list[Measure], contenders: list[str], targets: list[str]
) -> None:
    print(f"\n## {workload.name}: {workload.describe()}; {workload.note}\n")
    windows = workload.span / workload.window  # a chunk per window (and tag batch)
    print(
        "| target | contender | rows | wall s | rows/s | CPU s | CPU µs/row | CPU ms/window "
        "| peak RSS MB | pipeline / this |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for target in targets:
        by_name = {
            n: [m for m in results if m.contender == n and m.target == target] for n in contenders
        }
        by_name = {n: runs for n, runs in by_name.items() if runs}
        pipeline_rows = by_name["pipeline"][0].rows if "pipeline" in by_name else 0
        medians: dict[str, float] = {}
        for name, runs in by_name.items():
            if name == "node":  # bytes, not rows: its rate is the pipeline's rows over its time
                for m in runs:
                    m.rows = pipeline_rows
            rows = {m.rows for m in runs}
            if len(rows) != 1:
                raise SystemExit(f"{name} {target}: row counts differ between runs: {rows}")
            medians[name] = statistics.median(m.rows_per_s for m in runs)
        for name, runs in by_name.items():
            ratio = medians.get("pipeline", 0) / medians[name] if medians[name] else 0
            label = "node (serving only)" if name == "node" else name
            cpu = statistics.median(m.cpu_s for m in runs)
            print(
                f"| {target} | {label} | {runs[0].rows:,} | "
                f"{statistics.median(m.wall_s for m in runs):.2f} | {medians[name]:,.0f} | "
                f"{cpu:.2f} | {cpu / max(runs[0].rows, 1) * 1e6:.2f} | "
                f"{cpu / windows * 1000:.1f} | "
                f"{statistics.median(m.peak_rss_mb for m in runs):.0f} | {ratio:.2f}x |"
            )
    counts = {(m.contender, m.target): m.rows for m in results if m.contender != "node"}
    print("\nrows per contender:", counts)
    if len(set(counts.values())) > 1:
        raise SystemExit(f"contenders wrote different row counts: {counts}")


if __name__ == "__main__":
    main()
