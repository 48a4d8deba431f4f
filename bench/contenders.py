"""The contenders of bench/compare.py: the same extraction, written several ways.

Run as `python bench/contenders.py NAME --url URL --tags-file F --work JSON
--target parquet|postgres --out DIR [--pg-url URL --pg-schema S] [--incremental]`; prints
one JSON line `{"rows": N}`. The parent process measures wall time, CPU time and peak RSS
of this process, so every contender pays its own imports and start-up.

`--work` is a `Work` as JSON: the range, the history mode and the request grid (tag
batches x windows aligned on the window grid) that every contender uses, so they all ask
the node the same questions.

* `pipeline` — this project's runner, direct (no Prefect): `run_flow`.
* `dlt` — the dlt library as its docs show it: a resource that fetches `historyMany`
  answers with httpx and yields one dict per sample; filesystem (Parquet) or postgres
  destination.
* `baseline` — what a user writes by hand: httpx + json + pandas.DataFrame +
  `to_parquet` / `to_sql`.
* `node` — fetches every answer and throws it away: the node's own serving rate.
* `limit` — the physical limit of this machine for a lake (Parquet only): the same
  answers fetched with httpx, parsed by orjson, columns built by Arrow from the parsed
  lists, written as zstd Parquet; no checks, no state, no ledger.
The `cli` contender (this project through `historian`, Prefect included) is launched by
the parent directly, with the flows.yaml from `flow_document`.

`--incremental` makes the pipeline run incrementally (from the state a previous run left
in the same `--out`/schema) up to `end` instead of extracting [start, end).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

BATCH = 100


@dataclass(frozen=True)
class Work:
    """What every contender extracts: [start, end) in windows of `window_s`, batches of tags."""

    start: str
    end: str
    mode: str = "raw"
    method: str | None = None
    interval_ms: int | None = None
    window_s: int = 3600
    flow_start: str | None = None  # the flow's `start` (incremental runs: the primed start)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Work:
        return cls(**json.loads(text))

    @property
    def start_dt(self) -> datetime:
        return parse_utc(self.start)

    @property
    def end_dt(self) -> datetime:
        return parse_utc(self.end)

    def windows(self) -> Iterator[tuple[datetime, datetime]]:
        """The window grid of the pipeline's planner: multiples of the window since epoch."""
        size = timedelta(seconds=self.window_s)
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        cursor = epoch + ((self.start_dt - epoch) // size) * size
        while cursor < self.end_dt:
            upper = cursor + size
            yield max(cursor, self.start_dt), min(upper, self.end_dt)
            cursor = upper

    def query_options(self) -> str:
        options = f"&options.mode={self.mode}"
        if self.method:
            options += f"&options.method={self.method}"
        if self.interval_ms:
            options += f"&options.interval={self.interval_ms}"
        return options


def parse_utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def history_url(base: str, paths: list[str], start: datetime, end: datetime, work: Work) -> str:
    query = (
        f"cmd=historyMany&paths={quote(json.dumps(paths), safe='')}"
        f"&start={quote(iso(start))}&end={quote(iso(end))}{work.query_options()}"
    )
    return f"{base}/tag?{query}"


def requests_of(base: str, tags: list[str], work: Work) -> Iterator[tuple[str, datetime, datetime]]:
    """Every (url, lower, upper) of the work, window-major like the pipeline's plan.

    Batches are the pipeline's own (`batch_members`: at most BATCH tags and ~7 KB of
    encoded query), so every contender asks the node exactly the same questions: long or
    non-ASCII names make some batches smaller than BATCH, and a peer slicing fixed
    hundreds would ask other questions, which the replay node renders anew.
    """
    from pipelines.planning import batch_members

    batches = batch_members(tags, max_batch=BATCH)
    for lower, upper in work.windows():
        for batch in batches:
            yield history_url(base, list(batch), lower, upper, work), lower, upper


def flow_document(
    work: Work, url: str, tags: list[str], sink: dict[str, Any], concurrency: int = 2
) -> dict[str, Any]:
    """The flows.yaml of the pipeline and cli contenders."""
    flow: dict[str, Any] = {
        "node": "n",
        "tags": {"paths": tags},
        "mode": work.mode,
        "window": f"{work.window_s}s",
        "batch": BATCH,
        "start": work.flow_start or work.start,
        "settle": "0s",
        "lookback": "0s",
        "metadata": False,
        "sinks": ["s"],
    }
    if work.method:
        flow["method"] = work.method
    if work.interval_ms:
        flow["interval"] = f"{work.interval_ms // 1000}s"
    return {
        "nodes": {"n": {"url": url, "max_connections": concurrency, "read_timeout": "300s"}},
        "sinks": {"s": sink},
        "flows": {"bench": flow},
    }


def pipeline_sink(target: str, out: Path, pg_url: str, pg_schema: str | None) -> dict[str, Any]:
    if target == "parquet":
        return {"type": "parquet", "url": str(out / "lake")}
    return {"type": "sql", "url": pg_url, "schema": pg_schema}


def _module(*names: str) -> Any:
    """The first of `names` that imports: the package's modules moved into sub-packages,
    and `pipeline@REV` runs this file against revisions from before and after."""
    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return importlib.import_module(names[-1])


def run_pipeline(args: argparse.Namespace, tags: list[str], work: Work) -> int:
    memory = _module("pipelines.core.memory", "pipelines.memory")
    memory.bound_memory()  # as the `historian` command does at start
    sink_set = _module("pipelines.config.destinations", "pipelines.destinations").SinkSet
    parse_config = _module("pipelines.config.models", "pipelines.config").parse_config
    node_pool = _module("pipelines.config.nodes", "pipelines.nodes").NodePool
    runner = _module("pipelines.core.runner", "pipelines.runner")
    units = _module("pipelines.core.units", "pipelines.units")
    run_flow = getattr(units, "run_flow", None) or runner.run_flow
    RunRequest = runner.RunRequest

    out = Path(args.out)
    sink = pipeline_sink(args.target, out, args.pg_url, args.pg_schema)
    config = parse_config(flow_document(work, args.url, tags, sink, args.concurrency), env={})
    request = (
        RunRequest(end=work.end_dt)
        if args.incremental
        else RunRequest(start=work.start_dt, end=work.end_dt)
    )
    with node_pool(config) as nodes, sink_set(config, out) as sinks:
        summary = run_flow(config, "bench", nodes=nodes, sinks=sinks, request=request)
    # As the `historian` command does when it is done (absent at older revisions: pipeline@REV).
    done = getattr(memory, "skip_collection_at_exit", None)
    if done is not None:
        done()
    return int(summary.rows)


def _in_window(row: list[Any], lower_ms: int, upper_ms: int) -> bool:
    return bool(lower_ms <= row[0] < upper_ms)


def run_dlt(args: argparse.Namespace, tags: list[str], work: Work) -> int:
    import dlt
    import httpx

    @dlt.resource(name="tag_history", write_disposition="append")
    def tag_history() -> Iterator[dict[str, object]]:
        with httpx.Client(timeout=300) as client:
            for url, lower, upper in requests_of(args.url, tags, work):
                lower_ms, upper_ms = lower.timestamp() * 1000, upper.timestamp() * 1000
                answer = client.get(url).json()
                for tag, entry in answer.items():
                    for row in entry.get("data") or []:
                        if lower_ms <= row[0] < upper_ms:
                            yield {
                                "node": "n",
                                "tag": tag,
                                "ts": datetime.fromtimestamp(row[0] / 1000, tz=UTC),
                                "value": row[1],
                                "quality": row[2] if len(row) > 2 else None,
                                "extra": row[3] if len(row) > 3 else None,
                            }

    if args.target == "parquet":
        destination = dlt.destinations.filesystem(bucket_url=str(Path(args.out) / "dlt_lake"))
        file_format = "parquet"
    else:
        import sqlalchemy as sa

        url = sa.engine.make_url(args.pg_url.replace("+psycopg", ""))
        # dlt insists on a password; a trust-auth server ignores it.
        url = url.set(password=url.password or "unused")
        destination = dlt.destinations.postgres(
            credentials=url.render_as_string(hide_password=False)
        )
        file_format = None
    pipeline = dlt.pipeline(
        pipeline_name="bench_dlt",
        destination=destination,
        dataset_name=args.pg_schema or "bench",
        pipelines_dir=str(Path(args.out) / "dlt_pipelines"),
    )
    info = pipeline.run(tag_history(), loader_file_format=file_format)
    info.raise_on_failed_jobs()
    counts = pipeline.last_trace.last_normalize_info.row_counts  # type: ignore[union-attr]
    return int(counts.get("tag_history", 0))


def run_baseline(args: argparse.Namespace, tags: list[str], work: Work) -> int:
    import httpx
    import pandas as pd

    out = Path(args.out) / "baseline"
    out.mkdir(parents=True, exist_ok=True)
    engine = None
    if args.target == "postgres":
        import sqlalchemy as sa

        engine = sa.create_engine(args.pg_url)
    rows = 0
    part = len(list(out.iterdir()))  # a second (incremental) run adds files
    with httpx.Client(timeout=300) as client:
        for url, lower, upper in requests_of(args.url, tags, work):
            answer = json.loads(client.get(url).text)
            records = []
            for tag, entry in answer.items():
                for row in entry.get("data") or []:
                    records.append((tag, *row))
            frame = pd.DataFrame(records, columns=["tag", "ts", "value", "quality", "extra"])
            frame["ts"] = pd.to_datetime(frame["ts"], unit="ms", utc=True)
            frame = frame[(frame["ts"] >= lower) & (frame["ts"] < upper)]
            frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
            rows += len(frame)
            if engine is None:
                frame.to_parquet(out / f"part-{part:06d}.parquet", index=False)
            else:
                frame.to_sql(
                    "baseline",
                    engine,
                    schema=args.pg_schema,
                    if_exists="append",
                    index=False,
                    method="multi",
                    chunksize=5000,
                )
            part += 1
    return rows


def run_node(args: argparse.Namespace, tags: list[str], work: Work) -> int:
    """Fetch every answer on `concurrency` connections and drop it: what the node serves."""
    import httpx

    urls = [url for url, _, _ in requests_of(args.url, tags, work)]
    limits = httpx.Limits(max_connections=args.concurrency)
    with (
        httpx.Client(timeout=300, limits=limits) as client,
        ThreadPoolExecutor(args.concurrency) as pool,
    ):
        sizes = list(pool.map(lambda url: len(client.get(url).content), urls))
    return sum(sizes)  # bytes, not rows: the parent divides the pipeline's rows by the time


def run_limit(args: argparse.Namespace, tags: list[str], work: Work) -> int:
    """orjson -> Arrow -> Parquet (zstd), one file per answer: what parsing and writing the
    rows costs at the least, in Python, on this machine."""
    import httpx
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(args.out) / "limit"
    out.mkdir(parents=True, exist_ok=True)
    rows = 0
    with httpx.Client(timeout=300) as client:
        for part, (url, lower, upper) in enumerate(requests_of(args.url, tags, work)):
            lower_ms, upper_ms = int(lower.timestamp() * 1000), int(upper.timestamp() * 1000)
            tables = []
            for tag, entry in orjson.loads(client.get(url).content).items():
                data = [r for r in entry.get("data") or [] if lower_ms <= r[0] < upper_ms]
                if not data:
                    continue
                ts, value, quality, extra = zip(*data, strict=True)
                numbers = [v if isinstance(v, int | float) else None for v in value]
                tables.append(
                    pa.table(
                        {
                            "tag": pa.array([tag] * len(ts)).dictionary_encode(),
                            "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                            "value": pa.array(numbers, pa.float64()),
                            "quality": pa.array(quality, pa.int16()),
                            "extra": pa.array(extra, pa.int64()),
                        }
                    )
                )
            if tables:
                table = pa.concat_tables(tables, promote_options="permissive")
                pq.write_table(table, out / f"part-{part:06d}.parquet", compression="zstd")
                rows += table.num_rows
    return rows


RUNNERS = {
    "pipeline": run_pipeline,
    "dlt": run_dlt,
    "baseline": run_baseline,
    "node": run_node,
    "limit": run_limit,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name", choices=sorted(RUNNERS))
    parser.add_argument("--url", required=True)
    parser.add_argument("--tags-file", required=True)
    parser.add_argument("--work", required=True, help="a Work as JSON")
    parser.add_argument("--target", choices=["parquet", "postgres"], default="parquet")
    parser.add_argument("--out", required=True)
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--pg-schema", default=None)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--incremental", action="store_true")
    args = parser.parse_args()
    tags = json.loads(Path(args.tags_file).read_text(encoding="utf-8"))
    rows = RUNNERS[args.name](args, tags, Work.from_json(args.work))
    sys.stdout.write(json.dumps({"rows": rows}) + "\n")


if __name__ == "__main__":
    main()
