"""Prefect settings for runs the command line drives (`pipelines/orchestration/env.py`)."""

from __future__ import annotations

import pytest

from pipelines.orchestration.env import cli_run


def test_a_command_line_run_sends_no_heartbeats_unless_the_user_set_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    # A long-lived server (nothing listens there: no request is made).
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert get_current_settings().flows.heartbeat_frequency is not None  # Prefect's default
        with cli_run():
            assert get_current_settings().flows.heartbeat_frequency is None
        assert get_current_settings().flows.heartbeat_frequency is not None

        monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "30")
        with cli_run():
            assert get_current_settings().flows.heartbeat_frequency is not None
