"""Series ids of the narrow tag-history layout: (node, tag) <-> `historian_series.series_id`.

The ids an open sink has seen are kept in memory, so a chunk asks the database only for
pairs new to it, in a short transaction of its own before the chunk's: the series table
is append-only (sinks/sql/tables.py), so a remembered id never goes stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sinks.base import SinkError
from sinks.sql.rows import Pair
from sinks.sql.tables import SERIES_TABLE, Layout


class SeriesIds:
    """The series ids this sink has learned, and how to learn more."""

    def __init__(self, layout: Layout, sink: str) -> None:
        self.layout = layout
        self.sink = sink
        self._ids: dict[Pair, int] = {}

    def unknown(self, pairs: Sequence[Pair]) -> list[Pair]:
        """The pairs whose ids are still to be learned."""
        return [p for p in pairs if p not in self._ids]

    def learn(self, conn: Connection, pairs: Sequence[Pair]) -> None:
        """Add the pairs to the series table where new, and remember their ids."""
        if not pairs:
            return
        if self.layout.dialect == "mysql":
            found = self._add_mysql(conn, pairs)
        else:
            found = self._add_postgres(conn, pairs)
        for series_id, node, tag in found:
            self._ids[(str(node), str(tag))] = int(series_id)

    def ids(self, pairs: Sequence[Pair]) -> npt.NDArray[np.int32]:
        """The ids of `pairs`, in order; a SinkError naming the first one not learned."""
        missing = self.unknown(pairs)
        if missing:
            raise SinkError(f"sink {self.sink}: tags not registered: {missing[0]!r}")
        return np.array([self._ids[p] for p in pairs], dtype=np.int32)

    def clear(self) -> None:
        self._ids.clear()

    def _add_postgres(self, conn: Connection, pairs: Sequence[Pair]) -> list[Sequence[Any]]:
        series = self.layout.table(SERIES_TABLE)
        given = (
            'SELECT n COLLATE "C" AS node, t COLLATE "C" AS tag '
            "FROM unnest(CAST(:n AS TEXT[]), CAST(:t AS TEXT[])) AS given (n, t)"
        )
        params = {"n": [p[0] for p in pairs], "t": [p[1] for p in pairs]}
        conn.execute(
            sa.text(
                f"INSERT INTO {series} (node, tag) {given} ORDER BY 1, 2 "
                "ON CONFLICT (node, tag) DO NOTHING"
            ),
            params,
        )
        return list(
            conn.execute(
                sa.text(
                    f"SELECT s.series_id, s.node, s.tag FROM {series} s "
                    f"JOIN ({given}) g ON g.node = s.node AND g.tag = s.tag"
                ),
                params,
            )
        )

    def _add_mysql(self, conn: Connection, pairs: Sequence[Pair]) -> list[Sequence[Any]]:
        """Without arrays: an executemany upsert, then the pairs' ids read back by tag (the
        series table is small; its key is a digest, sinks/sql/dialects.py)."""
        series = self.layout.table(SERIES_TABLE)
        ordered = sorted(set(pairs))
        conn.execute(
            sa.text(
                f"INSERT INTO {series} (node, tag) VALUES (:n, :t) "
                + self.layout.sql.upsert(("node", "tag"), ())
            ),
            [{"n": node, "t": tag} for node, tag in ordered],
        )
        found = conn.execute(
            self.layout.sql.text(f"SELECT series_id, node, tag FROM {series} WHERE tag IN :t", "t"),
            {"t": sorted({tag for _, tag in ordered})},
        )
        wanted = set(ordered)
        return [row for row in found if (str(row[1]), str(row[2])) in wanted]
