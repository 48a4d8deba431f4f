"""Delta and Iceberg read progress back from their commit logs (`sinks.tables.progress`):
once, over both table sinks. The cache beside a log is only a cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sinks.tables.delta import DeltaLake
from sinks.tables.iceberg import IcebergLake
from sinks.tables.table_sink import TableSink
from tests.sinks.lake.lake_frames import history_frame, scope, window

TAGS = ("/plant/a", "/plant/b", "/plant/c d")
TABLE_SINKS: dict[str, Callable[[str], TableSink]] = {"delta": DeltaLake, "iceberg": IcebergLake}


@pytest.fixture(params=sorted(TABLE_SINKS))
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], TableSink]]:
    """New sink objects over one place of the sink type under test (closed after)."""
    made: list[TableSink] = []

    def new() -> TableSink:
        sink = TABLE_SINKS[request.param](str(tmp_path / "tables"))
        made.append(sink)
        return sink

    yield new
    for sink in made:
        sink.close()


def test_progress_is_rebuilt_from_the_log_when_its_cache_is_lost(
    make: Callable[[], TableSink], tmp_path: Path
) -> None:
    sink = make()
    sink.open()
    for n, start in enumerate(range(0, 12, 3)):
        frame = history_frame(TAGS, window(start, start + 3))
        sink.write(scope(TAGS, window(start, start + 3), f"c{n}"), frame, len(frame))
    log = sink.chunk_log("f")
    assert [r.chunk_id for r in log] == ["c3", "c2", "c1", "c0"]
    assert (log[0].members, log[0].rows_fetched, log[0].rows_committed) == (3, 54, 54)
    assert log[0].committed_at.tzinfo is not None
    caches = list((tmp_path / "tables" / "_historian" / "progress").iterdir())
    assert caches, "the first read left a cache"
    for cache in caches:
        cache.unlink()
    again = make()
    assert again.progress("f").windows_of(TAGS[2]) == [window(0, 12)]
    assert again.forget_after("f", window(0, 7).end) == 2
    assert sink.progress("f").windows_of(TAGS[0]) == [window(0, 6)], "one set of rules"
