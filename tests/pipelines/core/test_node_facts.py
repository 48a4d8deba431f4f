"""Issue 27's items 9 and 10: what the node says about itself bounds and keys its progress.

Each test runs the whole pipeline against the real simulator over loopback, with the
profile that reproduces the situation (`clock-behind`, `other-node`), into a Parquet lake
and DuckDB, and compares the sinks with the simulator's ground truth row for row. Each
failed before the node's clock and identity were read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from typer.testing import CliRunner

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.cli.app import app
from pipelines.config.destinations import SinkSet
from pipelines.state import identity_member, recorded_identity, tag_members
from tests.fixtures import history_rows, load, truth_history_rows, write_config
from tests.pipelines.core.test_situations import NOW, assert_sinks_hold, flow_of, ms, run, served

RAW = HistoryOptions(mode="raw")


# -- 9. the node's clock behind ours ---------------------------------------------------------


def test_a_node_clock_behind_ours_bounds_what_is_marked_complete(tmp_path: Path) -> None:
    with served("clock-behind") as (node, url):
        tags = node.tag_paths()[:6]
        start = NOW - timedelta(hours=2)
        # settle covers the 2 minutes the simulator's remote tags arrive late.
        flow = flow_of({"paths": tags}, window="15m", settle="3m", start=start.isoformat())
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow})
        first = run(path, "f")
        # The node has stored up to its own now, 10 minutes before ours, minus settle.
        assert first.span == Window(start, NOW - timedelta(minutes=13))
        assert any("10 min behind ours" in line for line in first.remarks), first.remarks
        later = NOW + timedelta(hours=1)
        node.set_clock(ms(later))
        run(path, "f", now=later)
    span = Window(start, later - timedelta(minutes=13))
    assert_sinks_hold(path, "f", truth_history_rows(node, tags, [span], RAW))


def test_a_node_clock_ahead_of_ours_marks_nothing_past_our_now(tmp_path: Path) -> None:
    """The node stamps samples past our now: they wait for a run whose now passed them."""
    with served("default") as (node, url):
        node.set_clock(ms(NOW + timedelta(minutes=10)))  # the node's clock, 10 min ahead
        tags = node.tag_paths()[:4]
        start = NOW - timedelta(hours=1)
        flow = flow_of({"paths": tags}, window="15m", settle="3m", start=start.isoformat())
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow})
        first = run(path, "f")
        assert first.span == Window(start, NOW - timedelta(minutes=3))
        assert any("10 min ahead of ours" in line for line in first.remarks), first.remarks
        later = NOW + timedelta(minutes=30)
        node.set_clock(ms(later))
        run(path, "f", now=later)
    span = Window(start, later - timedelta(minutes=3))
    assert_sinks_hold(path, "f", truth_history_rows(node, tags, [span], RAW))


# -- 10. a flow moved to another node --------------------------------------------------------


@contextmanager
def two_nodes() -> Iterator[tuple[SimulatedNode, str, SimulatedNode, str]]:
    """Two nodes on the wall clock with the same tag paths: plant_a, and plant_b, which
    says it is another node (`other-node`) and holds other values (another seed)."""
    first = SimulatedNode(SimConfig(seed=21, tags=12))
    second = SimulatedNode(SimConfig(seed=22, tags=12, profile="other-node"))
    assert first.tag_paths() == second.tag_paths()
    with (
        run_server(first, http_port=0, https_port=None) as a,
        run_server(second, http_port=0, https_port=None) as b,
    ):
        yield first, a.http_url, second, b.http_url


def moved_config(tmp_path: Path, flow: dict[str, object], url_a: str, url_b: str) -> Path:
    path = write_config(tmp_path, node={"url": url_a}, flows={"f": flow})
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["nodes"] = {"plant_a": {"url": url_a}, "plant_b": {"url": url_b}}
    document["flows"]["f"]["node"] = "plant_a"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def point_flow_at(path: Path, node: str) -> None:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["flows"]["f"]["node"] = node
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def test_a_flow_moved_to_another_node_is_refused_in_one_line_until_reset(
    tmp_path: Path,
) -> None:
    real = datetime.now(UTC).replace(second=0, microsecond=0)
    span = Window(real - timedelta(hours=2), real - timedelta(hours=1))
    cli = CliRunner()
    backfill = ["backfill", "f", "--direct", "--config"]
    times = ["--start", span.start.isoformat(), "--end", span.end.isoformat()]
    with two_nodes() as (_, url_a, node_b, url_b):
        tags = node_b.tag_paths()[:4]
        flow = flow_of({"paths": tags}, window="15m", start=span.start.isoformat())
        path = moved_config(tmp_path, flow, url_a, url_b)
        done = cli.invoke(app, [*backfill, str(path), *times])
        assert done.exit_code == 0, done.output
        point_flow_at(path, "plant_b")
        refused = cli.invoke(app, [*backfill, str(path), *times])
        assert refused.exit_code != 0
        error = [line for line in refused.output.splitlines() if line.startswith("error")]
        assert len(error) == 1, refused.output
        assert "'sim-node-b'" in refused.output
        assert "historian state reset f" in refused.output
        assert "Traceback" not in refused.output
        reset = cli.invoke(app, ["state", "reset", "f", "--yes", "--config", str(path)])
        assert reset.exit_code == 0, reset.output
        again = cli.invoke(app, [*backfill, str(path), *times])
        assert again.exit_code == 0, again.output
    want = sorted(truth_history_rows(node_b, tags, [span], RAW))
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.sinks:
            frame = sinks.get(name).read("f", "tag_history")
            # plant_a's rows stay beside them: a dataset holds rows of many nodes.
            assert set(frame["node"]) == {"plant_a", "plant_b"}, name
            assert history_rows(frame[frame["node"] == "plant_b"]) == want, name
            assert tag_members(sinks.get(name).progress("f")) == sorted(tags)


def test_progress_written_before_identities_is_kept_and_then_records_the_node(
    tmp_path: Path,
) -> None:
    """A lake whose progress names no node (written before identities were recorded) is
    neither refused nor extracted again: the next write records the node it came from."""
    with served("default") as (node, url):
        tags = node.tag_paths()[:4]
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow_of({"paths": tags})})
        earlier = NOW - timedelta(minutes=30)
        run(path, "f", now=earlier)
        config = load(path)
        with SinkSet(config, path.parent) as sinks:
            for name in config.sinks:
                sink = sinks.get(name)
                key = recorded_identity(sink.progress("f"))
                assert key is not None, name
                assert '"sim-node"' in key, name
                sink.reset("f", identity_member(key))  # as an older version left it
                assert recorded_identity(sink.progress("f")) is None
        second = run(path, "f")
        assert second.span == Window(earlier, NOW)  # from the watermark: nothing again
        with SinkSet(config, path.parent) as sinks:
            for name in config.sinks:
                assert recorded_identity(sinks.get(name).progress("f")) == key, name
    span = Window(NOW - timedelta(hours=2), NOW)
    assert_sinks_hold(path, "f", truth_history_rows(node, tags, [span], RAW))


def test_the_same_node_at_another_url_keeps_its_progress(tmp_path: Path) -> None:
    """A new address (another port here) for a node that still says who it is: no
    refusal, nothing extracted again."""
    node = SimulatedNode(SimConfig(seed=21, tags=12))
    node.set_clock(ms(NOW))
    tags = node.tag_paths()[:4]
    earlier = NOW - timedelta(minutes=30)
    with run_server(node, http_port=0, https_port=None) as first:
        path = write_config(
            tmp_path, node={"url": first.http_url}, flows={"f": flow_of({"paths": tags})}
        )
        run(path, "f", now=earlier)
    with run_server(node, http_port=0, https_port=None) as second:
        assert second.http_url != first.http_url
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        document["nodes"]["n"]["url"] = second.http_url
        path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        moved = run(path, "f")
    assert moved.span == Window(earlier, NOW)
    span = Window(NOW - timedelta(hours=2), NOW)
    assert_sinks_hold(path, "f", truth_history_rows(node, tags, [span], RAW))
