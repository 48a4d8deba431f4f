"""Simulator behaviours of issue 27 on the wire: each shows, and only where switched on."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode
from connectors.simulator.tagtree import without_history

NOW_MS = int(datetime(2026, 11, 20, 12, 0, tzinfo=UTC).timestamp() * 1000)
HOUR_MS = 3_600_000


def node_of(profile: str, **config: Any) -> SimulatedNode:
    node = SimulatedNode(SimConfig(seed=5, tags=config.pop("tags", 24), profile=profile, **config))
    node.set_clock(NOW_MS)
    return node


def get(node: SimulatedNode, cmd: str, **params: Any) -> Any:
    answer = node.handle("GET", "tag", cmd, {k: str(v) for k, v in params.items()}, None)
    assert answer.status == 200, answer.body
    return orjson.loads(answer.body)


def raw_many(node: SimulatedNode, paths: list[str], **options: Any) -> dict[str, Any]:
    params = {"paths": orjson.dumps(paths).decode(), "start": NOW_MS - HOUR_MS, "end": NOW_MS}
    params.update({f"options.{k}": v for k, v in options.items()})
    return dict(get(node, "historyMany", **{"options.mode": "raw", **params}))


def test_a_per_answer_cap_counts_the_whole_answer_tags_in_order() -> None:
    node = node_of("raw-cap-per-answer", raw_cap=500)
    paths = node.tag_paths()[:8]
    for options, cap in (({}, 500), ({"limit": 120}, 120)):
        answer = raw_many(node, paths, **options)
        counts = [len(answer[path]["data"]) for path in paths]
        assert sum(counts) == cap, options
        cut = next(i for i, n in enumerate(counts) if sum(counts[: i + 1]) == cap)
        assert all(n == 0 for n in counts[cut + 1 :]), "the tags after the cut hold no rows"
    plain = raw_many(node_of("default", raw_cap=500), paths)
    assert sum(len(entry["data"]) for entry in plain.values()) > 500


def test_a_node_that_always_recurses_ignores_recurrent_false() -> None:
    group = "/Plant A/Utilities/"
    for profile, deeper in (("default", False), ("browse-always-recurses", True)):
        node = node_of(profile)
        flat = get(node, "browse", path=group, **{"options.flat": "true"})
        filtered = get(
            node,
            "historyFilter",
            paths=orjson.dumps([group]).decode(),
            start=NOW_MS - HOUR_MS,
            end=NOW_MS,
            **{"options.recurrent": "false"},
        )
        under = [p for p in node.tag_paths() if p.startswith(group)]
        assert under, "tags only in a subgroup"
        assert bool(set(under) & {p for p in flat if not p.endswith("/")}) is deeper, profile
        assert bool(filtered) is deeper, profile


def test_a_tag_without_history_answers_data_null_and_has_no_truth() -> None:
    node = node_of("null-without-history")
    paths = node.tag_paths()[:10]
    empty = [p for p in paths if without_history(node.tree().by_path[p])]
    assert empty
    answer = raw_many(node, paths)
    assert [p for p in paths if answer[p]["data"] is None] == empty
    single = get(node, "history", path=empty[0], start=NOW_MS - HOUR_MS, end=NOW_MS)
    assert single["data"] is None
    assert not node.ground_truth(empty[0], NOW_MS - HOUR_MS, NOW_MS, HistoryOptions(mode="raw"))
