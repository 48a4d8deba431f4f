"""Is every committed chunk of the warehouse still there? Its records against one COUNT.

`historian_chunks` records each chunk's window and rows committed, and its member count
(not the members: `historian_progress` holds those, per window). So the check is per
window of a dataset: the rows the flow's chunks of that window committed, against the
rows the dataset holds there now for the node's tags of the flow - counted in one
GROUP BY per dataset, by time buckets as wide as the windows' common divisor, summed per
window here (`sinks.verify.counts`: which chunks of a window count, and what is a loss).

Repairing forgets the damaged windows (their chunk records, and those windows cut out of
every member's progress) in one transaction; the rows left stay until the next run fetches
the windows again and replaces them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from connectors.schema import KIND_ALARM_HISTORY
from connectors.timewindow import Window
from sinks.base import Damage, Verified
from sinks.sql.load import epoch_ms_sql
from sinks.sql.state import _insert_windows, aware
from sinks.sql.tables import CHUNKS_TABLE, DATASETS_TABLE, PROGRESS_TABLE, Layout
from sinks.verify.counts import Expected, Record, bucket_ms, expected_rows, short_windows


class SqlVerifier:
    """Checks (and repairs) one progress key's chunks in a warehouse."""

    def __init__(self, layout: Layout, dialect: str) -> None:
        self.layout = layout
        self.dialect = dialect

    def verify(self, conn: Connection, flow: str, node: str, window: Window | None) -> Verified:
        records = [
            Record(str(c), str(d), Window(aware(s), aware(e)), int(m), int(r), aware(t))
            for c, d, s, e, m, r, t in self._records(conn, flow, window)
        ]
        members = conn.execute(
            sa.text(
                f"SELECT COUNT(DISTINCT member) FROM {self.layout.table(PROGRESS_TABLE)} "
                "WHERE flow = :f"
            ),
            {"f": flow},
        ).scalar()
        groups = expected_rows(records, int(members or 0))
        found = Verified(chunks=len(records))
        by_dataset: dict[str, list[Expected]] = defaultdict(list)
        for group in groups:
            by_dataset[group.dataset].append(group)
        for dataset, expected in by_dataset.items():
            found.damages += self._check(conn, flow, node, dataset, expected)
        return found

    def _records(self, conn: Connection, flow: str, window: Window | None) -> list[Any]:
        where = "flow = :f"
        params: dict[str, Any] = {"f": flow}
        if window is not None:
            where += " AND window_end > :s AND window_start < :e"
            params.update(s=window.start, e=window.end)
        return list(
            conn.execute(
                sa.text(
                    "SELECT chunk_id, dataset, window_start, window_end, members, "
                    f"rows_committed, committed_at FROM {self.layout.table(CHUNKS_TABLE)} "
                    f"WHERE {where}"
                ),
                params,
            )
        )

    def _check(
        self, conn: Connection, flow: str, node: str, dataset: str, expected: list[Expected]
    ) -> list[Damage]:
        """The dataset's windows holding fewer rows than their chunks committed."""
        where = f"table {self.layout.table(dataset)}"
        if not self.layout.columns(conn, dataset):
            return [
                Damage(where, g.window, f"missing (recorded with {g.rows:,} rows)", tuple(g.chunks))
                for g in expected
            ]
        origin, width = bucket_ms([g.window for g in expected])
        counts = self._counts(conn, flow, node, dataset, (origin, width), expected)
        return short_windows(expected, counts, (origin, width), where)

    def _counts(
        self,
        conn: Connection,
        flow: str,
        node: str,
        dataset: str,
        buckets: tuple[int, int],
        expected: list[Expected],
    ) -> dict[int, int]:
        """Rows per bucket of the node's rows of the flow's tags (alarms: all its paths)."""
        origin, width = buckets
        epoch = epoch_ms_sql("ts", self.dialect)
        if self.dialect == "mysql":
            bucket = f"FLOOR(({epoch} - :origin) / {int(width)})"
        else:
            since = f"CAST({epoch} - :origin AS DOUBLE PRECISION)"
            bucket = f"CAST(floor({since} / {int(width)}) AS BIGINT)"
        where = "node = :n AND ts >= :lo AND ts < :hi"
        if self._kind(conn, dataset) != KIND_ALARM_HISTORY:
            progress = self.layout.table(PROGRESS_TABLE)
            where += f" AND tag IN (SELECT member FROM {progress} WHERE flow = :f)"
        params = {
            "origin": origin,
            "n": node,
            "f": flow,
            "lo": min(g.window.start for g in expected),
            "hi": max(g.window.end for g in expected),
        }
        rows = conn.execute(
            sa.text(
                f"SELECT b, COUNT(*) FROM (SELECT {bucket} AS b FROM "
                f"{self.layout.table(dataset)} WHERE {where}) AS s GROUP BY b"
            ),
            params,
        )
        return {int(b): int(n) for b, n in rows}

    def _kind(self, conn: Connection, dataset: str) -> str | None:
        found = conn.execute(
            sa.text(f"SELECT kind FROM {self.layout.table(DATASETS_TABLE)} WHERE dataset = :d"),
            {"d": dataset},
        ).scalar()
        return None if found is None else str(found)

    def forget(self, conn: Connection, flow: str, damages: Sequence[Damage]) -> int:
        """Drop the damaged chunks' records and cut their windows out of every member's
        progress (in the caller's transaction); returns the chunks forgotten."""
        chunks = sorted({chunk for damage in damages for chunk in damage.chunks})
        for chunk in chunks:
            conn.execute(
                sa.text(
                    f"DELETE FROM {self.layout.table(CHUNKS_TABLE)} "
                    "WHERE flow = :f AND chunk_id = :c"
                ),
                {"f": flow, "c": chunk},
            )
        for damage in damages:
            self._cut(conn, flow, damage.window)
        return len(chunks)

    def _cut(self, conn: Connection, flow: str, window: Window) -> None:
        """Remove `window` from every member's completed windows of the flow."""
        progress = self.layout.table(PROGRESS_TABLE)
        params = {"f": flow, "s": window.start, "e": window.end}
        touching = "flow = :f AND window_start < :e AND window_end > :s"
        found = conn.execute(
            sa.text(f"SELECT member, window_start, window_end FROM {progress} WHERE {touching}"),
            params,
        ).fetchall()
        if not found:
            return
        conn.execute(sa.text(f"DELETE FROM {progress} WHERE {touching}"), params)
        kept: list[tuple[str, Window]] = []
        for member, start, end in found:
            begin, finish = aware(start), aware(end)
            if begin < window.start:
                kept.append((str(member), Window(begin, window.start)))
            if finish > window.end:
                kept.append((str(member), Window(window.end, finish)))
        if kept:
            _insert_windows(conn, self.layout, flow, kept)
