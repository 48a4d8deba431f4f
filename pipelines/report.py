"""Coverage report: what a data engineer checks before trusting an export.

Per tag (or alarm path) and time bucket: rows, gaps (buckets without a row) and
bad-quality stretches (buckets with rows of quality < 192), drawn as one self-contained
HTML page with an inline SVG heat map (no scripts, no external assets), plus totals and a
short Markdown summary for the Prefect run's artifact.

Tags the flow has covered (its progress in the sink) but that have no row at all are
listed too: a tag that never produced a sample is the largest gap there is. Every tag
path is escaped: paths are data, never markup.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from connectors.schema import KIND_TAG_HISTORY
from pipelines.config import Config, flow_dataset, flow_kind
from pipelines.destinations import SinkSet
from pipelines.planning import parse_duration
from pipelines.state import tag_members

GOOD_QUALITY = 192
MAX_TAGS_DRAWN = 400
TARGET_BUCKETS = 100
_MINUTES = (1, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080, 43200)
_BUCKET_CHOICES_S = tuple(minutes * 60 for minutes in _MINUTES)
_TS_MS = pa.timestamp("ms", tz="UTC")


@dataclass
class Coverage:
    """Rows and bad-quality rows per member (tag or alarm path) and time bucket."""

    flow: str
    kind: str
    start: datetime
    bucket: timedelta
    members: list[str]
    rows: np.ndarray  # int64 [member, bucket]
    bad: np.ndarray  # int64 [member, bucket]
    totals: dict[str, int] = field(default_factory=dict)

    @property
    def buckets(self) -> int:
        return int(self.rows.shape[1]) if self.rows.ndim == 2 else 0

    @property
    def end(self) -> datetime:
        return self.start + self.buckets * self.bucket

    def gaps(self, member_index: int) -> int:
        """Buckets in which the member has no row."""
        return int((self.rows[member_index] == 0).sum())

    def bad_buckets(self, member_index: int) -> int:
        """Buckets in which the member has at least one bad-quality row."""
        return int((self.bad[member_index] > 0).sum())


def nice_bucket(span: timedelta, target: int = TARGET_BUCKETS) -> timedelta:
    """The smallest round bucket (1m, 5m, ... 3h, 6h, 1d, 2d, 7d, 30d) giving <= `target` buckets."""
    for seconds in _BUCKET_CHOICES_S:
        candidate = timedelta(seconds=seconds)
        if span / candidate <= target:
            return candidate
    return timedelta(seconds=_BUCKET_CHOICES_S[-1])


def coverage(
    frame: pd.DataFrame,
    flow: str,
    kind: str,
    bucket: timedelta | None = None,
    *,
    members: list[str] | None = None,
) -> Coverage:
    """Bucket a dataset's rows per member over its time span (UTC-aligned buckets).

    `members` adds series known to belong to the flow even when they have no row.
    """
    column = "tag" if kind == KIND_TAG_HISTORY else "path"
    if frame.empty:
        names = sorted(set(members or []))
        empty = np.zeros((len(names), 0), dtype=np.int64)
        totals = {"rows": 0, "bad_rows": 0, "members": len(names)}
        size = bucket or timedelta(hours=1)
        return Coverage(flow, kind, datetime.now(UTC), size, names, empty, empty.copy(), totals)
    wanted = [column, "ts"] + (["quality"] if "quality" in frame.columns else [])
    table = pa.Table.from_pandas(frame[wanted], preserve_index=False)
    ts = table.column("ts").cast(_TS_MS).cast(pa.int64()).to_numpy(zero_copy_only=False)
    first, last = int(ts.min()), int(ts.max())
    size = bucket or nice_bucket(timedelta(milliseconds=last - first + 1))
    size_ms = max(1, int(size.total_seconds() * 1000))
    start_ms = first - first % size_ms
    count = (last - start_ms) // size_ms + 1
    # Dictionary-encode the paths: one Python string per distinct member, not per row.
    encoded = table.column(column).combine_chunks().dictionary_encode()
    dictionary = [str(name) for name in encoded.dictionary.to_pylist()]
    names = sorted(set(dictionary).union(members or []))
    position = {name: i for i, name in enumerate(names)}
    remap = np.array([position[name] for name in dictionary], dtype=np.int64)
    member_index = remap[encoded.indices.to_numpy(zero_copy_only=False)]
    bucket_index = (ts - start_ms) // size_ms
    rows = np.zeros((len(names), count), dtype=np.int64)
    np.add.at(rows, (member_index, bucket_index), 1)
    bad = np.zeros_like(rows)
    if "quality" in table.column_names:
        quality = table.column("quality").cast(pa.int32()).fill_null(-1)
        mask = quality.to_numpy(zero_copy_only=False) < GOOD_QUALITY
        np.add.at(bad, (member_index[mask], bucket_index[mask]), 1)
    start = datetime.fromtimestamp(start_ms / 1000, tz=UTC)
    totals = {"rows": int(rows.sum()), "bad_rows": int(bad.sum()), "members": len(names)}
    return Coverage(flow, kind, start, size, names, rows, bad, totals)


def _color(rows: int, bad: int, peak: int) -> str:
    if bad:
        return "#d7301f" if bad * 2 > rows else "#fc8d59"
    level = 0.35 + 0.65 * min(1.0, rows / max(1, peak))
    return f"rgb(35,{int(120 + 80 * level)},90)"


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M")


def render_svg(cov: Coverage) -> str:
    """The heat map: one row per member, one cell per bucket; grey where there is no row."""
    cell_w, cell_h, label_w, top = 8, 12, 320, 40
    members = cov.members[:MAX_TAGS_DRAWN]
    width = label_w + max(1, cov.buckets) * cell_w + 20
    height = top + len(members) * cell_h + 20
    filled = cov.rows[cov.rows > 0]
    peak = int(np.percentile(filled, 95)) if filled.size else 1
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="10" role="img">'
    ]
    for column in range(0, cov.buckets, max(1, cov.buckets // 8)):
        x = label_w + column * cell_w
        parts.append(
            f'<text x="{x}" y="{top - 8}">{_stamp(cov.start + column * cov.bucket)}</text>'
        )
    for row, member in enumerate(members):
        y = top + row * cell_h
        label = member if len(member) <= 60 else member[:57] + "..."
        gaps = cov.gaps(row)
        parts.append(
            f'<text x="4" y="{y + cell_h - 3}">{html.escape(label)}'
            f"<title>{html.escape(member)}: {gaps} of {cov.buckets} buckets without rows</title>"
            "</text>"
        )
        # One grey bar per member; only buckets with rows are drawn over it.
        parts.append(
            f'<rect x="{label_w}" y="{y}" width="{max(1, cov.buckets) * cell_w - 1}" '
            f'height="{cell_h - 1}" fill="#d9d9d9"/>'
        )
        for index in np.flatnonzero(cov.rows[row]):
            column = int(index)
            rows = int(cov.rows[row, column])
            bad = int(cov.bad[row, column])
            moment = cov.start + column * cov.bucket
            tip = f"{member} {_stamp(moment)}Z: {rows} rows, {bad} bad quality"
            parts.append(
                f'<rect x="{label_w + column * cell_w}" y="{y}" width="{cell_w - 1}" '
                f'height="{cell_h - 1}" fill="{_color(rows, bad, peak)}">'
                f"<title>{html.escape(tip)}</title></rect>"
            )
    parts.append("</svg>")
    return "".join(parts)


def render_html(cov: Coverage, *, title: str, where: str) -> str:
    """The whole page: totals, legend, heat map and a table of every member."""
    noun = "rows" if cov.kind == KIND_TAG_HISTORY else "events"
    table_rows = "".join(
        f"<tr><td>{html.escape(member)}</td><td>{int(cov.rows[i].sum()):,}</td>"
        f"<td>{cov.gaps(i)}</td><td>{int(cov.bad[i].sum()):,}</td><td>{cov.bad_buckets(i)}</td></tr>"
        for i, member in enumerate(cov.members)
    )
    more = ""
    if len(cov.members) > MAX_TAGS_DRAWN:
        more = (
            f"<p>The picture shows the first {MAX_TAGS_DRAWN} of {len(cov.members)} series; "
            "the table lists all.</p>"
        )
    gap_members = sum(1 for i in range(len(cov.members)) if cov.gaps(i))
    span = (
        f"buckets of {html.escape(str(cov.bucket))} from {_stamp(cov.start)}Z to {_stamp(cov.end)}Z"
        if cov.buckets
        else "no data"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;font-size:12px}}td:nth-child(n+2){{text-align:right}}
.k span{{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>{html.escape(where)}. {cov.totals.get("members", 0)} series, {cov.totals.get("rows", 0):,} {noun},
{cov.totals.get("bad_rows", 0):,} bad-quality rows, {gap_members} series with gaps; {span}.</p>
<p class="k"><span style="background:rgb(35,200,90)"></span>{noun}
<span style="background:#fc8d59"></span>some bad quality<span style="background:#d7301f"></span>mostly bad
<span style="background:#d9d9d9"></span>gap (no row)</p>
{render_svg(cov)}{more}
<h2>Per series</h2><table><tr><th>series</th><th>{noun}</th><th>gap buckets</th>
<th>bad-quality rows</th><th>buckets with bad quality</th></tr>{table_rows}</table>
</body></html>
"""


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def report_markdown(cov: Coverage, *, limit: int = 20) -> str:
    """Short text for a Prefect artifact: totals and the series with most gaps."""
    lines = [
        f"**{_cell(cov.flow)}**: {cov.totals.get('members', 0)} series, "
        f"{cov.totals.get('rows', 0):,} rows, {cov.totals.get('bad_rows', 0):,} bad-quality rows "
        f"(buckets of {cov.bucket}).",
        "",
        "| series | rows | gap buckets | bad-quality rows |",
        "|---|---:|---:|---:|",
    ]
    order = sorted(range(len(cov.members)), key=lambda i: (-cov.gaps(i), cov.members[i]))[:limit]
    for i in order:
        lines.append(
            f"| {_cell(cov.members[i])} | {int(cov.rows[i].sum()):,} | {cov.gaps(i)} "
            f"| {int(cov.bad[i].sum()):,} |"
        )
    return "\n".join(lines)


