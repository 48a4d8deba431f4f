"""The coverage report's pictures, drawn with matplotlib and written as inline SVG.

Why matplotlib: its date locators and `ConciseDateFormatter` label a time axis without
overlap at any range (seconds to years), colour bars and legends come with it, and the
output is a static SVG with the grids embedded as PNG: no script, nothing fetched, a page
of modest size (BENCHMARKS.md). Plotly, the other candidate, inlines its whole JavaScript
bundle in every page and draws nothing without running it. matplotlib is
imported only here, when a report is drawn, so the command line starts without it.

Every label is data: mathtext is off (a `$` in a tag path stays a `$`), control
characters are shown escaped, and matplotlib escapes the text it writes into the SVG.
"""

from __future__ import annotations

import io
import unicodedata
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC
from typing import TYPE_CHECKING, Any

import numpy as np

from connectors.timewindow import from_ms
from pipelines.report.coverage import PRIORITIES, STATUSES, AlarmCoverage, TagCoverage, TimeGrid

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_ROWS_DRAWN = 400
# Across the page, in inches: series names | time charts | gap | trends | their ranges.
WIDTH_IN = 12.0
LABEL_IN = 2.9
PLOT_IN = 5.3
GAP_IN = 0.5
TREND_IN = 2.1
ROW_IN = 0.16  # one series: 11.5 pt, room for 7 pt labels
TOP_IN, BOTTOM_IN = 0.65, 0.55  # time labels above and below a grid
LABEL_CHARS = 44
GAP_COLOUR = "#cfcfcf"  # extracted, no row
HELD_COLOUR = "#fdae61"  # ledger: written, not proven complete
MISSING_COLOUR = "#8073ac"  # ledger: the node left the tag out
NOT_EXTRACTED_COLOUR = "#ffffff"
GOOD_COLOUR, BAD_COLOUR = "#41ab5d", "#d7301f"
BAND_COLOUR, MEAN_COLOUR = "#6baed6", "#08306b"
PRIORITY_COLOURS = ("#9e9e9e", "#4e79a7", "#edc948", "#f28e2b", "#d62728")
STATUS_COLOURS = ("#8c8c8c", "#f28e2b", "#b07aa1", "#d62728", "#d9d9d9")
PRIORITY_ORDER = (4, 3, 2, 1, 0)  # Critical at the bottom of each stack
STATUS_ORDER = (3, 1, 2, 0, 4)  # active and unacknowledged at the bottom
_RC: dict[str, Any] = {
    "svg.fonttype": "none",  # text stays text: small, searchable, drawn by the browser
    "text.parse_math": False,
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def printable(path: str) -> str:
    """The path with control and other invisible characters shown as `\\xNN` escapes."""
    return "".join(
        f"\\x{ord(c):02x}" if unicodedata.category(c).startswith("C") else c for c in path
    )


def label(path: str, limit: int = LABEL_CHARS) -> str:
    """A series name fit for an axis: printable, long paths cut at the left (the leaf stays)."""
    shown = printable(path)
    return shown if len(shown) <= limit else "…" + shown[-(limit - 1) :]


@contextmanager
def drawing(salt: str = "historian") -> Iterator[None]:
    """matplotlib settings of the report (and ids unique to `salt`) while drawing."""
    import matplotlib

    settings: Any = {**_RC, "svg.hashsalt": salt, "svg.id": salt}
    with matplotlib.rc_context(settings), warnings.catch_warnings():
        # Glyphs DejaVu lacks (emoji in a tag path) are the browser's to draw.
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        yield


def to_svg(figure: Figure, salt: str) -> str:
    """The figure as an `<svg>` element to inline in HTML (no XML prolog, no metadata).

    Several SVGs share one page, so each gets ids of its own from `salt`.
    """
    buffer = io.StringIO()
    metadata = {"Date": None, "Creator": None, "Format": None, "Type": None}
    with drawing(salt):
        figure.savefig(buffer, format="svg", metadata=metadata)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _figure(height_in: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(WIDTH_IN, height_in), dpi=100)


def _box(fig: Figure, left_in: float, width_in: float, top_in: float, bottom_in: float) -> Axes:
    """Axes placed in inches from the figure's left and top / bottom edges."""
    height = fig.get_figheight()
    rect = (
        left_in / WIDTH_IN,
        bottom_in / height,
        width_in / WIDTH_IN,
        (height - top_in - bottom_in) / height,
    )
    return fig.add_axes(rect)


def _time_axis(ax: Axes, lo_ms: int, hi_ms: int, *, top: bool = False, ticks: int = 8) -> None:
    """UTC dates on x: AutoDateLocator + ConciseDateFormatter, which never overlap."""
    dates = _dates()
    locator = dates.AutoDateLocator(tz=UTC, minticks=2, maxticks=ticks)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=UTC))
    ax.set_xlim(_num(lo_ms), _num(hi_ms))
    ax.tick_params(axis="x", labeltop=top, top=top, labelsize=7.5)


