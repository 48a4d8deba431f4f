"""The node's version from n3.versions, and what the client sends a node of that version."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest

from connectors.options import AlarmFilter
from connectors.version import (
    NodeVersion,
    UnsupportedByNode,
    adapt_alarm_filter,
    check_method,
    node_version,
)


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        (["1.21.13"], (1, 21, 13)),
        (["v1.21.5"], (1, 21, 5)),
        (
            ["Node.js v18.19.1", "N3uron exe v1.21.5 (build 2406)", "bootstrap 1.21.5-r2"],
            (1, 21, 5),
        ),
        (["node v20.11.0", "1.21.12"], (1, 21, 12)),
        (["exe: 1.22.0", "bootstrap: 1.21.9"], (1, 21, 9)),
        (["N3uron 1.21"], (1, 21, 0)),
        (["openssl 3.0.13", "v8 11.3.244.8", "1.21.10-beta"], (1, 21, 10)),
        (["Node.js v18.19.1"], None),
        ([], None),
        ([12, None, "no version here"], None),
    ],
)
def test_the_nodes_own_version_is_found_among_others(
    versions: list[Any], expected: tuple[int, int, int] | None
) -> None:
    found = node_version(versions)
    assert ((found.major, found.minor, found.patch) if found else None) == expected


OLD = NodeVersion(1, 21, 5)
NEW = NodeVersion(1, 21, 13)


@pytest.mark.parametrize(
    ("filt", "version", "sent", "here"),
    [
        (
            AlarmFilter(min_priority=2, max_priority=3),
            NEW,
            AlarmFilter(min_priority=2, max_priority=3),
            None,
        ),
        (AlarmFilter(min_priority=2, max_priority=3), OLD, AlarmFilter(priority=2), 3),
        (
            AlarmFilter(priority=3, min_priority=2),
            NodeVersion(1, 21, 12),
            AlarmFilter(priority=3),
            None,
        ),
        (AlarmFilter(max_priority=1, status=3), None, AlarmFilter(status=3), 1),
        (AlarmFilter(), OLD, AlarmFilter(), None),
    ],
)
def test_an_alarm_filter_is_sent_as_the_version_understands_it(
    filt: AlarmFilter, version: NodeVersion | None, sent: AlarmFilter, here: int | None
) -> None:
    adapted = adapt_alarm_filter(filt, version)
    assert adapted.sent == sent
    assert adapted.max_priority_here == here


@pytest.mark.parametrize(
    ("method", "version", "expectation"),
    [
        ("stddev", NodeVersion(1, 21, 9), pytest.raises(UnsupportedByNode)),
        ("delta", NodeVersion(1, 21, 5), pytest.raises(UnsupportedByNode)),
        ("stddev", NodeVersion(1, 21, 10), nullcontext()),
        ("avg", NodeVersion(1, 20, 0), nullcontext()),
        (None, NodeVersion(1, 20, 0), nullcontext()),
        ("delta", None, nullcontext()),
    ],
)
def test_a_method_the_node_cannot_compute_is_refused(
    method: str | None, version: NodeVersion | None, expectation: AbstractContextManager[Any]
) -> None:
    with expectation as refused:
        check_method(method, version, where="flows.f.method")
    if refused is not None:
        message = str(refused.value)
        assert "flows.f.method" in message
        assert "1.21.10" in message
        assert "\n" not in message
