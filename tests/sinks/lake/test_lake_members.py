"""A lake marker names its chunk's members by the digest of a list file written once: an
hourly run of the same tags adds a marker of a few hundred bytes, not the whole list."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from sinks.lake.sink import ParquetLake
from tests.sinks.lake.lake_frames import history_frame, rows_of, scope, window

TAGS = tuple(f"/plant/line {i}/temp, °C" for i in range(400))
FLOW = Path("_historian/_flows/f")


def write(lake: ParquetLake, members: tuple[str, ...], hours: tuple[int, int], chunk: str) -> None:
    frame = history_frame(members, window(*hours))
    lake.write(scope(members, window(*hours), chunk), frame, len(frame))


def test_hourly_markers_of_the_same_tags_share_one_member_list(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    for hour in range(6):
        write(lake, TAGS, (hour, hour + 1), f"h{hour}")
    lists = sorted((tmp_lake / FLOW / "members").iterdir())
    assert len(lists) == 1
    assert json.loads(lists[0].read_text(encoding="utf-8")) == list(TAGS)
    markers = sorted((tmp_lake / FLOW / "markers").glob("*.json"))
    assert len(markers) == 6
    for marker in markers:
        assert json.loads(marker.read_text(encoding="utf-8"))["members"] == lists[0].stem
        assert marker.stat().st_size < 1000, "the list is not repeated in every marker"
    fresh = ParquetLake(str(tmp_lake))  # another process reads the lists back
    completed = fresh.progress("f").completed
    assert set(completed) == set(TAGS)
    assert completed[TAGS[0]] == [window(0, 6)]
    assert [record.members for record in fresh.chunk_log("f", limit=1)] == [len(TAGS)]


def test_a_marker_whose_list_is_lost_reads_as_uncommitted_and_is_written_again(
    tmp_lake: Path,
) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, TAGS[:2], (0, 1), "a")
    write(lake, TAGS[2:4], (0, 1), "b")
    listed = {p.name: orjson.loads(p.read_bytes()) for p in (tmp_lake / FLOW / "members").iterdir()}
    torn = next(name for name, tags in listed.items() if tags == list(TAGS[2:4]))
    (tmp_lake / FLOW / "members" / torn).write_bytes(b'["/plant/li')  # a power cut
    fresh = ParquetLake(str(tmp_lake))
    assert set(fresh.progress("f").completed) == set(TAGS[:2])
    write(fresh, TAGS[2:4], (0, 1), "b")  # the pipeline writes the chunk again
    assert orjson.loads((tmp_lake / FLOW / "members" / torn).read_bytes()) == list(TAGS[2:4])
    assert set(ParquetLake(str(tmp_lake)).progress("f").completed) == set(TAGS[:4])
    expected = history_frame(TAGS[:4], window(0, 1))
    assert rows_of(fresh.read("hist", "tag_history")) == rows_of(expected)


def test_markers_with_the_list_inline_are_still_read(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, TAGS[:3], (0, 2), "old")
    path = tmp_lake / FLOW / "markers" / "old.json"
    marker = orjson.loads(path.read_bytes())
    marker["members"] = list(TAGS[:3])  # as lakes before member lists wrote it
    path.write_bytes(orjson.dumps(marker))
    (tmp_lake / FLOW / "progress.json").unlink(missing_ok=True)
    fresh = ParquetLake(str(tmp_lake))
    assert set(fresh.progress("f").completed) == set(TAGS[:3])


def test_a_member_digest_that_is_not_one_is_never_a_path(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, TAGS[:2], (0, 1), "a")
    (tmp_lake / "secret.json").write_text(json.dumps(["/plant/x"]), encoding="utf-8")
    path = tmp_lake / FLOW / "markers" / "a.json"
    marker = orjson.loads(path.read_bytes())
    marker["members"] = "../../../secret"
    path.write_bytes(orjson.dumps(marker))
    (tmp_lake / FLOW / "progress.json").unlink(missing_ok=True)
    assert ParquetLake(str(tmp_lake)).progress("f").completed == {}