def _dates() -> Any:
    """matplotlib.dates (its functions carry no type hints)."""
    import matplotlib.dates

    return matplotlib.dates


def _num(ms: int) -> float:
    return float(_dates().date2num(from_ms(ms)))


def _edges(grid: TimeGrid) -> np.ndarray:
    """Bucket edges in matplotlib's date numbers (days)."""
    ms = np.arange(grid.count + 1, dtype=np.int64) * grid.bucket_ms
    return np.asarray(_num(grid.start_ms) + ms / 86_400_000.0)


def _count_norm(peak: int) -> Any:
    from matplotlib.colors import LogNorm, Normalize

    # Tags sampled every second and every minute differ 60-fold: a log scale shows both.
    if peak >= 20:
        return LogNorm(vmin=1, vmax=peak)
    return Normalize(vmin=0, vmax=max(peak, 1))


def _share_norm() -> Any:
    from matplotlib.colors import Normalize

    return Normalize(vmin=0.0, vmax=1.0)


def _cmap(name: str, low: float = 0.3) -> Any:
    """A sequential colour map without its palest part, so one row still shows."""
    import matplotlib as mpl
    from matplotlib.colors import ListedColormap

    colours = mpl.colormaps[name](np.linspace(low, 1.0, 256))
    return ListedColormap(colours, name=f"{name}+").with_extremes(bad=(0.0, 0.0, 0.0, 0.0))


# A bucket's bad-quality share on Reds from its palest tenth: 3% bad is a light pink, 100% the
# darkest red; a bucket with no bad row keeps its green (rows per bucket). The old scale
# started at 35%, salmon, so a bucket with one bad row in thirty looked all bad.
BAD_FLOOR = 0.1
# The shares the key shows, in words.
BAD_KEY = ((0.03, "3%: a few bad"), (0.25, "25%: a quarter bad"), (1.0, "100%: all bad"))


def bad_share_colours(share: np.ndarray) -> np.ndarray:
    """RGBA of bad-quality shares (0..1, more than 0) on the bad scale."""
    return np.asarray(_cmap("Reds", BAD_FLOOR)(_share_norm()(share)))


def _colour_bar(fig: Figure, cax: Axes, norm: Any, cmap: Any, title: str, fmt: str) -> None:
    from matplotlib.cm import ScalarMappable
    from matplotlib.ticker import FixedLocator, MaxNLocator, NullFormatter, StrMethodFormatter

    bar = fig.colorbar(ScalarMappable(norm, cmap), cax=cax, orientation="horizontal")
    axis = bar.ax.xaxis
    if type(norm).__name__ == "LogNorm":
        axis.set_major_locator(FixedLocator(log_ticks(float(norm.vmax))))
    elif fmt.endswith(".0f}"):
        axis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    axis.set_major_formatter(StrMethodFormatter(fmt))  # plain numbers, no mathtext
    axis.set_minor_formatter(NullFormatter())
    bar.ax.tick_params(labelsize=7)
    cax.set_title(title, fontsize=8, loc="left")


def log_ticks(peak: float, most: int = 7) -> list[float]:
    """Round ticks up to `peak` on a log scale: 1, 2, 5, 10, ... or whole decades when crowded."""
    ticks = [m * 10**e for e in range(12) for m in (1, 2, 5) if m * 10**e <= peak]
    if len(ticks) > most:
        ticks = ticks[::3]
    while len(ticks) > most:
        ticks = ticks[::2]
    return [float(t) for t in ticks]


def bucket_text(grid: TimeGrid) -> str:
    """`15 min`, `1 h`, `7 d`: the bucket as the page names it."""
    seconds = grid.bucket_ms // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _grid_height(rows: int) -> float:
    return rows * ROW_IN + TOP_IN + BOTTOM_IN


