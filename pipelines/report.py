"""Coverage report: what a data engineer checks before trusting an export.

Per tag (or alarm path) and time bucket: rows, gaps (buckets without a row) and
bad-quality stretches (quality < 192), drawn as one self-contained HTML page with an
inline SVG heat map (no scripts, no external assets), plus a short Markdown summary for
the Prefect run's artifact. Every tag path is escaped: paths are data, never markup.
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

GOOD_QUALITY = 192
MAX_TAGS_DRAWN = 400


@dataclass
class Coverage:
    """Rows and bad-quality rows per member and bucket."""

    flow: str
    kind: str
    start: datetime
    bucket: timedelta
    members: list[str]
    rows: np.ndarray  # [member, bucket]
    bad: np.ndarray
    totals: dict[str, int] = field(default_factory=dict)

    @property
    def buckets(self) -> int:
        return int(self.rows.shape[1]) if self.rows.ndim == 2 else 0

    def gaps(self, member_index: int) -> int:
        return int((self.rows[member_index] == 0).sum())

    def bad_buckets(self, member_index: int) -> int:
        return int((self.bad[member_index] > 0).sum())


def _nice_bucket(span: timedelta, target: int = 100) -> timedelta:
    candidates = [timedelta(seconds=s) for s in (
        60, 300, 900, 1800, 3600, 7200, 21600, 43200, 86400, 7 * 86400, 30 * 86400)]
    for candidate in candidates:
        if span / candidate <= target:
            return candidate
    return candidates[-1]


def coverage(frame: pd.DataFrame, flow: str, kind: str, bucket: timedelta | None = None) -> Coverage:
    """Bucket a dataset's rows per member over its time span."""
    column = "tag" if kind == KIND_TAG_HISTORY else "path"
    if frame.empty:
        now = datetime.now(UTC)
        return Coverage(flow, kind, now, bucket or timedelta(hours=1), [], np.zeros((0, 0)), np.zeros((0, 0)))
    table = pa.Table.from_pandas(frame[[column, "ts"] + (["quality"] if "quality" in frame else [])],
                                 preserve_index=False)
    ts = table.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
    first, last = int(ts.min()), int(ts.max())
    size = bucket or _nice_bucket(timedelta(milliseconds=max(1, last - first + 1)))
    size_ms = int(size.total_seconds() * 1000)
    start_ms = first - first % size_ms
    count = (last - start_ms) // size_ms + 1
    members_array = table.column(column).to_numpy(zero_copy_only=False)
    members, member_index = np.unique(members_array, return_inverse=True)
    bucket_index = (ts - start_ms) // size_ms
    rows = np.zeros((len(members), count), dtype=np.int64)
    np.add.at(rows, (member_index, bucket_index), 1)
    bad = np.zeros_like(rows)
    if "quality" in table.column_names:
        quality = table.column("quality").to_numpy(zero_copy_only=False)
        quality = np.where(pd.isna(quality), 0, quality).astype(np.int64)
        mask = quality < GOOD_QUALITY
        np.add.at(bad, (member_index[mask], bucket_index[mask]), 1)
    start = datetime.fromtimestamp(start_ms / 1000, tz=UTC)
    totals = {"rows": int(rows.sum()), "bad_rows": int(bad.sum()), "members": len(members)}
    return Coverage(flow, kind, start, size, [str(m) for m in members], rows, bad, totals)


def _color(rows: int, bad: int, peak: int) -> str:
    if rows == 0:
        return "#d9d9d9"
    if bad:
        share = bad / rows
        return "#d7301f" if share > 0.5 else "#fc8d59"
    level = 0.35 + 0.65 * min(1.0, rows / max(1, peak))
    green = int(120 + 80 * level)
    return f"rgb(35,{green},90)"


