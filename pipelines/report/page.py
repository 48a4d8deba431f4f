"""Coverage report: what a data engineer looks at before trusting an export.

One self-contained HTML page per flow (no script, no external asset): for tag history,
rows over time, a grid of rows per tag and bucket (gaps and bad quality stand out) beside
each tag's value trend (min to max and mean per bucket), then a table of every tag; for
alarm history, events by priority and by status over time, events per alarm path, then a
table of every path. The numbers come from `pipelines.report.coverage` (aggregated where the data
lives), the pictures from `pipelines.report.charts` (matplotlib, inline SVG).

Tag paths are data, never markup: every one is escaped here, and matplotlib escapes the
text it writes into the SVG.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.models import Config, TagHistoryFlow, flow_dataset
from pipelines.planning import parse_duration
from pipelines.report.charts import (
    MAX_ROWS_DRAWN,
    alarm_figures,
    bucket_text,
    printable,
    tag_figures,
    to_svg,
)
from pipelines.report.coverage import (
    PRIORITIES,
    STATUSES,
    AlarmCoverage,
    TagCoverage,
    TimeGrid,
    alarm_coverage,
    tag_coverage,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_STYLE = """body{font-family:"DejaVu Sans",Verdana,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin-bottom:.2em}h2{font-size:1.1em;margin-top:1.5em}