def _row_texts(ax: Axes, texts: Sequence[str], x: float, align: str, size: float) -> None:
    """One text per row, beside the axes (`x` in axes fractions): plain texts, not ticks,
    which cost ten times more to lay out at 400 rows."""
    from matplotlib.transforms import blended_transform_factory

    where = blended_transform_factory(ax.transAxes, ax.transData)
    for row, text in enumerate(texts):
        if text:
            ax.text(
                x,
                row + 0.5,
                text,
                transform=where,
                ha=align,
                va="center",
                fontsize=size,
                clip_on=False,
            )


def _series_axis(ax: Axes, names: Sequence[str], count: int) -> None:
    _row_texts(ax, [label(n) for n in names[:count]], -0.01, "right", 7)
    ax.set_ylim(count, 0)
    ax.set_yticks([])
    ax.spines[["top", "right", "left"]].set_visible(False)


def _cells(ax: Axes, grid: TimeGrid, colours: np.ndarray) -> None:
    """An RGBA array [row, bucket] as one unscaled picture: the browser keeps cells sharp."""
    extent = (_num(grid.start_ms), _num(grid.end_ms), colours.shape[0], 0)
    pixels = np.round(colours * 255).astype(np.uint8)
    ax.imshow(pixels, aspect="auto", interpolation="none", extent=extent)


def _paint(
    colours: np.ndarray, where: np.ndarray, cmap: Any, norm: Any, values: np.ndarray
) -> None:
    colours[where] = cmap(norm(values[where]))


# -- tag history -------------------------------------------------------------------------------


def tag_figures(cov: TagCoverage) -> list[tuple[str, Figure]]:
    """(id, figure): the colour key, rows over time, and the tag grid beside the trends."""
    if cov.window is None or cov.grid.count == 0 or not cov.members:
        return []
    count = min(len(cov.members), MAX_ROWS_DRAWN)
    with drawing():  # labels and titles take the report's settings as they are made
        norm = _count_norm(int(cov.rows[:count].max()) if cov.rows.size else 0)
        return [
            ("key", _tag_key(norm)),
            ("totals", _tag_totals(cov)),
            ("grid", _tag_grid(cov, norm, count)),
        ]