def _as_bucket(bucket: str | timedelta | None) -> timedelta | None:
    if bucket is None or isinstance(bucket, timedelta):
        return bucket
    return parse_duration(bucket)


def flow_coverage(
    config: Config, flow_name: str, *, sinks: SinkSet, bucket: str | timedelta | None = None
) -> tuple[Coverage, str]:
    """Coverage of a flow's dataset as held by the flow's first sink, and where that is."""
    flow = config.flows[flow_name]
    kind = flow_kind(flow)
    sink = sinks.get(flow.sinks[0])
    frame = sink.read(flow_dataset(flow_name, flow), kind)
    members: list[str] = []
    if kind == KIND_TAG_HISTORY:
        members = tag_members(sink.progress(flow_name))  # not the records of missing windows
    return coverage(frame, flow_name, kind, _as_bucket(bucket), members=members), sink.describe()


def write_report(
    config: Config,
    flow_name: str,
    out: Path,
    *,
    sinks: SinkSet,
    bucket: str | timedelta | None = None,
) -> Path:
    """Write the flow's coverage page to `out` (one self-contained HTML file); return it."""
    cov, where = flow_coverage(config, flow_name, sinks=sinks, bucket=bucket)
    page = render_html(cov, title=f"Coverage of {flow_name}", where=f"Read from {where}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
