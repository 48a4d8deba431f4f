"""What a flow run leaves on the Prefect server: a markdown summary of the run, and for a
shard of a sharded backfill a one-row table its backfill reads back
(`pipelines.orchestration.fleet.wait_for_shards`)."""

from __future__ import annotations

from pathlib import Path

from pipelines.orchestration.env import configure_prefect

configure_prefect()

from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402

from pipelines.core.runner import Plan, RunSummary  # noqa: E402
from pipelines.orchestration.names import artifact_key, shard_artifact_key  # noqa: E402


def summary_artifact(summary: RunSummary, plan: Plan | None, report: Path | None) -> None:
    """A markdown artifact: totals, span, watermarks, and rows per tag with the gaps."""
    create_markdown_artifact(
        markdown=summary_markdown(summary, plan.members if plan else (), report),
        key=artifact_key(summary.flow),
        description=f"{summary.flow}: what this run extracted",
    )


def shard_artifact(summary: RunSummary) -> None:
    """A one-row table a sharded backfill reads back (`pipelines.orchestration.fleet.wait_for_shards`)."""
    counts = {
        key: summary.as_dict()[key]
        for key in ("shard", "chunks_planned", "chunks_skipped", "chunks_done", "rows")
    }
    create_table_artifact(
        table=[counts],
        key=shard_artifact_key(summary.flow),
        description=f"{summary.flow} shard {summary.shard}: chunks and rows",
    )


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def summary_markdown(
    summary: RunSummary,
    members: tuple[str, ...] | list[str],
    report: Path | None = None,
    *,
    limit: int = 50,
) -> str:
    """The run in a few lines and one table (busiest tags first, then tags without rows)."""
    bad_total = sum(summary.bad_quality_per_tag.values())
    without = [m for m in members if m not in summary.rows_per_tag] if summary.chunks_done else []
    lines = [
        f"### {_cell(summary.flow)} ({summary.kind}, node {_cell(summary.node)})",
        "",
        f"* span: {summary.span or 'nothing to fetch'}",
        f"* rows: {summary.rows:,} in {summary.seconds:.1f} s "
        f"({summary.rows_per_second:,.0f} rows/s, {summary.requests:,} requests)",
        f"* chunks: {summary.chunks_done} written, {summary.chunks_skipped} already complete",
        f"* members: {summary.tags}, without rows in this run: {len(without)}",
        f"* bad-quality rows (quality < 192): {bad_total:,}",
        f"* watermark: {summary.watermark_before} -> {summary.watermark_after}",
    ]
    if report is not None:
        lines.append(f"* coverage report: `{report}`")
    lines += ["", "| member | rows | bad quality |", "|---|---:|---:|"]
    for member, rows in summary.rows_per_tag.most_common(limit):
        bad = summary.bad_quality_per_tag.get(member, 0)
        lines.append(f"| {_cell(member)} | {rows:,} | {bad:,} |")
    for member in without[:limit]:
        lines.append(f"| {_cell(member)} | 0 (gap) | 0 |")
    hidden = max(0, len(summary.rows_per_tag) - limit) + max(0, len(without) - limit)
    if hidden:
        lines.append(f"| ... {hidden} more | | |")
    return "\n".join(lines)