def _tag_key(norm: Any) -> Figure:
    """The colour key: rows per bucket, bad-quality share, and what white and grey mean."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig = _figure(1.0)
    rows_ax = _box(fig, LABEL_IN, 2.4, 0.4, 0.35)
    _colour_bar(fig, rows_ax, norm, _cmap("Greens"), "rows per bucket", "{x:,.0f}")
    _bad_key(_box(fig, LABEL_IN + 2.7, 2.0, 0.05, 0.05), norm)
    key = _box(fig, LABEL_IN + PLOT_IN + 0.1, WIDTH_IN - LABEL_IN - PLOT_IN - 0.1, 0.05, 0.05)
    key.axis("off")
    key.legend(
        handles=[
            Patch(facecolor=GAP_COLOUR, edgecolor="#999999", label="gap: extracted, no row"),
            Patch(facecolor=NOT_EXTRACTED_COLOUR, edgecolor="#999999", label="not extracted"),
            Patch(facecolor=HELD_COLOUR, label="held: not proven complete"),
            Patch(facecolor=MISSING_COLOUR, label="missing: left out by the node"),
            Patch(facecolor=BAND_COLOUR, label="trend: min to max per bucket"),
            Line2D([0], [0], color=MEAN_COLOUR, linewidth=1.2, label="trend: mean per bucket"),
        ],
        loc="center left",
        frameon=False,
        fontsize=7.5,
    )
    return fig


def _bad_key(ax: Axes, norm: Any) -> None:
    """What the share of bad-quality rows in a bucket looks like, in words and %."""
    from matplotlib.patches import Patch

    ax.axis("off")
    good = _cmap("Greens")(norm(norm.vmax))
    shares = np.asarray([share for share, _ in BAD_KEY])
    handles = [Patch(facecolor=good, label="0%: none bad (green)")] + [
        Patch(facecolor=colour, edgecolor="#999999", label=text)
        for colour, (_, text) in zip(bad_share_colours(shares), BAD_KEY, strict=True)
    ]
    ax.legend(
        handles=handles,
        loc="center left",
        frameon=False,
        fontsize=7.5,
        title="bad-quality rows in a bucket",
        title_fontsize=8,
        alignment="left",
    )


def _tag_totals(cov: TagCoverage) -> Figure:
    """Rows per bucket over every tag, the bad-quality ones stacked on top."""
    window = cov.window
    assert window is not None
    fig = _figure(1.9)
    ax = _box(fig, LABEL_IN, PLOT_IN, 0.35, 0.4)
    edges = _edges(cov.grid)
    good = (cov.rows - cov.bad).sum(axis=0)
    bad = cov.bad.sum(axis=0)
    _bars(ax, edges, good, np.zeros_like(good), GOOD_COLOUR, "good rows")
    _bars(ax, edges, bad, good, BAD_COLOUR, "bad-quality rows")
    _time_axis(ax, window.start_ms, window.end_ms)
    ax.set_title(f"Rows per {bucket_text(cov.grid)}, all tags (UTC)")
    ax.yaxis.set_major_formatter(_count_formatter())
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=7.5)
    return fig


def _bars(
    ax: Axes, edges: np.ndarray, heights: np.ndarray, bottom: np.ndarray, colour: str, text: str
) -> None:
    """One bar per bucket, exactly as wide as the bucket, stacked on `bottom`."""
    ax.bar(
        edges[:-1],
        heights,
        width=np.diff(edges),
        bottom=bottom,
        align="edge",
        color=colour,
        linewidth=0,
        label=text,
    )


def _count_formatter() -> Any:
    from matplotlib.ticker import EngFormatter

    return EngFormatter(sep="")


def _tag_grid(cov: TagCoverage, norm: Any, count: int) -> Figure:
    """One row per tag: coverage cells (left) beside the tag's min/mean/max trend (right)."""
    from matplotlib.colors import to_rgba

    window = cov.window
    assert window is not None
    fig = _figure(_grid_height(count))
    grid_ax = _box(fig, LABEL_IN, PLOT_IN, TOP_IN, BOTTOM_IN)
    trend_ax = _box(fig, LABEL_IN + PLOT_IN + GAP_IN, TREND_IN, TOP_IN, BOTTOM_IN)
    rows, bad = cov.rows[:count], cov.bad[:count]
    colours = np.empty((*rows.shape, 4))
    colours[:] = to_rgba(NOT_EXTRACTED_COLOUR)
    colours[cov.extracted[:count]] = to_rgba(GAP_COLOUR)
    _paint(colours, rows > 0, _cmap("Greens"), norm, rows)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = bad / np.maximum(rows, 1)
    colours[bad > 0] = bad_share_colours(share[bad > 0])
    for marks, colour in ((cov.held, HELD_COLOUR), (cov.missing, MISSING_COLOUR)):
        if marks is not None:  # the ledger's windows, drawn apart from gaps
            colours[marks[:count]] = to_rgba(colour)
    _cells(grid_ax, cov.grid, colours)
    _series_axis(grid_ax, cov.members, count)
    grid_ax.set_title(f"Coverage: rows per tag and {bucket_text(cov.grid)}")
    tall = count > 15
    _time_axis(grid_ax, window.start_ms, window.end_ms, top=tall)
    _trends(trend_ax, cov, count)
    _time_axis(trend_ax, window.start_ms, window.end_ms, top=tall, ticks=4)
    trend_ax.set_title("Value: min to max, mean")
    return fig


def _scaled(values: np.ndarray, row: int, lo: float, hi: float) -> np.ndarray:
    """Values in the row band [row + 0.12, row + 0.88], high values up (y grows downwards)."""
    if not hi > lo:
        return np.full_like(values, row + 0.5)
    return np.asarray(row + 0.88 - 0.76 * (values - lo) / (hi - lo))


