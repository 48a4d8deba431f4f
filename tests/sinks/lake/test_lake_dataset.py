"""A lake dataset's stored facts on their own: recorded once, agreed with by every chunk."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import orjson
import pytest

from sinks.base import SinkError
from sinks.lake.dataset import DatasetFacts
from sinks.lake.files import DATASET_KEY, OWNERS_KEY
from sinks.lake.sink import ParquetLake
from sinks.store.objects import LakeStore
from tests.sinks.lake.lake_frames import ATTRS, history_frame, scope, window


def facts_at(root: Path, partition: str = "auto") -> DatasetFacts:
    return DatasetFacts(LakeStore(str(root)), lake="lake", partition=partition)


@pytest.mark.parametrize(
    ("hours", "size", "scheme"),
    [(1, None, "date"), (1, timedelta(days=7), "month"), (24 * 30, None, "year")],
)
def test_the_first_chunk_records_the_facts_and_auto_picks_the_scheme(
    tmp_path: Path, hours: int, size: timedelta | None, scheme: str
) -> None:
    first = scope(["/a"], window(0, hours), "k1")
    if size is not None:
        first = dataclasses.replace(first, window_size=size)
    facts = facts_at(tmp_path).check(first)
    assert facts["partition"] == scheme
    stored = orjson.loads((tmp_path / "_historian/hist/dataset.json").read_bytes())
    identity = {key: value for key, value in sorted(ATTRS.items()) if key != "node"}
    assert stored == {"dataset": "hist", "kind": "tag_history", "partition": scheme,
                      "node_level": True, "attrs": identity}  # fmt: skip
    assert facts_at(tmp_path).scheme("hist") == scheme, "read back by another process"


def test_a_chunk_with_other_settings_is_refused_naming_each_difference(tmp_path: Path) -> None:
    facts_at(tmp_path).check(scope(["/a"], window(0, 1), "k1"))
    other = scope(["/a"], window(1, 2), "k2", attrs={**ATTRS, "mode": "aggregated"})
    with pytest.raises(SinkError, match=r"mode: stored 'raw', now 'aggregated'\); use another"):
        facts_at(tmp_path).check(other)
    with pytest.raises(SinkError, match="partitioned by date, not year; use another dataset name"):
        facts_at(tmp_path, partition="year").check(scope(["/a"], window(1, 2), "k2"))
    facts_at(tmp_path, partition="date").check(scope(["/a"], window(1, 2), "k2"))


def test_a_stored_scheme_that_is_not_a_scheme_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "_historian/hist").mkdir(parents=True)
    (tmp_path / "_historian/hist/dataset.json").write_bytes(b'{"partition": "week"}')
    with pytest.raises(SinkError, match="records partition 'week', not one of date, month"):
        facts_at(tmp_path).scheme("hist")


def test_file_metadata_names_the_dataset_attrs_and_sorted_owners(tmp_path: Path) -> None:
    facts = facts_at(tmp_path)
    facts.check(scope(["/a"], window(0, 1), "k1"))
    metadata = facts.file_metadata("hist", "tag_history", [("f", "k2"), ("f", "k1"), ("f", "k2")])
    assert orjson.loads(metadata[OWNERS_KEY]) == [["f", "k1"], ["f", "k2"]]
    about = orjson.loads(metadata[DATASET_KEY])
    assert (about["dataset"], about["attrs"]["mode"]) == ("hist", "raw")


def test_a_dataset_of_an_earlier_version_keeps_its_layout_and_takes_other_nodes(
    tmp_path: Path,
) -> None:
    """Written before the node level: its node in the attrs, partitions under the dataset."""
    (tmp_path / "_historian/hist").mkdir(parents=True)
    earlier = {"dataset": "hist", "kind": "tag_history", "partition": "date", "attrs": ATTRS}
    (tmp_path / "_historian/hist/dataset.json").write_bytes(orjson.dumps(earlier))
    lake = ParquetLake(str(tmp_path))
    frames = []
    for node in ("n1", "n2"):
        frame = history_frame(["/a"], window(0, 1), node=node)
        lake.write(
            scope(["/a"], window(0, 1), "k1", flow=f"f@{node}", node=node), frame, len(frame)
        )
        frames.append(frame)
    assert sorted(p.name for p in (tmp_path / "hist").iterdir()) == ["date=2024-03-01"]
    back = lake.read("hist", "tag_history")
    assert sorted(back["node"].astype(str)) == ["n1"] * len(frames[0]) + ["n2"] * len(frames[1])