def render_html(cov: Coverage, *, title: str, where: str) -> str:
    cell_w, cell_h, label_w, top = 8, 12, 320, 40
    members = cov.members[:MAX_TAGS_DRAWN]
    width = label_w + max(1, cov.buckets) * cell_w + 20
    height = top + len(members) * cell_h + 40
    peak = int(np.percentile(cov.rows[cov.rows > 0], 95)) if (cov.rows > 0).any() else 1
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="10">'
    ]
    for column in range(0, cov.buckets, max(1, cov.buckets // 8)):
        moment = cov.start + column * cov.bucket
        x = label_w + column * cell_w
        parts.append(f'<text x="{x}" y="{top - 8}">{html.escape(moment.strftime("%Y-%m-%d %H:%M"))}</text>')
    for row, member in enumerate(members):
        y = top + row * cell_h
        label = member if len(member) <= 60 else member[:57] + "..."
        parts.append(f'<text x="4" y="{y + cell_h - 3}">{html.escape(label)}</text>')
        for column in range(cov.buckets):
            rows = int(cov.rows[row, column])
            bad = int(cov.bad[row, column])
            moment = cov.start + column * cov.bucket
            tip = f"{member} {moment:%Y-%m-%d %H:%M}Z: {rows} rows, {bad} bad quality"
            parts.append(
                f'<rect x="{label_w + column * cell_w}" y="{y}" width="{cell_w - 1}" '
                f'height="{cell_h - 1}" fill="{_color(rows, bad, peak)}">'
                f"<title>{html.escape(tip)}</title></rect>"
            )
    parts.append("</svg>")
    table_rows = "".join(
        f"<tr><td>{html.escape(member)}</td><td>{int(cov.rows[i].sum()):,}</td>"
        f"<td>{cov.gaps(i)}</td><td>{int(cov.bad[i].sum()):,}</td><td>{cov.bad_buckets(i)}</td></tr>"
        for i, member in enumerate(cov.members)
    )
    more = (f"<p>Showing the first {MAX_TAGS_DRAWN} of {len(cov.members)} in the picture; "
            "the table lists all.</p>") if len(cov.members) > MAX_TAGS_DRAWN else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;font-size:12px}}td:nth-child(n+2){{text-align:right}}
.k span{{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>{html.escape(where)}. {cov.totals.get('members', 0)} series, {cov.totals.get('rows', 0):,} rows,
{cov.totals.get('bad_rows', 0):,} bad-quality rows; buckets of {html.escape(str(cov.bucket))} from
{html.escape(cov.start.strftime('%Y-%m-%d %H:%M'))}Z.</p>
<p class="k"><span style="background:rgb(35,200,90)"></span>rows
<span style="background:#fc8d59"></span>some bad quality<span style="background:#d7301f"></span>mostly bad
<span style="background:#d9d9d9"></span>gap (no row)</p>
{''.join(parts)}{more}
<h2>Per series</h2><table><tr><th>series</th><th>rows</th><th>gap buckets</th>
<th>bad-quality rows</th><th>buckets with bad quality</th></tr>{table_rows}</table>
</body></html>
"""


def report_markdown(cov: Coverage, *, limit: int = 20) -> str:
    """Short text for a Prefect artifact: totals and the series with most gaps."""
    lines = [
        f"**{cov.flow}**: {cov.totals.get('members', 0)} series, {cov.totals.get('rows', 0):,} rows, "
        f"{cov.totals.get('bad_rows', 0):,} bad-quality rows (buckets of {cov.bucket}).",
        "",
        "| series | rows | gap buckets | bad-quality rows |",
        "|---|---:|---:|---:|",
    ]
    order = sorted(range(len(cov.members)), key=lambda i: -cov.gaps(i))[:limit]
    for i in order:
        member = cov.members[i].replace("|", "\\|")
        lines.append(f"| {member} | {int(cov.rows[i].sum()):,} | {cov.gaps(i)} | {int(cov.bad[i].sum()):,} |")
    return "\n".join(lines)


def flow_coverage(config: Config, flow_name: str, *, sinks: SinkSet,
                  bucket: timedelta | None = None) -> tuple[Coverage, str]:
    flow = config.flows[flow_name]
    kind = flow_kind(flow)
    sink = sinks.get(flow.sinks[0])
    frame = sink.read(flow_dataset(flow_name, flow), kind)
    return coverage(frame, flow_name, kind, bucket), sink.describe()


def write_report(config: Config, flow_name: str, out: Path, *, sinks: SinkSet,
                 bucket: timedelta | None = None) -> Path:
    """Write the flow's coverage page to `out` and return its path."""
    cov, where = flow_coverage(config, flow_name, sinks=sinks, bucket=bucket)
    page = render_html(cov, title=f"Coverage of {flow_name}", where=f"Read from {where}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