def _runs(present: np.ndarray) -> list[tuple[int, int]]:
    """[first, last) index pairs of the runs of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], present.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _trends(ax: Axes, cov: TagCoverage, count: int) -> None:
    """Each tag in its own row, on its own scale; its min..max printed on the right.

    The band is one step-shaped polygon per run of buckets with values (not one per bucket),
    so 400 tags x 100 buckets are a few hundred shapes, drawn as a picture inside the SVG.
    """
    from matplotlib.collections import LineCollection, PolyCollection

    edges = _edges(cov.grid)
    centres = (edges[:-1] + edges[1:]) / 2
    mean = cov.mean
    bands: list[np.ndarray] = []
    lines: list[np.ndarray] = []
    ranges: list[str] = []
    for row in range(count):
        low, high = cov.low[row], cov.high[row]
        present = np.isfinite(low)
        if not present.any():
            ranges.append("text or no good value" if cov.rows[row].any() else "")
            continue
        lo, hi = float(np.nanmin(low)), float(np.nanmax(high))
        ranges.append(f"{lo:.4g} … {hi:.4g}")
        y_low, y_high = _scaled(low, row, lo, hi), _scaled(high, row, lo, hi)
        for first, last in _runs(present):
            x = np.repeat(edges[first : last + 1], 2)[1:-1]
            top = np.repeat(y_high[first:last], 2)
            bottom = np.repeat(y_low[first:last], 2)
            bands.append(
                np.column_stack([np.concatenate([x, x[::-1]]), np.concatenate([top, bottom[::-1]])])
            )
        lines.append(np.column_stack([centres, _scaled(mean[row], row, lo, hi)]))
    if bands:
        ax.add_collection(
            PolyCollection(
                bands,
                facecolors=BAND_COLOUR,
                edgecolors=BAND_COLOUR,
                linewidths=0.3,
                rasterized=True,
            )
        )
    if lines:
        ax.add_collection(
            LineCollection(lines, colors=MEAN_COLOUR, linewidths=0.8, rasterized=True)
        )
    ax.hlines(
        np.arange(1, count),
        0,
        1,
        transform=ax.get_yaxis_transform(),
        colors="#eeeeee",
        linewidths=0.5,
        zorder=0,
    )
    ax.set_ylim(count, 0)
    ax.set_yticks([])
    ax.spines[["top", "right", "left"]].set_visible(False)
    _row_texts(ax, ranges, 1.02, "left", 6.5)


# -- alarm history -----------------------------------------------------------------------------


def alarm_figures(cov: AlarmCoverage) -> list[tuple[str, Figure]]:
    """(id, figure): events by priority, events by status, and events per alarm path."""
    if cov.window is None or cov.grid.count == 0 or not cov.paths:
        return []
    with drawing():
        return [
            (
                "priority",
                _stacked(
                    cov, cov.by_priority, PRIORITIES, PRIORITY_COLOURS, "priority", PRIORITY_ORDER
                ),
            ),
            (
                "status",
                _stacked(
                    cov, cov.by_status, STATUSES, STATUS_COLOURS, "the state entered", STATUS_ORDER
                ),
            ),
            ("paths", _alarm_grid(cov)),
        ]


def _stacked(
    cov: AlarmCoverage,
    counts: np.ndarray,
    names: Sequence[str],
    colours: Sequence[str],
    what: str,
    order: Sequence[int],
) -> Figure:
    window = cov.window
    assert window is not None
    fig = _figure(2.1)
    ax = _box(fig, LABEL_IN, PLOT_IN, 0.35, 0.4)
    edges = _edges(cov.grid)
    bottom = np.zeros(cov.grid.count)
    for index in order:
        if counts[index].any():
            text = f"{names[index]} ({int(counts[index].sum()):,})"
            _bars(ax, edges, counts[index], bottom, colours[index], text)
            bottom = bottom + counts[index]
    _time_axis(ax, window.start_ms, window.end_ms)
    ax.set_title(f"Alarm events per {bucket_text(cov.grid)} by {what} (UTC)")
    ax.yaxis.set_major_formatter(_count_formatter())
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=7.5)
    return fig


def _alarm_grid(cov: AlarmCoverage) -> Figure:
    window = cov.window
    assert window is not None
    count = min(len(cov.paths), MAX_ROWS_DRAWN)
    fig = _figure(_grid_height(count))
    ax = _box(fig, LABEL_IN, PLOT_IN, TOP_IN, BOTTOM_IN)
    events = cov.events[:count]
    norm = _count_norm(int(events.max()) if events.size else 0)
    colours = np.ones((*events.shape, 4))
    _paint(colours, events > 0, _cmap("Purples"), norm, events)
    _cells(ax, cov.grid, colours)
    _series_axis(ax, cov.paths, count)
    _time_axis(ax, window.start_ms, window.end_ms, top=count > 15)
    ax.set_title(f"Alarm events per path and {bucket_text(cov.grid)}")
    cax = _box(
        fig, LABEL_IN + PLOT_IN + 0.3, 2.0, TOP_IN + 0.2, fig.get_figheight() - TOP_IN - 0.35
    )
    _colour_bar(fig, cax, norm, _cmap("Purples"), "events per bucket", "{x:,.0f}")
    return fig
