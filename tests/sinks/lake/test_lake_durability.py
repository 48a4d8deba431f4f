"""What the lake waits for the disk for, and how it reads what a power cut may leave torn:
markers, progress snapshots and new-files-only intents are written without a sync, so a
torn one reads as missing (the chunk is written again), never as an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sinks.lake.sink import ParquetLake
from tests.sinks.lake.lake_frames import history_frame, rows_of, scope, window

TAGS = ("/plant/a", "/plant/b", "/plant/c", "/plant/d")


def write(lake: ParquetLake, members: tuple[str, ...], hours: tuple[int, int], chunk: str) -> None:
    frame = history_frame(members, window(*hours))
    lake.write(scope(members, window(*hours), chunk), frame, len(frame))


class Syncs:
    """Counts fsync/fdatasync calls, by what was synced: a directory or a file."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dirs = 0
        self.files = 0
        for name in ("fsync", "fdatasync"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._counting(real))

    def _counting(self, real: object) -> object:
        def sync(fd: int) -> None:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                self.dirs += 1
            else:
                self.files += 1
            real(fd)  # type: ignore[operator]

        return sync


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_chunk_of_new_files_waits_for_its_data_and_directory_only(
    tmp_lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, TAGS[:2], (0, 2), "first")  # creates the dataset (dataset.json is synced)
    syncs = Syncs(monkeypatch)
    write(lake, TAGS[2:], (0, 2), "second")
    # The chunk's ledger file (sinks/lake/ledger.py) is as durable as its rows.
    assert (syncs.files, syncs.dirs) == (2, 2), "data and ledger files, then their directories"
    # A rewrite of an earlier file: the intent must reach the disk before the change.
    syncs.files = syncs.dirs = 0
    write(lake, TAGS[1:3], (1, 2), "overlap")
    assert syncs.files >= 3  # two rewritten files, the new one... and the intent
    assert syncs.dirs >= 2  # the intent's directory, the data directory


def test_a_torn_marker_reads_as_an_uncommitted_chunk(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, TAGS[:2], (0, 2), "a")
    write(lake, TAGS[2:], (0, 2), "b")
    assert set(lake.progress("f").completed) == set(TAGS)
    marker = tmp_lake / "_historian/_flows/f/markers/b.json"
    marker.write_bytes(marker.read_bytes()[:40])
    fresh = ParquetLake(str(tmp_lake))
    assert set(fresh.progress("f").completed) == set(TAGS[:2])
    assert [record.chunk_id for record in fresh.chunk_log("f")] == ["a"]
    write(fresh, TAGS[2:], (0, 2), "b")  # the pipeline writes the chunk again
    assert set(fresh.progress("f").completed) == set(TAGS)
    assert rows_of(fresh.read("hist", "tag_history")) == rows_of(history_frame(TAGS, window(0, 2)))


def test_a_torn_progress_snapshot_is_rebuilt_from_the_markers(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, TAGS, (0, 2), "a")
    progress = lake.progress("f")
    (tmp_lake / "_historian/_flows/f/progress.json").write_bytes(b'{"version": 1, "mark')
    assert ParquetLake(str(tmp_lake)).progress("f") == progress


def test_a_torn_intent_is_dropped_on_open(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, TAGS, (0, 2), "a")
    pending = tmp_lake / "_historian/hist/pending"
    pending.mkdir(parents=True, exist_ok=True)
    (pending / "b.json").write_bytes(b'{"id": "b", "dataset": "hi')
    fresh = ParquetLake(str(tmp_lake))
    fresh.open()
    assert not list(pending.iterdir())
    assert rows_of(fresh.read("hist", "tag_history")) == rows_of(history_frame(TAGS, window(0, 2)))