p.where{color:#555;margin-top:0}
.facts{display:flex;gap:2.5em;margin:1em 0}.facts div{font-size:.85em;color:#555}
.facts b{display:block;font-size:1.6em;color:#222}
figure{margin:0 0 .5em 0}svg{max-width:100%;height:auto}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px}
th{background:#f4f4f4;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
td.p{max-width:40em;overflow-wrap:anywhere}tr.gap td{background:#fff4e5}"""


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S").removesuffix(":00") + "Z"


def _cell(number: float | int) -> str:
    return f'<td class="n">{number:,}</td>'


def _value(number: float) -> str:
    return f'<td class="n">{number:.6g}</td>' if np.isfinite(number) else '<td class="n"></td>'


def _facts(pairs: list[tuple[str, str]]) -> str:
    return (
        '<div class="facts">'
        + "".join(f"<div><b>{html.escape(v)}</b>{html.escape(k)}</div>" for k, v in pairs)
        + "</div>"
    )


def _span(window: Window | None, grid: TimeGrid) -> str:
    if window is None:
        return "Nothing extracted and no row held."
    return (
        f"{_stamp(window.start)} to {_stamp(window.end)} (UTC), in buckets of {bucket_text(grid)}."
    )


def _page(title: str, where: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f'<body><h1>{html.escape(title)}</h1><p class="where">{html.escape(where)}</p>'
        f"{body}</body></html>\n"
    )


def _figures(pairs: Sequence[tuple[str, Figure]]) -> str:
    return "".join(f"<figure>{to_svg(fig, f'fig-{name}')}</figure>" for name, fig in pairs)


def _more(drawn: int, total: int, noun: str) -> str:
    if total <= drawn:
        return ""
    return f"<p>The grid shows the first {drawn:,} of {total:,} {noun}; the table lists all.</p>"


def render_tag_page(cov: TagCoverage, *, title: str, where: str) -> str:
    """The page for a tag history dataset."""
    totals = cov.totals
    facts = _facts(
        [
            ("tags", f"{totals['members']:,}"),
            ("rows", f"{totals['rows']:,}"),
            ("bad-quality rows", f"{totals['bad_rows']:,}"),
            ("tags with gaps", f"{totals['members_with_gaps']:,}"),
            ("tags held", f"{totals['members_held']:,}"),
            ("tags missing", f"{totals['members_missing']:,}"),
        ]
    )
    rows_html = []
    for i, member in enumerate(cov.members):
        counted = int(cov.counted[i].sum())
        low = float(np.nanmin(cov.low[i])) if counted else float("nan")
        high = float(np.nanmax(cov.high[i])) if counted else float("nan")
        average = float(cov.total[i].sum() / counted) if counted else float("nan")
        gaps, held, missing = cov.gaps(i), cov.held_buckets(i), cov.missing_buckets(i)
        why = "; ".join(cov.reasons.get(member, []))
        rows_html.append(
            f'<tr{" class=gap" if gaps or held or missing else ""}><td class="n">{i + 1}</td>'
            f'<td class="p">{html.escape(printable(member))}</td>'
            f"{_cell(int(cov.rows[i].sum()))}{_cell(gaps)}{_cell(held)}{_cell(missing)}"
            f"{_cell(cov.not_extracted(i))}"
            f"{_cell(int(cov.bad[i].sum()))}{_cell(cov.bad_buckets(i))}"
            f"{_value(low)}{_value(average)}{_value(high)}"
            f'<td class="p">{html.escape(printable(why))}</td></tr>'
        )
    table = (
        "<h2>Every tag</h2><table><tr><th>#</th><th>tag</th><th>rows</th><th>gap buckets</th>"
        "<th>held buckets</th><th>missing buckets</th>"
        "<th>buckets not extracted</th><th>bad-quality rows</th><th>buckets with bad quality</th>"
        "<th>min</th><th>mean</th><th>max</th><th>held because</th></tr>"
        + "".join(rows_html)
        + "</table>"
    )
    note = (
        "<p>A gap is a bucket the flow has extracted in which the tag has no row. "
        "Held and missing buckets come from the sink's completeness ledger: a held window "
        "was written but is not proven complete (the reason is listed), a missing one is "
        "a window the node left the tag out of its answers. "
        "Trends use good-quality values only (quality 192 and above; booleans as 0/1); "
        "each tag is drawn on its own scale, its range printed on the right.</p>"
    )
    body = (
        f"<p>{html.escape(_span(cov.window, cov.grid))}</p>{facts}"
        f"{_figures(tag_figures(cov))}{_more(MAX_ROWS_DRAWN, len(cov.members), 'tags')}"
        f"{note}{table}"
    )
    return _page(title, where, body)


def render_alarm_page(cov: AlarmCoverage, *, title: str, where: str) -> str:
    """The page for an alarm history dataset: counts by priority and status, per path."""
    priority_totals = cov.by_priority.sum(axis=1)
    status_totals = cov.by_status.sum(axis=1)
    facts = _facts(
        [("alarm paths", f"{len(cov.paths):,}"), ("events", f"{cov.totals['events']:,}")]
        + [(f"{PRIORITIES[p]} priority", f"{int(priority_totals[p]):,}") for p in (4, 3, 2, 1)]
        + [("active, unacknowledged", f"{int(status_totals[3]):,}")]
    )
    columns = [p for p in (1, 2, 3, 4, 0) if p or priority_totals[0]]
    states = [s for s in (3, 1, 2, 0, 4) if s != 4 or status_totals[4]]
    head = (
        "<tr><th>#</th><th>alarm path</th><th>events</th>"
        + "".join(f"<th>{html.escape(PRIORITIES[p])}</th>" for p in columns)
        + "".join(f"<th>{html.escape(STATUSES[s])}</th>" for s in states)
        + "</tr>"
    )
    rows_html = [
        f'<tr><td class="n">{i + 1}</td><td class="p">{html.escape(printable(path))}</td>'
        f"{_cell(int(cov.events[i].sum()))}"
        + "".join(_cell(int(cov.path_priority[i, p])) for p in columns)
        + "".join(_cell(int(cov.path_status[i, s])) for s in states)
        + "</tr>"
        for i, path in enumerate(cov.paths)
    ]
    note = (
        "<p>Each event is one change of an alarm, counted by its priority "
        "(1 Low to 4 Critical) and by the state it entered.</p>"
    )
    body = (
        f"<p>{html.escape(_span(cov.window, cov.grid))}</p>{facts}"
        f"{_figures(alarm_figures(cov))}{_more(MAX_ROWS_DRAWN, len(cov.paths), 'alarm paths')}"
        f"{note}<h2>Every alarm path</h2><table>{head}{''.join(rows_html)}</table>"
    )
    return _page(title, where, body)


def _as_bucket(bucket: str | timedelta | None) -> timedelta | None:
    if bucket is None or isinstance(bucket, timedelta):
        return bucket
    return parse_duration(bucket)


def flow_coverage(
    config: Config,
    flow_name: str,
    *,
    sinks: SinkSet,
    start: datetime | None = None,
    end: datetime | None = None,
    bucket: str | timedelta | None = None,
    sink_name: str | None = None,
) -> tuple[TagCoverage | AlarmCoverage, str]:
    """Coverage of a flow's dataset as held by `sink_name` (default: the flow's first
    sink), and where that is. A flow on several nodes: every node's rows together, and a
    window counts as extracted where every node has it."""
    from pipelines.state import common_progress

    flow = config.flows[flow_name]
    sink = sinks.get(sink_name or flow.sinks[0])
    dataset = flow_dataset(flow_name, flow)
    keys = [key for _, key in config.flow_units(flow_name)]
    progress = common_progress(flow_name, [sink.progress(key) for key in keys])
    measure = tag_coverage if isinstance(flow, TagHistoryFlow) else alarm_coverage
    cov = measure(
        sink,
        flow_name,
        dataset,
        start=start,
        end=end,
        bucket=_as_bucket(bucket),
        progress=progress,
    )
    return cov, sink.describe()


def write_report(
    config: Config,
    flow_name: str,
    out: Path,
    *,
    sinks: SinkSet,
    start: datetime | None = None,
    end: datetime | None = None,
    bucket: str | timedelta | None = None,
    sink_name: str | None = None,
) -> Path:
    """Write the flow's coverage page to `out` (one self-contained HTML file); return it."""
    cov, where = flow_coverage(
        config, flow_name, sinks=sinks, start=start, end=end, bucket=bucket, sink_name=sink_name
    )
    title = f"Coverage of {flow_name}"
    if isinstance(cov, TagCoverage):
        page = render_tag_page(cov, title=title, where=f"Read from {where}")
    else:
        page = render_alarm_page(cov, title=title, where=f"Read from {where}")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    partial.write_text(page, encoding="utf-8")
    partial.replace(out)  # a page is there whole or not at all, even if the command is killed
    return out
