"""A tail started over a dataset history already proved: it never replaces rows of a
window the unit's progress holds complete (history's rows stay, row for row), and a
remote tag behind a steady lag is the tail's to write, not a gap every poll."""

from __future__ import annotations

from pathlib import Path

from connectors.timewindow import Window
from tests.fixtures import canonical
from tests.pipelines.live.live_node import read, tailed
from tests.pipelines.live.test_unit import history_into, rows_in, sink_names


def test_a_tail_over_a_backfilled_span_leaves_history_rows_as_they_are(
    tmp_path: Path, pg_url: str, pg_schema: str
) -> None:
    live = {"commit_every": "10s", "late_within": "2s", "poll_limit": 500}
    with tailed(tmp_path / "t", pg=(pg_url, pg_schema), live=live) as t:
        t.advance(15_000 - t.now_ms() % 10_000)  # now 5 s into a window of the tail's grid
        start = t.now_ms()
        span = Window.from_ms(start - 60_000, start)
        history_into(t, span, t.path.parent)  # complete up to the node's now - settle
        proved = Window.from_ms(start - 60_000, start - 2_000)
        before = {
            name: rows_in(read(t.config, t.path.parent, name), proved) for name in sink_names(t)
        }
        assert all(len(rows) for rows in before.values())
        with t.unit() as unit:
            t.advance(20_000)
            unit.poll()
            commit = unit.commit()
            assert commit.rows > 0
            assert min(w.start for w in commit.windows) >= proved.end - unit.live.commit_every
        for name, rows in before.items():
            after = rows_in(read(t.config, t.path.parent, name), proved)
            assert canonical(after) == canonical(rows), name
            tail_part = rows_in(
                read(t.config, t.path.parent, name), Window.from_ms(start + 1, start + 20_001)
            )
            assert len(tail_part) == t.samples(start + 1, start + 20_001), name
