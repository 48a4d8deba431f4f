"""Progress and lock keys as lake path components (`sinks.store.layout.key_name`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinks.base import SinkError
from sinks.lake.sink import ParquetLake
from sinks.store.layout import key_name, key_of_name, node_dir
from tests.sinks.lake.lake_frames import history_frame, scope, window

KEYS = ["f", "f-1_x", "f@n", "f@n#2-of-4", "f@plant a/line 1", "f@..", "f@ünï 漢", "f@a%2Eb"]


def test_plain_flow_names_stay_and_every_other_key_is_one_safe_component() -> None:
    assert key_name("raw_history") == "raw_history"  # the lake's flows of earlier versions
    names = [key_name(key) for key in KEYS]
    assert len(set(names)) == len(KEYS)
    for key, name in zip(KEYS, names, strict=True):
        assert "/" not in name
        assert "." not in name
        assert key_of_name(name) == key


def test_a_key_too_long_for_a_file_name_is_shortened_with_a_digest() -> None:
    long_keys = ["f@" + "ü" * 300, "f@" + "ü" * 299 + "x"]
    names = [key_name(key) for key in long_keys]
    assert names[0] != names[1]
    assert all(len(name) <= 200 for name in names)
    assert key_of_name(names[0]) is None  # read back from the markers instead


def test_an_empty_key_or_node_is_refused() -> None:
    with pytest.raises(SinkError, match="flow key ''"):
        key_name("")
    with pytest.raises(SinkError, match="node name ''"):
        node_dir("")
    with pytest.raises(SinkError, match="too long for a lake directory"):
        node_dir("n" * 300)


def test_the_lake_lists_shortened_keys_by_their_markers(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    key = "f@" + "ü" * 300
    frame = history_frame(["/a"], window(0, 1))
    lake.write(scope(["/a"], window(0, 1), "c1", flow=key), frame, len(frame))
    assert lake.flows() == [key]
    assert lake.progress(key).windows_of("/a") == [window(0, 1)]
    with lake.lock(key):
        pass
