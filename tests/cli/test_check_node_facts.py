"""`historian check` shows what the node tells us (issue 27, "What the node tells us,
shown") and keeps checking flows past a probe the extraction does not need (item 11)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from typer.testing import CliRunner

from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.cli.app import app
from tests.fixtures import write_config

START = "2026-01-01T00:00:00Z"


@contextmanager
def served(profile: str) -> Iterator[tuple[SimulatedNode, str]]:
    """A node on the wall clock (check asks for no history)."""
    node = SimulatedNode(SimConfig(seed=5, tags=12, profile=profile))
    with run_server(node, http_port=0, https_port=None) as server:
        yield node, server.http_url


def flow(paths: list[str]) -> dict[str, object]:
    return {"node": "n", "tags": {"paths": paths}, "mode": "raw", "start": START}


def check(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["check", "--config", str(path)])
    return result.exit_code, result.output


def test_check_on_a_node_without_views_warns_and_still_finds_a_misspelled_tag(
    tmp_path: Path,
) -> None:
    with served("no-views") as (node, url):
        good = node.tag_paths()[:2]
        typo = good[0][:-1] + "X"
        flows = {"good": flow(good), "typo": flow([good[1], typo])}
        path = write_config(tmp_path, node={"url": url}, flows=flows, sinks=["lake"])
        code, output = check(path)
    assert code == 1, output
    assert "warn node n: tag.getViews: HTTP 404" in output
    assert "ok flow good: 2 tags" in output
    assert "fail flow typo" in output
    assert repr(typo) in output
    assert "1 check failed: flow typo" in output
    assert "Traceback" not in output


def test_check_shows_what_the_node_tells_us_and_a_clock_behind_ours(tmp_path: Path) -> None:
    with served("clock-behind+other-node") as (node, url):
        flows = {"f": flow(node.tag_paths()[:2])}
        path = write_config(tmp_path, node={"url": url}, flows=flows, sinks=["lake"])
        code, output = check(path)
    assert code == 0, output
    assert f"identity: 'sim-node-b' (uid {node.admin.uid})" in output
    assert "clock: 10 min behind ours (node says" in output
    assert "timestamp unit: epoch milliseconds" in output
    assert "bucket stamping: bucket start" in output
    assert "browse recurrent: honoured" in output
    assert "details keyed by: tag name" in output


def test_check_shows_the_readings_of_a_node_that_reads_the_spec_otherwise(
    tmp_path: Path,
) -> None:
    """Stamps as text, buckets at their end, browse recursing always, details by path:
    each probed on a flow's tag and shown as the node reads it."""
    profile = "rows-iso+buckets-at-end+browse-always-recurses+details-by-path"
    with served(profile) as (node, url):
        flows = {"f": flow(node.tag_paths()[:2])}
        path = write_config(tmp_path, node={"url": url}, flows=flows, sinks=["lake"])
        code, output = check(path)
    assert code == 0, output
    assert "timestamp unit: ISO 8601 text" in output
    assert "bucket stamping: bucket end (stored as its start)" in output
    assert "browse recurrent: ignored (always recurses)" in output
    assert "details keyed by: full path" in output


def test_check_says_a_node_clock_in_step(tmp_path: Path) -> None:
    with served("default") as (node, url):
        flows = {"f": flow(node.tag_paths()[:2])}
        path = write_config(tmp_path, node={"url": url}, flows=flows, sinks=["lake"])
        code, output = check(path)
    assert code == 0, output
    assert "clock: in step with ours" in output
    assert "identity: 'sim-node' (uid SIM-0005-" in output
