"""flows.yaml `live:` (pipelines/live): its defaults, and each wrong use one line."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pipelines.config.models import LiveConfig, TagHistoryFlow, parse_config
from tests.pipelines.config.test_config import BASE, error_of, with_change


def test_live_takes_its_defaults_and_durations() -> None:
    config = parse_config(with_change("flows.hourly.live", {"commit_every": "2s"}), env={})
    flow = config.flows["hourly"]
    assert isinstance(flow, TagHistoryFlow)
    assert flow.live == LiveConfig(commit_every=timedelta(seconds=2))
    assert flow.live.poll_limit == 10_000
    assert flow.live.late_within == timedelta(seconds=30)
    untailed = parse_config(BASE, env={}).flows["hourly"]
    assert isinstance(untailed, TagHistoryFlow)
    assert untailed.live is None


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        ({"comit_every": "5s"}, "flows.hourly.live.comit_every: unknown key"),
        ({"commit_every": "10ms"}, "flows.hourly.live.commit_every: must be at least 100ms"),
        ({"poll_limit": 0}, "flows.hourly.live.poll_limit"),
        ({"late_within": "5m"}, "live.late_within must not be longer than settle"),
    ],
)
def test_a_wrong_live_key_is_one_line_naming_it(live: dict[str, object], expected: str) -> None:
    assert expected in error_of(with_change("flows.hourly.live", live))


def test_only_a_raw_tag_flow_may_be_live() -> None:
    data = with_change("flows.hourly.mode", "delta")
    data["flows"]["hourly"]["live"] = {}
    assert error_of(data).endswith("live is only for mode raw (events are raw samples)")
    alarms = with_change("flows.hourly", {**BASE["flows"]["hourly"], "kind": "alarm_history"})
    del alarms["flows"]["hourly"]["tags"], alarms["flows"]["hourly"]["mode"]
    alarms["flows"]["hourly"]["live"] = {}
    assert error_of(alarms).endswith("live: only tag_history flows can be tailed")
