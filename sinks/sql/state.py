"""The run state the warehouse keeps beside the data: chunk records and progress windows.

`historian_chunks` holds one row per committed chunk (rows fetched and committed);
`historian_progress` holds each member's completed windows, merged. Both are written
inside the chunk's own transaction (sinks/sql/chunk.py), so the state never claims rows
the tables lack, nor lacks rows they hold. Every function here takes the caller's
connection: the caller decides the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from connectors.timewindow import Window
from sinks.base import ChunkRecord, ChunkScope, Progress, SharedWindows, SinkError, merge_windows
from sinks.sql.tables import CHUNKS_TABLE, PROGRESS_TABLE, Layout


def record_chunk(
    conn: Connection, layout: Layout, scope: ChunkScope, fetched: int, committed: int
) -> None:
    """Record the chunk (a re-run's record replaces the earlier one)."""
    columns = (
        "flow, chunk_id, dataset, window_start, window_end, members, rows_fetched, "
        "rows_committed, committed_at"
    )
    upsert = layout.sql.upsert(("flow", "chunk_id"), columns.split(", ")[2:])
    conn.execute(
        sa.text(
            f"INSERT INTO {layout.table(CHUNKS_TABLE)} ({columns}) "
            f"VALUES (:f, :c, :d, :s, :e, :m, :rf, :rc, :t) {upsert}"
        ),
        {
            "f": scope.flow,
            "c": scope.chunk_id,
            "d": scope.dataset,
            "s": scope.window.start,
            "e": scope.window.end,
            "m": len(scope.members),
            "rf": fetched,
            "rc": committed,
            "t": datetime.now(UTC),
        },
    )


def merge_progress(conn: Connection, layout: Layout, scope: ChunkScope) -> None:
    """Set-based merge: read the touching windows of all members, replace them merged.

    Chunks of one flow may be written by concurrent transactions (the warehouse's
    `write_concurrency`), and two of them can touch one stored window (a look-back
    re-reading inside it): each would replace it by its own merge and the second insert
    would collide. A transaction-scoped advisory lock per flow makes the merges take
    turns, each reading what the previous one committed (READ COMMITTED: a new snapshot
    per statement). It is taken after the bulk load, so only the short merge and the
    commit are serialised. The lock's key is the progress key, so shards of one key in
    other processes take turns too; MariaDB has no such lock inside a transaction, and
    reads the touching windows with a locking read instead.
    """
    if layout.dialect == "postgresql":
        conn.execute(
            sa.text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
            {"k": f"historian-progress:{layout.catalog_schema}:{scope.flow}"},
        )
    windows = _take_touching(conn, layout, scope)
    merged = [(m, w) for m, found in windows.items() for w in merge_windows(found)]
    _insert_windows(conn, layout, scope.flow, merged)


def _take_touching(conn: Connection, layout: Layout, scope: ChunkScope) -> dict[str, list[Window]]:
    """Per member, the chunk's window and the stored windows touching it, which are
    deleted (the merge inserts them again, joined)."""
    progress = layout.table(PROGRESS_TABLE)
    members = list(dict.fromkeys(scope.completed_members))
    window = scope.window
    touching = (
        f"flow = :f AND {layout.sql.in_list('member', 'm')} "
        "AND window_end >= :s AND window_start <= :e"
    )
    params = {"f": scope.flow, "m": members, "s": window.start, "e": window.end}
    windows: dict[str, list[Window]] = {member: [window] for member in members}
    for member, start, end in conn.execute(
        layout.sql.text(
            f"SELECT member, window_start, window_end FROM {progress} WHERE {touching}"
            # MariaDB: a locking read, so that merges of one key in other processes
            # (shards) take turns and each reads what the previous one committed.
            + (" FOR UPDATE" if layout.dialect == "mysql" else ""),
            "m",
        ),
        params,
    ):
        windows[member].append(Window(aware(start), aware(end)))
    conn.execute(layout.sql.text(f"DELETE FROM {progress} WHERE {touching}", "m"), params)
    return windows


def _insert_windows(
    conn: Connection, layout: Layout, flow: str, rows: Sequence[tuple[str, Window]]
) -> None:
    """Insert (member, window) rows of a flow's progress in one statement."""
    progress = layout.table(PROGRESS_TABLE)
    if layout.dialect == "mysql":  # no arrays to unnest: one executemany
        conn.execute(
            sa.text(
                f"INSERT INTO {progress} (flow, member, window_start, window_end) "
                "VALUES (:f, :m, :s, :e)"
            ),
            [{"f": flow, "m": m, "s": w.start, "e": w.end} for m, w in rows],
        )
        return
    if layout.dialect == "postgresql":  # one JSON text: psycopg dumps lists in Python
        conn.execute(
            sa.text(
                f"INSERT INTO {progress} (flow, member, window_start, window_end) "
                "SELECT :f, r.m, r.s, r.e FROM json_to_recordset(CAST(:rows AS json)) "
                "AS r (m TEXT, s TIMESTAMPTZ, e TIMESTAMPTZ)"
            ),
            {
                "f": flow,
                "rows": orjson.dumps(
                    [{"m": m, "s": w.start, "e": w.end} for m, w in rows]
                ).decode(),
            },
        )
        return
    conn.execute(
        sa.text(
            f"INSERT INTO {progress} (flow, member, window_start, window_end) "
            "SELECT :f, unnest(CAST(:m AS TEXT[])), unnest(CAST(:s AS TIMESTAMPTZ[])), "
            "unnest(CAST(:e AS TIMESTAMPTZ[]))"
        ),
        {
            "f": flow,
            "m": [m for m, _ in rows],
            "s": [w.start for _, w in rows],
            "e": [w.end for _, w in rows],
        },
    )


def read_progress(conn: Connection, layout: Layout, flow: str) -> Progress:
    """The flow's completed windows per member."""
    rows = conn.execute(
        sa.text(
            "SELECT member, window_start, window_end FROM "
            f"{layout.table(PROGRESS_TABLE)} WHERE flow = :f "
            "ORDER BY member, window_start"
        ),
        {"f": flow},
    ).fetchall()
    completed: dict[str, list[Window]] = {}
    for member, start, end in rows:
        completed.setdefault(member, []).append(Window(aware(start), aware(end)))
    shared = SharedWindows()
    return Progress(flow, {m: shared.merged(w) for m, w in completed.items()})


def read_chunk_log(conn: Connection, layout: Layout, flow: str, limit: int) -> list[ChunkRecord]:
    """The flow's latest `limit` chunk records, newest first."""
    rows = conn.execute(
        sa.text(
            "SELECT chunk_id, window_start, window_end, members, rows_fetched, "
            f"rows_committed, committed_at FROM {layout.table(CHUNKS_TABLE)} "
            "WHERE flow = :f ORDER BY committed_at DESC, chunk_id LIMIT :n"
        ),
        {"f": flow, "n": max(0, int(limit))},
    ).fetchall()
    return [
        ChunkRecord(flow, str(cid), Window(aware(s), aware(e)), int(m), int(rf), int(rc), aware(t))
        for cid, s, e, m, rf, rc, t in rows
    ]


def read_flows(conn: Connection, layout: Layout) -> list[str]:
    """Every flow with progress or chunk records."""
    rows = conn.execute(
        sa.text(
            f"SELECT flow FROM {layout.table(PROGRESS_TABLE)} UNION "
            f"SELECT flow FROM {layout.table(CHUNKS_TABLE)} ORDER BY flow"
        )
    ).fetchall()
    return [str(row[0]) for row in rows]


def reset(conn: Connection, layout: Layout, flow: str, member: str | None) -> int:
    """Forget a flow's progress (one member's, or all of it with the chunk records);
    returns the rows removed."""
    condition = "flow = :f" + (" AND member = :m" if member is not None else "")
    tables = [(PROGRESS_TABLE, condition)]
    if member is None:
        tables.append((CHUNKS_TABLE, "flow = :f"))
    return sum(
        _delete(
            conn,
            layout,
            f"DELETE FROM {layout.table(table)} WHERE {where}",
            {"f": flow, "m": member},
        )
        for table, where in tables
    )


def forget_after(conn: Connection, layout: Layout, flow: str, moment: datetime) -> int:
    """Cut the flow's progress at `moment` and drop the chunk records of windows ending
    after it; returns the chunk records dropped."""
    progress = layout.table(PROGRESS_TABLE)
    params = {"f": flow, "t": moment.astimezone(UTC)}
    conn.execute(sa.text(f"DELETE FROM {progress} WHERE flow = :f AND window_start >= :t"), params)
    conn.execute(
        sa.text(
            f"UPDATE {progress} SET window_end = :t "
            "WHERE flow = :f AND window_start < :t AND window_end > :t"
        ),
        params,
    )
    return _delete(
        conn,
        layout,
        f"DELETE FROM {layout.table(CHUNKS_TABLE)} WHERE flow = :f AND window_end > :t",
        params,
    )


def _delete(conn: Connection, layout: Layout, sql: str, params: dict[str, Any]) -> int:
    """Run a DELETE; how many rows it removed (RETURNING where the dialect has it:
    DuckDB reports no rowcount; MySQL has no DELETE ... RETURNING)."""
    if not layout.sql.delete_returning:
        return int(conn.execute(sa.text(sql), params).rowcount)
    return len(conn.execute(sa.text(sql + " RETURNING 1"), params).fetchall())


def aware(moment: Any) -> datetime:
    """A driver's timestamp as an aware UTC datetime."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    if not isinstance(moment, datetime):
        raise SinkError(f"unexpected timestamp value {type(moment).__name__}")
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
